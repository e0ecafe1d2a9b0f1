"""The `gpuflow` command."""

from __future__ import annotations

import asyncio
import functools
import json
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import typer
from rich.console import Console

from gpuflow.errors import GpuflowError

app = typer.Typer(
    name="gpuflow",
    help="GPU jobs as durable Temporal workflows.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
fleet_app = typer.Typer(help="Fleets of hosts.", no_args_is_help=True)
app.add_typer(fleet_app, name="fleet")

console = Console()
err = Console(stderr=True)
T = TypeVar("T")


def run(coro_fn: Callable[..., Coroutine[Any, Any, T]]) -> Callable[..., T]:
    """Run an async command; a GpuflowError becomes one line on stderr and exit code 1."""

    @functools.wraps(coro_fn)
    def wrapper(*args: Any, **kwargs: Any) -> T:
        try:
            return asyncio.run(coro_fn(*args, **kwargs))
        except GpuflowError as exc:
            err.print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
            raise typer.Exit(1) from None
        except KeyboardInterrupt:
            err.print("interrupted")
            raise typer.Exit(130) from None

    return wrapper


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


async def _client() -> Any:
    from gpuflow.client import Client

    return await Client.connect()


# ---- stack ----------------------------------------------------------------------------------


@app.command()
def up(
    detach: bool = typer.Option(False, "--detach", "-d", help="Run in the background."),
) -> None:
    """Start the embedded stack: Temporal dev server, control worker, local host agent."""
    from gpuflow.cli import stack

    try:
        if detach:
            stack.up_detached(console)
        else:
            stack.up_foreground(console)
    except GpuflowError as exc:
        err.print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None


@app.command()
def down() -> None:
    """Stop the embedded stack started with `gpuflow up -d`."""
    from gpuflow.cli import stack

    try:
        stack.down(console)
    except GpuflowError as exc:
        err.print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def agent(ctx: typer.Context) -> None:
    """Run a host agent (see `gpuflow agent --help`)."""
    from gpuflow.worker.agent import main

    raise typer.Exit(main(list(ctx.args)))


# ---- jobs -----------------------------------------------------------------------------------


@app.command()
@run
async def apply(
    files: list[Path] = typer.Option(..., "--file", "-f", help="Job file(s)."),
    detach: bool = typer.Option(False, "--detach", "-d", help="Submit and return."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
    profile: str | None = typer.Option(None, "--profile", help="Profile (defaults) to inherit."),
    gpu: str | None = typer.Option(None, "--gpu", help="Override resources.gpu, e.g. A100:2."),
    fleet: list[str] | None = typer.Option(None, "--fleet", help="Fleets to try, in order."),
    max_duration: str | None = typer.Option(None, "--max-duration"),
    min_gpu_utilization: int | None = typer.Option(None, "--min-gpu-utilization"),
    time_window: str | None = typer.Option(None, "--time-window"),
) -> None:
    """Submit job files, show where they go, and follow them until they end."""
    from gpuflow.cli.follow import follow_jobs, show_plan
    from gpuflow.specs.load import load_job

    overrides: dict[str, Any] = {"fleets": fleet or None, "max_duration": max_duration}
    if gpu is not None:
        overrides["resources"] = {"gpu": gpu}
    policy = {
        k: v
        for k, v in (("min_gpu_utilization", min_gpu_utilization), ("time_window", time_window))
        if v is not None
    }
    if policy:
        overrides["utilization_policy"] = policy
    specs = [load_job(path, profile=profile, overrides=overrides) for path in files]
    client = await _client()
    try:
        for spec in specs:
            await show_plan(console, client, spec)
        if not yes:
            if not sys.stdin.isatty():
                raise GpuflowError("no terminal to confirm on: pass -y to submit")
            if not typer.confirm(f"Submit {len(specs)} job(s)?", default=True):
                raise typer.Exit(1)
        jobs = []
        for spec in specs:
            job = await client.submit(spec)
            console.print(f"submitted [bold]{job.name}[/] as [dim]{job.id}[/]")
            jobs.append(job)
        if detach:
            return
        ok = await follow_jobs(console, client, [job.id for job in jobs])
    finally:
        await client.close()
    if not ok:
        raise typer.Exit(1)


@app.command()
@run
async def ps(
    all_jobs: bool = typer.Option(False, "--all", "-a", help="Include finished jobs."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """List jobs."""
    from gpuflow.cli.render import jobs_table

    client = await _client()
    try:
        jobs = await client.list(include_finished=all_jobs)
    finally:
        await client.close()
    if as_json:
        print_json([job.model_dump(mode="json") for job in jobs])
    elif not jobs:
        console.print("no jobs" + ("" if all_jobs else " running (gpuflow ps -a shows all)"))
    else:
        console.print(jobs_table(jobs))


@app.command()
@run
async def logs(
    job: str = typer.Argument(..., help="Job name or id."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing until it ends."),
    node: int = typer.Option(0, "--node", help="Node rank."),
) -> None:
    """Print a job's output."""
    client = await _client()
    try:
        async for chunk in client.logs(job, rank=node, follow=follow):
            sys.stdout.write(chunk)
            sys.stdout.flush()
    finally:
        await client.close()


@app.command()
@run
async def stop(
    job: str = typer.Argument(..., help="Job name or id."),
    detach: bool = typer.Option(False, "--detach", "-d", help="Do not wait for it to end."),
) -> None:
    """Stop a job: its processes are stopped and its GPUs released."""
    from gpuflow.cli.render import status_text

    client = await _client()
    try:
        with console.status(f"stopping {job}…"):
            info = await client.stop(job, wait=not detach)
    finally:
        await client.close()
    console.print(f"{info.name}: ", status_text(info.status, info.reason), end="\n")


@app.command()
@run
async def metrics(
    job: str = typer.Argument(..., help="Job name or id."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    watch: bool = typer.Option(False, "--watch", "-w", help="Refresh every 2 seconds."),
) -> None:
    """GPU utilization and memory of a job, per node and GPU."""
    from rich.live import Live

    from gpuflow.cli.render import metrics_table

    client = await _client()
    try:
        state = await client.metrics(job)
        progress = await client.progress(job)
        if as_json:
            print_json(state.model_dump(mode="json"))
            return
        if not watch:
            if not state.gpus:
                console.print("no GPU samples yet")
            console.print(metrics_table(state, progress.placement))
            return
        with Live(metrics_table(state, progress.placement), console=console) as live:
            while not (await client.get(job)).status.is_final:
                await asyncio.sleep(2)
                live.update(metrics_table(await client.metrics(job), progress.placement))
    finally:
        await client.close()


@app.command()
@run
async def offers(
    file: Path = typer.Option(..., "--file", "-f", help="Job file."),
    profile: str | None = typer.Option(None, "--profile"),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Dry run: the hosts that fit the job (with scores) and why the others do not."""
    from gpuflow.cli.render import offers_table
    from gpuflow.specs.load import load_job

    spec = load_job(file, profile=profile)
    client = await _client()
    try:
        per_option = await client.offers_per_option(spec)
    finally:
        await client.close()
    if as_json:
        # A job with resource alternatives gets one entry per option, in the order tried.
        if len(per_option) == 1:
            print_json(per_option[0].offers.model_dump(mode="json"))
        else:
            print_json({"options": [o.model_dump(mode="json") for o in per_option]})
        return
    for option in per_option:
        result = option.offers
        if len(per_option) > 1:
            console.print(f"[bold]option {option.option}[/]: GPU {option.gpu}")
        if result.fits:
            console.print(offers_table(result))
        else:
            console.print("[bold red]nothing fits[/]")
        if result.rejections:
            console.print("[bold]does not fit[/]")
            for rejection in result.rejections:
                console.print(f"  {rejection}", highlight=False)


# ---- schedules ------------------------------------------------------------------------------

schedule_app = typer.Typer(
    help="Submit a job on a cron (Temporal Schedules).", no_args_is_help=True
)
app.add_typer(schedule_app, name="schedule")


@schedule_app.command("create")
@run
async def schedule_create(
    file: Path = typer.Option(..., "--file", "-f", help="Job file."),
    cron: str | None = typer.Option(None, "--cron", help="Cron expression, e.g. '0 3 * * *'."),
    every: str | None = typer.Option(None, "--every", help="Interval, e.g. 6h."),
    schedule_id: str | None = typer.Option(None, "--id", help="Schedule id."),
    profile: str | None = typer.Option(None, "--profile"),
) -> None:
    """Create a schedule; each run is a job of its own."""
    from gpuflow.specs.load import load_job
    from gpuflow.specs.units import parse_duration

    spec = load_job(file, profile=profile)
    try:
        every_s = parse_duration(every) if every is not None else None
    except ValueError as exc:
        raise GpuflowError(f"--every: {exc}") from None
    client = await _client()
    try:
        created = await client.schedule(spec, cron=cron, every_s=every_s, schedule_id=schedule_id)
    finally:
        await client.close()
    console.print(f"schedule [bold]{created}[/] created; runs show up in `gpuflow ps`")


@schedule_app.command("list")
@run
async def schedule_list(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """List schedules with their next runs."""
    from rich.table import Table

    client = await _client()
    try:
        schedules = await client.schedules()
    finally:
        await client.close()
    if as_json:
        print_json(schedules)
        return
    table = Table(box=None, header_style="bold")
    for column in ("SCHEDULE", "NEXT RUNS", "RECENT JOBS"):
        table.add_column(column)
    for item in schedules:
        table.add_row(item["id"], "\n".join(item["next"]) or "-", "\n".join(item["recent"]) or "-")
    console.print(table if schedules else "no schedules")


@schedule_app.command("delete")
@run
async def schedule_delete(schedule_id: str = typer.Argument(...)) -> None:
    """Delete a schedule (jobs it started keep running)."""
    client = await _client()
    try:
        await client.delete_schedule(schedule_id)
    finally:
        await client.close()
    console.print(f"schedule {schedule_id} deleted")


# ---- secrets --------------------------------------------------------------------------------

secret_app = typer.Typer(
    help="Secrets jobs refer to as ${{ secrets.NAME }}; never sent through Temporal.",
    no_args_is_help=True,
)
app.add_typer(secret_app, name="secret")


@secret_app.command("set")
def secret_set(name: str = typer.Argument(...)) -> None:
    """Store a secret (value from standard input, or asked for without echo)."""
    from gpuflow import secrets

    if sys.stdin.isatty():
        value = typer.prompt(f"value of {name}", hide_input=True)
    else:
        value = sys.stdin.read().rstrip("\n")
    if not value:
        err.print("[bold red]error:[/] empty value; nothing stored", soft_wrap=True)
        raise typer.Exit(1)
    try:
        secrets.set_secret(name, value)
    except GpuflowError as exc:
        err.print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None
    console.print(f"secret {name} stored in {secrets.secrets_file()}")


@secret_app.command("list")
def secret_list(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Names of the stored secrets (never their values)."""
    from gpuflow import secrets

    names = sorted(secrets.load())
    if as_json:
        print_json(names)
    else:
        console.print("\n".join(names) if names else "no secrets")


@secret_app.command("delete")
def secret_delete(name: str = typer.Argument(...)) -> None:
    """Delete a secret."""
    from gpuflow import secrets

    if not secrets.delete_secret(name):
        err.print(f"[bold red]error:[/] no secret named {name!r}", soft_wrap=True)
        raise typer.Exit(1)
    console.print(f"secret {name} deleted")


# ---- fleets ---------------------------------------------------------------------------------


@fleet_app.command("apply")
@run
async def fleet_apply(file: Path = typer.Option(..., "--file", "-f", help="Fleet file.")) -> None:
    """Create or update a fleet."""
    from gpuflow.cli.render import fleets_table
    from gpuflow.specs.load import load_fleet

    spec = load_fleet(file)
    client = await _client()
    try:
        with console.status(f"applying fleet {spec.name} ({len(spec.hosts) or 1} host(s))…"):
            info = await client.apply_fleet(spec)
    finally:
        await client.close()
    console.print(f"fleet [bold]{info.name}[/] applied")
    console.print(fleets_table([info]))


@fleet_app.command("list")
@run
async def fleet_list(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """List fleets and their hosts."""
    from gpuflow.cli.render import fleets_table

    client = await _client()
    try:
        fleets = await client.fleets()
    finally:
        await client.close()
    if as_json:
        print_json([fleet.model_dump(mode="json") for fleet in fleets])
    elif not fleets:
        console.print("no fleets (gpuflow fleet apply -f FILE adds one)")
    else:
        console.print(fleets_table(fleets))


@fleet_app.command("delete")
@run
async def fleet_delete(name: str = typer.Argument(...)) -> None:
    """Delete a fleet that runs no job."""
    client = await _client()
    try:
        await client.delete_fleet(name)
    finally:
        await client.close()
    console.print(f"fleet {name} deleted")


if __name__ == "__main__":
    app()
