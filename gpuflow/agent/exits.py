"""How a host agent learns that a run ended: the exit code file that the run's wrapper writes as
its last step (it outlives an agent restart), or a process group that died without writing one
(a stopped or killed job). Probes and starts wait on these as a long poll, so an exit is
answered within moments of happening."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from temporalio import activity

from gpuflow.agent.processes import RunPaths
from gpuflow.workflows.models import ProbeResult

PROBE_WAIT_MAX_S = 15 * 60.0
"""Longest a probe waits for an exit (the workflow asks for one monitor tick, minutes at most)."""
EXIT_POLL_S = 0.05
"""How often a waiting probe looks for the exit code file: an exit is answered this soon."""
GROUP_POLL_S = 1.0
"""How often a waiting probe checks that the job's process group still lives (a stopped or
killed job writes no exit code)."""
WRAPPER_EXIT_CHECKS = 10
"""Looks (20 ms apart) for the wrapper to be gone after it wrote the exit code."""


async def wait_for_exit(
    paths: RunPaths,
    wait_s: float,
    *,
    alive: Callable[[], bool],
    on_wait: Callable[[], None] | None = None,
    every_s: float = 0.0,
) -> None:
    """Waits up to `wait_s` for the script's exit code file, looking for it every EXIT_POLL_S; a
    group that is no longer `alive` ends the wait too. Meanwhile `on_wait` runs in a thread
    every `every_s`, the first time at once. Heartbeats carry a cancellation (the job is being
    stopped) to the wait."""
    deadline = time.monotonic() + min(max(wait_s, 0.0), PROBE_WAIT_MAX_S)
    next_group_check = time.monotonic() + GROUP_POLL_S
    next_reading = time.monotonic()  # the first reading at once: a new job shows up
    while not paths.exit_code.exists() and time.monotonic() < deadline:
        if activity.in_activity():
            activity.heartbeat()
        now = time.monotonic()
        if now >= next_group_check:
            next_group_check = now + GROUP_POLL_S
            if not alive():
                break
        if on_wait is not None and now >= next_reading:
            next_reading = now + every_s
            await asyncio.to_thread(on_wait)
        await asyncio.sleep(min(EXIT_POLL_S, max(deadline - now, 0.0)))


def recorded_exit(paths: RunPaths, *, alive: Callable[[], bool]) -> ProbeResult:
    """The exit of a script that has ended (its exit code file exists), and whether processes
    it left behind still live in its group (`alive`)."""
    try:
        code = int(paths.exit_code.read_text().strip())
    except (OSError, ValueError):
        code = None
    # The wrapper writes the exit code as its last step and then exits itself: a group
    # still alive a moment after that holds processes the script left behind.
    leftovers = alive()
    for _ in range(WRAPPER_EXIT_CHECKS):
        if not leftovers:
            break
        time.sleep(0.02)
        leftovers = alive()
    return ProbeResult(state="exited", exit_code=code, leftovers=leftovers)
