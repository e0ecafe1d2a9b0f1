"""Why a job that has not started yet waits, and where it stands in line, as `gpuflow ps` says it.

Pure functions of the client's JobInfo. A job waiting in its queue has the place and the reason
the last admission pass left it with (`queue_position`, `queue_reason`); the job's workflow
records the hosts' reasons in its message (`waiting for capacity: host: reason; ...`); the full
text stays in `ps --json`.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from gpuflow.specs.queue import QUOTA_WAIT
from gpuflow.specs.units import format_duration
from gpuflow.status import (
    NEVER_ADMITTED,
    NO_CAPACITY_PREFIX,
    WAITING_PREFIX,
    JobStatus,
    split_reasons,
    waits_to_retry,
)


def line_positions(jobs: Sequence[Any]) -> dict[str, tuple[int, int]]:
    """Job id -> (position, number waiting in its queue) for the pending jobs that no admission
    pass has placed in line yet (no `queue_position`): among all of their queue's waiting jobs
    listed, those a pass placed included, by priority, then submission, as admission orders
    the jobs of one queue (two queues' jobs are not counted in one line)."""
    by_queue: dict[str | None, list[Any]] = {}
    for job in jobs:
        if job.status == JobStatus.PENDING and not waits_to_retry(job.message):
            by_queue.setdefault(job.queue, []).append(job)
    positions = {}
    for members in by_queue.values():
        members.sort(key=lambda job: (-job.priority, job.submitted_at))
        for k, job in enumerate(members, 1):
            if job.queue_position is None:
                positions[job.id] = (k, len(members))
    return positions


def queue_reason_text(reason: str | None) -> str:
    """An admission pass's reason for leaving a job waiting, in words: `no_capacity` -> `no
    capacity`, `quota` -> `over quota`, `reserved_for:ID` -> `reserved for ID` (job ids read
    `job-<name>-<suffix>`), `quota_held_for:ID` -> `quota held for ID`, `preempting:ID,ID` ->
    `preempting ID, ID`."""
    if not reason:
        return "waiting to be admitted"
    kind, _, rest = reason.partition(":")
    if kind == "no_capacity":
        return "no capacity"
    if kind == "quota":
        return "over quota"
    if kind == "reserved_for":
        return f"reserved for {rest}" if rest else "reserved for another job"
    if kind == "quota_held_for":
        return f"quota held for {rest}" if rest else "quota held for another job"
    if kind == "preempting":
        jobs = ", ".join(job for job in rest.split(",") if job)
        return f"preempting {jobs}" if jobs else "preempting other jobs"
    return reason.replace("_", " ")


def reserved_text(job: Any, now: datetime | None = None) -> str | None:
    """`reserves h1, h2 (starts within 4m)` for a job that holds the backfill reservation
    (`start unknown` when a job it waits for declares no max_duration); None otherwise."""
    hosts = getattr(job, "reserved_hosts", None)
    if job.status != JobStatus.PENDING or not hosts:
        return None
    named = ", ".join(host.split("/", 1)[-1] for host in hosts)
    start = job.reserved_start
    if start is None:
        return f"reserves {named} (start unknown)"
    left = (start - (now or datetime.now(UTC))).total_seconds()
    when = f"starts within {format_duration(left)}" if left >= 1 else "starts any moment"
    return f"reserves {named} ({when})"


def queue_wait(job: Any) -> str | None:
    """Why an admission pass left the job waiting, in words; None for a job that no pass has
    placed in line. Without capacity, the hosts' first reason follows, as `why_waiting` says;
    the job that holds the reservation says which hosts instead, and by when it starts."""
    if job.status != JobStatus.PENDING or job.queue_position is None:
        return None
    reserved = reserved_text(job)
    if reserved is not None:  # it waits for capacity, first in line for these hosts
        return f"no capacity; {reserved}"
    reason = queue_reason_text(job.queue_reason)
    message = job.message or ""
    if reason == "no capacity" and message.startswith(WAITING_PREFIX):
        return why_waiting(job)
    if reason == "over quota" and NEVER_ADMITTED in message:
        return "over quota: " + message.removeprefix(WAITING_PREFIX)
    if reason == "over quota" and message.startswith(WAITING_PREFIX + QUOTA_WAIT):
        return why_waiting(job)  # which limit of its queue's quota holds it
    return reason


def queue_place(job: Any) -> str | None:
    """`queue/#position reason` for a job that an admission pass left waiting, else None."""
    reason = queue_wait(job)
    return None if reason is None else f"{job.queue}/#{job.queue_position} {reason}"


def short_reasons(reasons: str, *, most: int = 1) -> str:
    """`a: x; b: y; c: z` -> `a: x (+2 more)`: the first reasons, and how many are left out."""
    parts = split_reasons(reasons)
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
        reasons = message.removeprefix(WAITING_PREFIX)
        if reasons.startswith(QUOTA_WAIT):  # its queue's quota holds it, whatever frees
            return short_reasons(reasons)
        return NO_CAPACITY_PREFIX + short_reasons(reasons)
    if message:
        return message
    # Submitted, and its workflow has not recorded a place step yet.
    return "waiting to be placed"


def waiting_summary(job: Any, positions: dict[str, tuple[int, int]]) -> dict[str, Any] | None:
    """What `ps --json` adds for a job that waits; None for one that does not."""
    if job.status not in (JobStatus.PENDING, JobStatus.PROVISIONING):
        return None
    reason = queue_wait(job)
    if reason is not None:
        # Its position is in the admission pass's order, of which ps sees only its own jobs.
        return {"reason": reason, "position": job.queue_position, "waiting": None}
    position = positions.get(job.id)
    return {
        "reason": why_waiting(job),
        "position": position[0] if position else None,
        "waiting": position[1] if position else None,
    }
