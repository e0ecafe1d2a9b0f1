"""What an admission or a refusal writes: the queue entry, the job's row and its record.

The admission pass (services/admission.py), a submit decided as it enters (group_entry.py,
queue_entries.py) and a job's first step all decide on a job the same way, and write it
through these, inside the caller's `placement_transaction`.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlmodel import Session

from gpuflow.scheduler.filters import GANG, RESOURCES
from gpuflow.scheduler.model import Placement, Rejection, Unschedulable
from gpuflow.scheduler.offers import by_reason
from gpuflow.scheduler.reservation import Reservation
from gpuflow.services.capacity import commit_placement_in
from gpuflow.services.jobs import gpu_summary, record_status_in
from gpuflow.specs.job import JobSpec
from gpuflow.status import NO_CAPACITY_PREFIX, WAITING_PREFIX, JobStatus
from gpuflow.store.tables import JobRow, QueueEntryRow
from gpuflow.workflows.models import placed_message

WAITING = "waiting"
ADMITTED = "admitted"
REFUSED = "refused"
PREEMPTING = "preempting:"
"""The reason of a job admitted in a pass whose victims are still stopping."""


def set_admitted(entry: QueueEntryRow, now: datetime) -> None:
    """The entry as an admission leaves it (its spec is no longer needed)."""
    for name, value in admitted_values(now).items():
        setattr(entry, name, value)


def admitted_values(now: datetime) -> dict[str, Any]:
    """What `set_admitted` changes, as column values."""
    return {
        "state": ADMITTED,
        "admitted_at": now,
        "spec": {},
        "position": None,
        "reason": None,
        "detail": None,
        "reserved_hosts": None,
        "reserved_start": None,
    }


def admitted_key(attempt: int, message: str) -> str:
    """The key of an attempt's `admitted` record (a repeat of the same admission writes none)."""
    return f"{attempt}:admitted:{message[:80]}"


def admitted_job(placement: Placement) -> dict[str, Any]:
    """What an admission on this placement writes on its job's row (and says in its record):
    provisioning, where, on which hosts and GPUs."""
    return {
        "status": JobStatus.PROVISIONING,
        "message": placed_message(placement),
        "fleet": placement.fleet,
        "hosts": [node.host_name for node in placement.nodes],
        "gpus": gpu_summary(placement),
    }


def admit_placement_in(
    session: Session, entry: QueueEntryRow, placement: Placement, now: datetime
) -> None:
    """The entry's job is admitted on this placement: its allocation, entry and record."""
    commit_placement_in(session, job_id=entry.job_id, attempt=entry.attempt, placement=placement)
    set_admitted(entry, now)
    session.add(entry)
    job = admitted_job(placement)
    record_status_in(
        session,
        job_id=entry.job_id,
        name=entry.name,
        spec=None,
        event_key=admitted_key(entry.attempt, job["message"]),
        attempt=entry.attempt,
        at=now,
        **job,
    )


def say_waiting(session: Session, job_id: str, reasons: list[str]) -> bool:
    """The job's row says why it waits (what `ps` and `get` show), as the place step did;
    False when it said so already (nothing written)."""
    job = session.get(JobRow, job_id)
    message = WAITING_PREFIX + "; ".join(reasons)
    if job is None or job.status != JobStatus.PENDING or job.message == message:
        return False
    job.message = message
    session.add(job)
    return True


def refuse_in(session: Session, entry: QueueEntryRow, reason: str, reasons: list[str]) -> None:
    """The entry's job may not wait and nothing admits it: refused, saying why."""
    set_values(entry, **refused_values(reason, reasons))
    session.add(entry)


def refused_values(reason: str, reasons: list[str]) -> dict[str, Any]:
    """What a refusal writes on its job's queue entry."""
    return {"state": REFUSED, "spec": {}, "reason": reason, "detail": "\n".join(reasons)}


MAX_REASON_LINES = 1_000
"""Lines of a refusal at most, one per host and option. A refusal travels in one Temporal
payload (2 MiB at most) and is shown to a user: on a fleet of thousands of hosts, and more so
for a job of several options, hosts that share a reason then share a line, which names the
first few of them and counts the rest (scheduler/offers.py `by_reason`)."""


BUSY_STAGES = (RESOURCES, GANG)
"""Filters that reject a host for what runs on it now: the host could take the job later."""


def _busy_first(rejections: list[Rejection]) -> list[Rejection]:
    """The hosts that could take the job once capacity frees first (what a waiting job waits
    for, and what `ps` shows of it), then those that never could (another model, no GPUs)."""
    return sorted(rejections, key=lambda rejection: rejection.filter not in BUSY_STAGES)


def no_fit_lines(tries: list[tuple[JobSpec, Placement | Unschedulable]]) -> list[str]:
    """Per host, why none of a job's options fit (each option's lines labelled when several),
    the hosts that are busy now first; past MAX_REASON_LINES, per reason."""
    refused = [
        (
            f"option {k + 1} ({option.resources.gpu_label}): " if len(tries) > 1 else "",
            Unschedulable.model_construct(rejections=_busy_first(found.rejections)),
        )
        for k, (option, found) in enumerate(tries)
        if isinstance(found, Unschedulable)
    ]
    if sum(len(found.rejections) for _, found in refused) > MAX_REASON_LINES:
        most = max(1, MAX_REASON_LINES // len(refused))
        return [
            label + line
            for label, found in refused
            for line in ([str(r) for r in by_reason(found.rejections, most)] or [found.message()])
        ]
    lines = [
        label + line for label, found in refused for line in (found.lines or [found.message()])
    ]
    return lines or [NO_CAPACITY_PREFIX.rstrip(": ")]


def set_values(entry: QueueEntryRow, **values: object) -> None:
    for name, value in values.items():
        setattr(entry, name, value)


_ENTRIES = QueueEntryRow.__table__  # type: ignore[attr-defined]


def mark_reserved(session: Session, reservation: Reservation | None) -> None:
    """The reservation's job's entry says which hosts are reserved for it and when it can
    start at the latest (`gpuflow ps`, `describe`); every other entry says nothing of one."""
    holder = reservation.job if reservation is not None else ""
    session.connection().execute(
        _ENTRIES.update()
        .where(_ENTRIES.c.reserved_hosts.is_not(None), _ENTRIES.c.job_id != holder)
        .values(reserved_hosts=None, reserved_start=None)
    )
    if reservation is None:
        return
    start = reservation.starts_at
    session.connection().execute(
        _ENTRIES.update()
        .where(_ENTRIES.c.job_id == holder, _ENTRIES.c.state == WAITING)
        .values(
            reserved_hosts=",".join(sorted(reservation.hosts)),
            reserved_start=None if start is None else datetime.fromtimestamp(start, UTC),
        )
    )
