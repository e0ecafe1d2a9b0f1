"""Why a job that has not started yet waits, and where it stands in line, as `gpuflow ps` says it.

Pure functions of the client's JobInfo. The job's workflow records why it waits in its message
(`waiting for capacity: host: reason; ...`); the full text stays in `ps --json`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpuflow.status import NO_CAPACITY_PREFIX, WAITING_PREFIX, JobStatus


def line_positions(jobs: Sequence[Any]) -> dict[str, tuple[int, int]]:
    """Job id -> (position, number waiting) among the pending jobs: higher priority first, then
    earlier submission.

    There is no real queue yet: this is the order in which waiting jobs would be looked at.
    Queues with an admission pass (fair share between queues, then priority, then submission
    time) are not built yet (docs/architecture.md); they will replace this with their order.
    """
    waiting = sorted(
        (job for job in jobs if job.status == JobStatus.PENDING),
        key=lambda job: (-job.priority, job.submitted_at),
    )
    return {job.id: (k, len(waiting)) for k, job in enumerate(waiting, 1)}


def short_reasons(reasons: str, *, most: int = 1) -> str:
    """`a: x; b: y; c: z` -> `a: x (+2 more)`: the first reasons, and how many are left out."""
    parts = [part.strip() for part in reasons.split("; ") if part.strip()]
    if not parts:
        return ""
    shown = "; ".join(parts[:most])
    left = len(parts) - most
    return shown + (f" (+{left} more)" if left > 0 else "")


def why_waiting(job: Any) -> str:
    """One short line: why a pending or provisioning job has not started yet."""
    message = job.message or ""
    if job.status == JobStatus.PROVISIONING:
        where = ", ".join(job.hosts) or "its hosts"
        return f"waiting for the host agent on {where}"
    if job.status != JobStatus.PENDING:
        return ""
    if message.startswith(WAITING_PREFIX):
        return NO_CAPACITY_PREFIX + short_reasons(message.removeprefix(WAITING_PREFIX))
    if message:
        return message
    # Submitted, and its workflow has not recorded a place step yet.
    return "waiting to be placed"


def waiting_summary(job: Any, positions: dict[str, tuple[int, int]]) -> dict[str, Any] | None:
    """What `ps --json` adds for a job that waits; None for one that does not."""
    if job.status not in (JobStatus.PENDING, JobStatus.PROVISIONING):
        return None
    position = positions.get(job.id)
    return {
        "reason": why_waiting(job),
        "position": position[0] if position else None,
        "waiting": position[1] if position else None,
    }
