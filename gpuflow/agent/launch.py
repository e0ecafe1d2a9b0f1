"""Launching a job's script at most once per (job, attempt, rank), whatever dies when.

A start is retried when the agent that ran it died before answering. Its state file may be
missing (the agent died between starting the process and recording it), so the state file
alone cannot tell a retry that the script already runs. The wrapper itself claims the run with
an atomic `mkdir` before anything else and writes its pid once it holds the claim: a second
wrapper for the same run exits at once without running the script, and a retried start adopts
the pid the winner wrote.
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

from gpuflow.agent.processes import RunPaths, write_private

LOST_CLAIM_EXIT = 97
"""Exit status of a wrapper that found the run already claimed (it ran nothing)."""
PID_WAIT_S = 5.0
"""How long a start waits for the claiming wrapper to write its pid (normally milliseconds:
the claim and the pid are the wrapper's first two commands)."""
PID_POLL_S = 0.002
"""How often that wait looks for the pid: the job's start is reported (and its workflow goes
on) this soon after the wrapper wrote it."""


def wrapper_command(*, script: Path, log: Path, exit_code: Path, claim: Path, pid: Path) -> str:
    """The shell line that runs the job's script once: claim, pid, script, exit code."""
    q = {
        name: shlex.quote(str(path))
        for name, path in (
            ("script", script),
            ("log", log),
            ("exit", exit_code),
            ("claim", claim),
            ("pid", pid),
        )
    }
    return (
        f"mkdir -m 700 {q['claim']} 2>/dev/null || exit {LOST_CLAIM_EXIT}; "
        f"(umask 077 && echo $$ > {q['pid']}.tmp) && mv {q['pid']}.tmp {q['pid']}; "
        f"bash {q['script']} > {q['log']} 2>&1; "
        f"code=$?; (umask 077 && echo $code > {q['exit']}.tmp) && mv {q['exit']}.tmp {q['exit']}"
    )


def job_working_dir(working_dir: str | None, run_dir: Path) -> Path:
    """Where a job's commands run on this host: the run's own directory (`run_dir`) when the
    job names none; `~` and `~/...` in the home of the user this agent runs as; an absolute
    path as it is; a relative one inside the run's own directory, whatever directory the
    agent was started in. RuntimeError when `~` is used and that user has no home."""
    if not working_dir:
        return run_dir
    if working_dir == "~" or working_dir.startswith("~/"):
        return Path.home() / working_dir[2:]
    return run_dir / working_dir  # an absolute working_dir replaces run_dir


def spawn_wrapper(
    paths: RunPaths, *, commands: list[str], cwd: Path, env: dict[str, str]
) -> subprocess.Popen[bytes]:
    """Writes the run's script and an empty log, both private, and starts the wrapper that runs
    the script once, in a session of its own: its process group is the job's. The run's
    directory and `cwd` (job_working_dir) must exist; the job runs in `cwd`."""
    write_private(paths.script, "set -e\n" + "\n".join(commands) + "\n")
    write_private(paths.log, "")  # the wrapper's `>` keeps this mode
    return subprocess.Popen(
        [
            "bash",
            "-c",
            wrapper_command(
                script=paths.script,
                log=paths.log,
                exit_code=paths.exit_code,
                claim=paths.claim,
                pid=paths.pid,
            ),
        ],
        cwd=cwd,
        env=env,
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


async def claimed_pid(
    *, claim: Path, pid: Path, launched: bool = False, wait_s: float = PID_WAIT_S
) -> int | None:
    """The pid of the wrapper that claimed the run; None when nothing claimed it, or the claim
    holder died before writing its pid (then it never ran the script). With `launched` (a
    wrapper was just started), waits for a claim to appear too."""
    if not launched and not claim.exists():
        return None
    for _ in range(int(wait_s / PID_POLL_S)):
        with contextlib.suppress(OSError, ValueError):
            return int(pid.read_text().strip())
        await asyncio.sleep(PID_POLL_S)
    return None


def drop_dead_claim(claim: Path) -> None:
    """Forget a claim whose holder died before running the script, so a start may run it."""
    with contextlib.suppress(FileNotFoundError):
        claim.rmdir()


class RunLocks:
    """One lock per run (job, attempt, rank): starts of different runs go on side by side (a
    pass that admits several jobs onto one host starts them together), while a retried start
    waits for the one it repeats, so a run is launched at most once. A lock lives while someone
    holds or waits for it."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    @contextlib.asynccontextmanager
    async def hold(self, run: str) -> AsyncIterator[None]:
        lock, users = self._locks.get(run, (asyncio.Lock(), 0))
        self._locks[run] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[run]
            if users == 1:
                del self._locks[run]
            else:
                self._locks[run] = (lock, users - 1)

    def __len__(self) -> int:
        """Runs whose lock is held or waited for."""
        return len(self._locks)
