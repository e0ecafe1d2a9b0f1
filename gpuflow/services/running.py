"""The jobs as admission counts them: each admitted queue entry with what it holds, and each
waiting entry as a pass tries it. Read by the admission pass (services/admission.py) and by a
dry run's preview of what a pass would do (services/preview.py); inside the caller's
transaction."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Row
from sqlalchemy import select as sa_select
from sqlmodel import Session, col

from gpuflow.scheduler.admission import Running, Waiting
from gpuflow.scheduler.model import Placement
from gpuflow.services.capacity import placements_of
from gpuflow.services.snapshot import columns
from gpuflow.services.verdicts import ADMITTED, PREEMPTING
from gpuflow.specs.job import DEFAULT_QUEUE, JobSpec
from gpuflow.store.tables import QueueEntryRow

ADMITTED_COLUMNS = columns(  # what a pass reads of a running job
    QueueEntryRow,
    "job_id attempt queue priority preemptible submitted_at admitted_at max_duration_s",
)


def utc(at: datetime) -> datetime:
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


def admitted_rows(session: Session) -> Sequence[Row[Any]]:
    """The admitted entries as plain columns (`ADMITTED_COLUMNS`), in submission order."""
    admitted = sa_select(*ADMITTED_COLUMNS).where(col(QueueEntryRow.state) == ADMITTED)
    order = (col(QueueEntryRow.submitted_at), col(QueueEntryRow.job_id))
    return session.connection().execute(admitted.order_by(*order)).all()


def counted_queue(name: str, known: set[str]) -> str:
    """The queue an entry counts in: its own, or the default queue once its own was deleted."""
    return name if name in known else DEFAULT_QUEUE


def waiting_of(entry: Any, spec: JobSpec, options: tuple[JobSpec, ...], queue: str) -> Waiting:
    """A waiting entry (a row of the queue entries, or those of its columns) as a pass tries
    it, its spec parsed: `queue`, the queue it counts in (`counted_queue`)."""
    return Waiting(
        name=entry.job_id,
        queue=queue,
        job=spec,
        submitted_at=utc(entry.submitted_at).timestamp(),
        priority=entry.priority,
        preemptible=entry.preemptible,
        options=options,
        may_wait=entry.may_wait,
        claims=bool(entry.reason and entry.reason.startswith(PREEMPTING)),
    )


def running_of(session: Session, admitted: Sequence[Row[Any]], queues: set[str]) -> list[Running]:
    """The admitted entries' jobs with what they hold (one without an allocation holds nothing
    to count or preempt); an entry of a queue that no longer exists counts in the default
    queue."""
    keys = [(row.job_id, row.attempt, row.admitted_at) for row in admitted]
    placements = placements_of(session, keys)
    return [
        _running(row, placements[key], counted_queue(row.queue, queues))
        for row, key in zip(admitted, keys, strict=True)
        if key in placements
    ]


def _running(entry: Row[Any], placement: Placement, queue: str) -> Running:
    started = utc(entry.admitted_at or entry.submitted_at).timestamp()
    return Running(
        name=entry.job_id,
        queue=queue,
        placement=placement,
        priority=entry.priority,
        preemptible=entry.preemptible,
        started_at=started,
        ends_at=None if entry.max_duration_s is None else started + entry.max_duration_s,
    )
