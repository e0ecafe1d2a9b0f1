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
from pathlib import Path

LOST_CLAIM_EXIT = 97
"""Exit status of a wrapper that found the run already claimed (it ran nothing)."""
PID_WAIT_S = 5.0
"""How long a start waits for the claiming wrapper to write its pid (normally milliseconds:
the claim and the pid are the wrapper's first two commands)."""


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


async def claimed_pid(
    *, claim: Path, pid: Path, launched: bool = False, wait_s: float = PID_WAIT_S
) -> int | None:
    """The pid of the wrapper that claimed the run; None when nothing claimed it, or the claim
    holder died before writing its pid (then it never ran the script). With `launched` (a
    wrapper was just started), waits for a claim to appear too."""
    if not launched and not claim.exists():
        return None
    for _ in range(int(wait_s / 0.01)):
        with contextlib.suppress(OSError, ValueError):
            return int(pid.read_text().strip())
        await asyncio.sleep(0.01)
    return None


def drop_dead_claim(claim: Path) -> None:
    """Forget a claim whose holder died before running the script, so a start may run it."""
    with contextlib.suppress(FileNotFoundError):
        claim.rmdir()
