"""`gpuflow up` and `gpuflow down`: the embedded stack's process, and the jobs that run on it
when it goes down."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.text import Text
from temporalio.service import RPCError, RPCStatusCode

from gpuflow.cli.render import status_text
from gpuflow.config import TemporalConfig, ensure_home, gpuflow_home
from gpuflow.errors import GpuflowError
from gpuflow.stack_record import READY_FILE, gpuflow_process, read_stack_record
from gpuflow.status import JobStatus


def _pid_file(home: Path) -> Path:
    return home / "up.pid"


def _ready_file(home: Path) -> Path:
    return home / READY_FILE


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _stack_pid(home: Path) -> int | None:
    """The pid of the stack that serves `home` when one is up (its pid file names a live
    gpuflow process), else None."""
    try:
        pid = int(_pid_file(home).read_text() or 0)
    except (OSError, ValueError):
        return None
    if pid == os.getpid() or not gpuflow_process(pid):
        return None
    return pid


def _already_up(home: Path, pid: int) -> str:
    record = read_stack_record(home)
    ui = record.ui if record is not None else "not ready yet"
    return f"gpuflow is already up (pid {pid}); Temporal UI {ui}; `gpuflow down` stops it"


def up_foreground(console: Console) -> None:
    from gpuflow.control.embedded import serve

    home = gpuflow_home()
    ensure_home(home)
    running = _stack_pid(home)
    if running is not None:  # its pid and ready files are its own: leave them be
        raise GpuflowError(_already_up(home, running))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    ready = _ready_file(home)
    ready.unlink(missing_ok=True)
    mine = str(os.getpid())
    _pid_file(home).write_text(mine)
    console.print(f"starting gpuflow (home {home})…")
    try:
        asyncio.run(serve(home=home, ready_file=ready))
    finally:
        if _owns(home, mine):
            _pid_file(home).unlink(missing_ok=True)
            ready.unlink(missing_ok=True)


def _owns(home: Path, pid: str) -> bool:
    try:
        return _pid_file(home).read_text() == pid
    except OSError:
        return False


_ESCAPES = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def up_detached(console: Console, *, timeout_s: float = 120) -> None:
    home = gpuflow_home()
    ensure_home(home)
    running = _stack_pid(home)
    if running is not None:
        console.print(_already_up(home, running))
        return
    _ready_file(home).unlink(missing_ok=True)
    log_path = home / "up.log"
    start = log_path.stat().st_size if log_path.exists() else 0
    log = log_path.open("ab")
    process = subprocess.Popen(
        [sys.executable, "-m", "gpuflow.cli.main", "up"],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        env=os.environ.copy(),
    )
    deadline = time.monotonic() + timeout_s
    with console.status("starting Temporal dev server, control worker and local agent…"):
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise GpuflowError(
                    f"gpuflow up failed: {_failure_since(log_path, start)} (see {log_path})"
                )
            if _ready_file(home).exists():
                break
            time.sleep(0.2)
        else:
            process.terminate()
            raise GpuflowError(
                f"gpuflow up did not become ready in {timeout_s:.0f}s (see {log_path})"
            )
    record = read_stack_record(home)
    ui = record.ui if record is not None else "?"
    temporal = f"Temporal at {record.temporal}, " if record and record.temporal else ""
    console.print(
        f"gpuflow is up (pid {process.pid}); {temporal}Temporal UI at [link]{ui}[/]; "
        f"logs in {log_path}",
        highlight=False,
    )


def _failure_since(log: Path, start: int) -> str:
    """Why the detached stack exited, from what this start wrote to its log (the log keeps
    earlier starts'): its own `error:` line when it wrote one, else its last lines, without
    terminal colours."""
    with log.open("rb") as handle:
        handle.seek(start)
        text = handle.read().decode(errors="replace")
    lines = [_ESCAPES.sub("", line) for line in text.splitlines()]
    errors = [line.removeprefix("error: ") for line in lines if line.startswith("error: ")]
    if errors:
        return errors[-1]
    return " | ".join(line.strip() for line in lines[-5:] if line.strip()) or "no output"


def running_pid() -> int | None:
    """The pid of the stack serving this home (`gpuflow up`, detached or not), or None when
    it is not up (a stale pid file and record are removed)."""
    home = gpuflow_home()
    pid = _stack_pid(home)
    if pid is None:
        _pid_file(home).unlink(missing_ok=True)
        _forget_record(home)
    return pid


def _forget_record(home: Path) -> None:
    """Remove the home's up.ready when the `gpuflow up` that wrote it is gone."""
    record = read_stack_record(home)
    if record is not None and record.pid is not None and not record.serving:
        _ready_file(home).unlink(missing_ok=True)


def _same_temporal(home: Path) -> None:
    """`down` stops the jobs of the stack it stops, on that stack's Temporal: a variable that
    names another Temporal (the stack of another home, say) would have them stopped there."""
    record = read_stack_record(home)
    if record is None or record.temporal is None or not record.serving:
        return  # a stack that joined a cluster, or an older gpuflow's record
    config = TemporalConfig.from_env()
    if config.address != record.temporal:
        variable = "GPUFLOW_TEMPORAL_" + ("PORT" if config.embedded else "ADDRESS")
        raise GpuflowError(
            f"the stack of GPUFLOW_HOME {home} serves Temporal at {record.temporal}, but "
            f"{variable} names {config.address}; unset it to stop this stack (nothing was "
            "stopped)"
        )


def _stop_orphan(console: Console) -> bool:
    """Stop the Temporal dev server a killed `gpuflow up` left running (it holds the port, so
    no `up` could start); whether there was one."""
    from gpuflow.control.embedded import orphaned_server, stop_orphaned_server

    home = gpuflow_home() / "temporal"
    orphan = orphaned_server(home)
    if orphan is None:
        return False
    with console.status(f"stopping the Temporal dev server (pid {orphan})…"):
        stop_orphaned_server(home, orphan)
    console.print(
        f"gpuflow was not up, but its Temporal dev server (pid {orphan}) was: a `gpuflow up` "
        "that was killed left it running. Stopped it; jobs that ran go on without gpuflow "
        "until `gpuflow up` picks them up again."
    )
    return True


def stop_stack(console: Console, pid: int, *, timeout_s: float = 60) -> None:
    """Stop the stack's process (SIGTERM, then SIGKILL after `timeout_s`). Job processes are
    not its children: whoever calls this has dealt with running jobs first."""
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    with console.status("stopping the Temporal dev server, control worker and local agent…"):
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
    if _alive(pid):
        os.kill(pid, signal.SIGKILL)
    _pid_file(gpuflow_home()).unlink(missing_ok=True)
    _forget_record(gpuflow_home())


async def down(
    console: Console,
    connect: Callable[[], Awaitable[Any]],
    *,
    stop_jobs: bool,
    force: bool,
) -> None:
    """`gpuflow down`: running jobs are stopped first (asked, or `stop_jobs`), or left running
    with `force` and named; then the stack's process is stopped."""
    pid = running_pid()
    if pid is None:
        if not _stop_orphan(console):
            console.print("gpuflow is not up")
        return
    _same_temporal(gpuflow_home())
    left: list[Any] = []
    try:
        client = await connect()
    except GpuflowError as exc:
        if not force:
            raise GpuflowError(
                f"{exc}; cannot see which jobs run, so nothing was stopped "
                "(gpuflow down --force stops the stack anyway)"
            ) from None
        console.print(f"[yellow]cannot list jobs ({exc}); stopping the stack anyway[/]")
    else:
        try:
            # Only the embedded stack's control plane goes down with this process: on a
            # cluster, other control workers go on admitting, and a hold would outlive `down`.
            hold = stack_address() is not None
            left = await settle_jobs(console, client, stop_jobs=stop_jobs, force=force, hold=hold)
        finally:
            await client.close()
    await asyncio.to_thread(stop_stack, console, pid)
    console.print("gpuflow is down")
    if left:
        names = ", ".join(job.name for job in left)
        console.print(
            f"[yellow]left {len(left)} job(s) running without gpuflow[/]: {names}; their "
            "processes keep running and nothing watches them (nor stops them, nor releases "
            "their GPUs) until the next `gpuflow up`",
            highlight=False,
        )


async def settle_jobs(
    console: Console, client: Any, *, stop_jobs: bool, force: bool, hold: bool
) -> list[Any]:
    """Before the stack goes down: stop the jobs that have (or are about to have) processes,
    or return them to be reported as left running. Pending jobs wait durably either way: while
    jobs stop, admission is held (`hold`: the embedded stack; until the next `gpuflow up`)."""
    jobs = await client.jobs()
    active = [j for j in jobs if _has_processes(j)]
    pending = [j for j in jobs if j.status == JobStatus.PENDING]
    if pending:
        console.print(
            f"{len(pending)} pending job(s) ({', '.join(j.name for j in pending)}) keep waiting "
            "and are placed after the next `gpuflow up`",
            highlight=False,
        )
    if not active:
        return []
    console.print(f"{len(active)} job(s) running:")
    for job in active:
        console.print(f"  {job.name} ({job.id}) on {','.join(job.hosts) or '-'}", highlight=False)
    if force:
        return active
    if not stop_jobs and not _confirm(f"Stop these {len(active)} job(s) first?"):
        raise GpuflowError(
            f"{len(active)} job(s) still running; nothing was stopped. Stop them with "
            "`gpuflow down --stop-jobs` (-y), or leave their processes running without "
            "gpuflow with `gpuflow down --force`"
        )
    # The GPUs they free must not start waiting jobs just before the stack goes down (their
    # processes would run on without gpuflow): admission is held until the next `gpuflow up`.
    try:
        if hold:
            await client.hold_admission()
    except GpuflowError as exc:
        console.print(f"[yellow]{exc}: waiting jobs may start while these stop[/]")
    try:
        ended = await _stop_until_none_run(console, client, active)
    except BaseException:
        with contextlib.suppress(GpuflowError):  # the stack stays up: admission goes on
            if hold:
                await client.hold_admission(False)
        raise
    return [info for info in ended if not info.status.is_final]


STOP_ROUNDS = 3
"""Times `down` looks again for jobs that started while it stopped the others."""


async def _stop_until_none_run(console: Console, client: Any, active: list[Any]) -> list[Any]:
    """Stop the jobs, then look again: a job submitted meanwhile may have started in its own
    first step (a job placed at submit, which the hold does not reach), and it must not run on
    without gpuflow either. Up to STOP_ROUNDS looks; what still runs after them is returned."""
    ended: list[Any] = []
    for _ in range(STOP_ROUNDS):
        with console.status(f"stopping {len(active)} job(s)…"):
            now = await asyncio.gather(*(client.stop(job.id, wait=True) for job in active))
        for info in now:
            console.print(Text.assemble(f"{info.name}: ", status_text(info.status, info.reason)))
        ended += now
        seen = {info.id for info in ended}
        active = [job for job in await client.jobs() if _has_processes(job) and job.id not in seen]
        if not active:
            return ended
        console.print(f"{len(active)} more job(s) started meanwhile:")
        for job in active:
            console.print(f"  {job.name} ({job.id})", highlight=False)
    return ended + active


def _has_processes(job: Any) -> bool:
    return job.status in (JobStatus.RUNNING, JobStatus.PROVISIONING)


def _confirm(question: str) -> bool:
    """Asked on a terminal only: a script without -y or --force is refused, not guessed for."""
    return sys.stdin.isatty() and typer.confirm(question, default=True)


# ---- what the CLI says when the stack is down --------------------------------------------


def stack_address() -> str | None:
    """The embedded stack's Temporal address when the CLI talks to it (no cluster configured)."""
    from gpuflow.config import TemporalConfig

    try:
        config = TemporalConfig.from_env()
    except GpuflowError:
        return None
    return config.address if config.embedded else None


def stack_down_message(address: str) -> str:
    return f"cannot reach Temporal at {address} — is the stack up? (gpuflow up -d)"


def temporal_lost(exc: RPCError) -> str:
    """One line for an RPC that failed after the connection was made."""
    first = exc.message.strip().splitlines()[0] if exc.message.strip() else exc.status.name
    if exc.status in (RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED):
        address = stack_address()
        if address is not None:
            return stack_down_message(address)
        return f"lost Temporal ({exc.status.name.lower()}): {first}"
    return f"Temporal refused the request ({exc.status.name.lower()}): {first}"
