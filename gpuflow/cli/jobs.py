"""`gpuflow apply`, `ps`, `logs`, `stop`, `metrics`, `offers`: jobs and what they see."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape
from rich.text import Text

from gpuflow.cli import common
from gpuflow.cli.common import run
from gpuflow.errors import GpuflowError

# ---- jobs -----------------------------------------------------------------------------------


@run
async def apply(
    files: list[Path] = typer.Option(..., "--file", "-f", help="Job file(s)."),
    detach: bool = typer.Option(False, "--detach", "-d", help="Submit and return."),
    no_logs: bool = typer.Option(
        False, "--no-logs", help="Follow the jobs' status only, not their output."
    ),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
    profile: str | None = typer.Option(None, "--profile", help="Profile (defaults) to inherit."),
    gpu: str | None = typer.Option(None, "--gpu", help="Override resources.gpu, e.g. A100:2."),
    fleet: list[str] | None = typer.Option(None, "--fleet", help="Fleets to try, in order."),
    max_duration: str | None = typer.Option(
        None, "--max-duration", help="Stop the job after this long, e.g. 2h (off: never)."
    ),
    min_gpu_utilization: int | None = typer.Option(
        None, "--min-gpu-utilization", help="Utilization policy: the lowest GPU use, 0..100."
    ),
    time_window: str | None = typer.Option(
        None, "--time-window", help="Utilization policy: over how long, e.g. 30m."
    ),
    queue: str | None = typer.Option(None, "--queue", "-q", help="Queue to wait in."),
    priority: int | None = typer.Option(
        None, "--priority", help="0..100: higher starts first within its queue."
    ),
    as_json: bool = typer.Option(
        False,
        "--json",
        help="Print JSON, and only that, on stdout (the rest goes to stderr); needs -y, as "
        "nothing is asked. With -d: the submitted jobs, each with its plan. Else, once they "
        "end: their records, as ps --json prints them.",
    ),
) -> None:
    """Submit job files, show where they go, and follow them until they end, with their
    output (node 0).

    Exit status: 0 when every job ended done, 1 when one did not (failed, terminated,
    stopped), 130 on Ctrl-C (the jobs go on); with -d, 0 once they are submitted."""
    from gpuflow.cli.follow import follow_jobs
    from gpuflow.cli.job_json import job_json, submitted_json
    from gpuflow.cli.plan import plan_jobs, print_plans

    if as_json and not yes:  # the question would be asked on stdout, in the JSON's place
        raise GpuflowError("--json asks nothing: pass -y with it")
    # With --json, stdout holds the one JSON document: the plan and the follow go to stderr.
    out = common.err if as_json else common.console
    specs = common.load_jobs(
        files,
        profile=profile,
        fleet=fleet,
        gpu=gpu,
        max_duration=max_duration,
        min_gpu_utilization=min_gpu_utilization,
        time_window=time_window,
        queue=queue,
        priority=priority,
    )
    client = await common.open_client()
    try:
        with out.status(f"planning {len(specs)} job(s)…"), common.named_file(files):
            plans = await plan_jobs(client, specs)
        print_plans(out, plans)
        if not yes:
            if not sys.stdin.isatty():
                raise GpuflowError("no terminal to confirm on: pass -y to submit")
            if not typer.confirm(f"Submit {len(specs)} job(s)?", default=True):
                raise typer.Exit(1)
        jobs = []
        for spec in specs:
            job = await client.submit(spec)
            out.print(f"submitted [bold]{job.name}[/] as [dim]{job.id}[/]")
            jobs.append(job)
        if detach:
            if as_json:
                common.print_json([submitted_json(*each) for each in zip(jobs, plans, strict=True)])
            return
        try:
            ok = await follow_jobs(out, client, [job.id for job in jobs], output=not no_logs)
        except (asyncio.CancelledError, KeyboardInterrupt):  # Ctrl-C: the jobs go on
            names = " ".join(job.name for job in jobs)
            common.err.print(
                f"left; the job(s) go on: gpuflow ps, gpuflow logs -f NAME, gpuflow stop {names}",
                highlight=False,
            )
            raise
        ended = [await client.get(job.id) for job in jobs] if as_json else []
    finally:
        await client.close()
    if as_json:
        common.print_json([job_json(job, {}) for job in ended])
    if not ok:  # after every ending was printed: a script reads how the jobs ended
        raise typer.Exit(1)


@run
async def ps(
    all_jobs: bool = typer.Option(False, "--all", "-a", help="Include finished jobs."),
    limit: int = typer.Option(200, "--limit", min=0, help="The newest N jobs (0: every one)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    queue: str | None = typer.Option(None, "--queue", "-q", help="Only the jobs of this queue."),
) -> None:
    """List jobs: where they run, or why they wait and where they stand in line."""
    from gpuflow.cli.job_json import job_json
    from gpuflow.cli.render import jobs_table
    from gpuflow.cli.waiting import line_positions
    from gpuflow.status import JobStatus

    client = await common.open_client()
    try:
        with common.err.status("reading the jobs…"):
            most = limit + 1 if limit else None
            jobs = await client.jobs(include_finished=all_jobs, limit=most, queue=queue)
            pending = any(job.status == JobStatus.PENDING for job in jobs)
            held = pending and await client.admission_held()
    finally:
        await client.close()
    more = bool(limit) and len(jobs) > limit
    jobs = jobs[:limit] if limit else jobs
    if as_json:
        positions = line_positions(jobs)
        common.print_json([job_json(job, positions) for job in jobs])
    elif not jobs:
        where = f" in queue {queue}" if queue is not None else ""
        common.console.print(
            f"no jobs{where}" if all_jobs else f"no jobs running{where} (gpuflow ps -a shows all)"
        )
    else:
        common.console.print(jobs_table(jobs, width=common.console.width))
    for job in jobs if not as_json else []:  # on stderr, as the lines below
        for host, state in job.hosts_not_ready.items():
            common.err.print(
                f"warning: {escape(job.name)}: host {escape(host)} is {escape(state)}",
                highlight=False,
                soft_wrap=True,
            )
    if held:  # on stderr, as the line below
        common.err.print(
            "admission is held (gpuflow down, or Client.hold_admission): no waiting job starts "
            "until it is let go, and the reasons shown are the last pass's"
        )
    if more:  # on stderr, so that --json stays one document
        jobs_word = "job" if limit == 1 else "jobs"
        common.err.print(f"the newest {limit:,} {jobs_word}; more exist (--limit N, or 0 for all)")


@run
async def logs(
    job: str = typer.Argument(..., help="Job name or id."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing until it ends."),
    node: int = typer.Option(0, "--node", help="Node rank."),
    attempt: int | None = typer.Option(
        None, "--attempt", metavar="N", help="An earlier attempt's output (a job that retried)."
    ),
) -> None:
    """Print a job's output (its current attempt's, unless --attempt)."""
    client = await common.open_client()
    try:
        info = await client.get(job)
        if attempt is None or attempt == info.attempt:
            _say_not_started(info, follow=follow)
        reading = client.logs(info.id, rank=node, follow=follow, attempt=attempt)
        # aclosing: leaving early (a closed pipe) still deletes the log reader from Temporal.
        async with contextlib.aclosing(reading) as chunks:
            async for chunk in chunks:
                sys.stdout.write(chunk)
                sys.stdout.flush()
    finally:
        await client.close()


def _say_not_started(info: Any, *, follow: bool) -> bool:
    """On stderr (the output stays the job's own): a job that has no output yet because it has
    not started, why, and, with --follow, that the command waits for it. Whether it said so."""
    from gpuflow.cli.waiting import queue_place, why_waiting
    from gpuflow.status import JobStatus

    if info.status.is_final and info.started_at is None:
        ended = f"{info.status.value}" + (f" ({info.reason})" if info.reason else "")
        common.err.print(f"{info.name} ({info.id}) ended {ended} before it started: no output")
        return True
    if info.status not in (JobStatus.PENDING, JobStatus.PROVISIONING):
        return False
    why = queue_place(info) or why_waiting(info)
    then = "; waiting for it to start (Ctrl-C leaves)" if follow else ""
    which = f"'s attempt {info.attempt}" if info.attempt > 1 else ""
    common.err.print(
        f"{info.name} ({info.id}){which} has not started: {why}{then}", highlight=False
    )
    if info.attempt > 1:
        earlier = "1" if info.attempt == 2 else f"1..{info.attempt - 1}"
        common.err.print(f"(earlier attempts' output: gpuflow logs {info.id} --attempt {earlier})")
    return True


@run
async def stop(
    job: str = typer.Argument(..., help="Job name or id."),
    detach: bool = typer.Option(False, "--detach", "-d", help="Do not wait for it to end."),
) -> None:
    """Stop a job: its processes are stopped and its GPUs released."""
    from gpuflow.cli.render import ago, status_text
    from gpuflow.client import StopStep

    client = await common.open_client()
    try:
        # Client.stop decides whether the job already ended (its row, and its workflow: a job
        # that retries reads ended between attempts) and sends nothing then.
        with common.console.status(f"stopping {job}…"):
            info = await client.stop(job, wait=not detach)
    finally:
        await client.close()
    if info.ended_by == StopStep.ALREADY_ENDED:
        when = f" {ago(info.finished_at)}" if info.finished_at else ""
        why = f": {info.reason}" if info.reason and info.reason != "done" else ""
        common.console.print(
            f"job {info.name} already ended ({info.status.value}{when}{why})", highlight=False
        )
        return
    common.console.print(
        Text.assemble(f"{info.name} ({info.id}): ", status_text(info.status, info.reason))
    )
    if info.ended_by != StopStep.STOP_SIGNAL:
        # The workflow did not answer the stop signal: say how the job was made to end.
        common.console.print(f"  {info.ended_by.description}", style="dim")


@run
async def metrics(
    job: str = typer.Argument(..., help="Job name or id."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    watch: bool = typer.Option(False, "--watch", "-w", help="Refresh every 2 seconds."),
) -> None:
    """GPU utilization and memory of a job, per node and GPU."""
    from rich.live import Live

    from gpuflow.cli.render import metrics_table

    client = await common.open_client()
    try:
        state = await client.metrics(job)
        progress = await client.progress(job)
        if as_json:
            if watch:  # one document: there is nothing to refresh in place
                common.err.print("--watch does not apply to --json: printed once")
            common.print_json(state.model_dump(mode="json"))
            return
        info = await client.get(job)
        if not watch:
            if state.gpus:
                width = common.console.width
                common.console.print(metrics_table(state, progress.placement, width=width))
            elif not _say_not_started(info, follow=False):
                common.console.print(_no_samples(info, progress))
            return

        def view() -> Any:
            if state.gpus:
                return metrics_table(state, progress.placement, width=common.console.width)
            return Text(_no_samples(info, progress) + "\n")  # Live leaves its last line open

        async def refreshed() -> None:
            nonlocal info, state, progress
            await asyncio.sleep(2)
            info = await client.get(job)
            state = await client.metrics(job)
            progress = await client.progress(job)  # a job that waited has hosts now

        if not common.console.is_terminal:
            # Piped or redirected: nothing can be redrawn in place, so each new reading is
            # printed below the last (a Live display would print once, at the end).
            shown = None
            while True:
                if state != shown:
                    common.console.print(view())
                    shown = state
                if info.status.is_final:
                    break
                await refreshed()
        else:
            with Live(view(), console=common.console) as live:
                while not info.status.is_final:
                    await refreshed()
                    live.update(view())
        # The table stays on screen: say why it stopped moving.
        ended = info.status.value + (f" ({info.reason})" if info.reason else "")
        common.console.print(f"{info.name} ended {ended}", highlight=False)
    finally:
        await client.close()


def _no_samples(info: Any, progress: Any) -> str:
    """Why a job's metrics hold no GPU sample (its monitor samples as it looks at the job)."""
    from gpuflow.specs.units import format_duration
    from gpuflow.status import NO_GPUS, JobStatus
    from gpuflow.workflows.monitor import POLL_TICK

    placement = progress.placement
    if info.gpus == NO_GPUS or (
        placement is not None and not any(node.gpu_indices for node in placement.nodes)
    ):
        return "no GPU samples: the job asks for no GPUs"
    every = (
        f"every {format_duration(POLL_TICK.total_seconds())} without a utilization policy, as "
        "the policy's window needs with one"
    )
    if info.status.is_final:
        return f"no GPU samples: the job ended before its first sample (samples come {every})"
    if info.status in (JobStatus.PENDING, JobStatus.PROVISIONING):
        return "no GPU samples yet: the job has not started"
    return f"no GPU samples yet: the job's monitor takes them as it looks at the job, {every}"


@run
async def offers(
    file: Path = typer.Option(..., "--file", "-f", help="Job file."),
    profile: str | None = typer.Option(None, "--profile", help="Profile (defaults) to inherit."),
    limit: int = typer.Option(
        20,
        "--limit",
        min=0,
        help="Hosts that fit to show per option, best first (0: as many as an answer holds).",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    queue: str | None = typer.Option(None, "--queue", "-q", help="Queue it would wait in."),
    priority: int | None = typer.Option(None, "--priority", help="Its priority, 0..100."),
    gpu: str | None = typer.Option(None, "--gpu", help="Override resources.gpu, e.g. A100:2."),
    fleet: list[str] | None = typer.Option(None, "--fleet", help="Fleets to try, in order."),
    max_duration: str | None = typer.Option(
        None, "--max-duration", help="As apply's: the job's time limit, e.g. 2h (off: never)."
    ),
) -> None:
    """Dry run: where the job would go (a gang of N hosts for N nodes), the best hosts that
    fit with their scores, and why the others do not (grouped by reason on big fleets). The
    flags are apply's, so a job can be dry-run as it would be submitted."""
    from gpuflow.cli.plan import print_offers

    (spec,) = common.load_jobs(
        [file],
        profile=profile,
        fleet=fleet,
        gpu=gpu,
        max_duration=max_duration,
        queue=queue,
        priority=priority,
    )
    client = await common.open_client()
    try:
        with common.console.status("reading the fleets…"), common.named_file([file]):
            per_option = await client.offers_per_option(spec, most=limit or None)
    finally:
        await client.close()
    if as_json:
        # A job with resource alternatives gets one entry per option, in the order tried.
        if len(per_option) == 1:
            common.print_json(per_option[0].offers.model_dump(mode="json"))
        else:
            common.print_json({"options": [o.model_dump(mode="json") for o in per_option]})
        return
    for option in per_option:
        if len(per_option) > 1:
            common.console.print(f"[bold]option {option.option}[/]: GPU {option.gpu}")
        print_offers(common.console, option.offers, spec=spec)
