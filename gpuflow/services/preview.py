"""What an admission pass would do now with jobs about to be submitted: the plan's verdict
(`gpuflow apply`, `Client.plan`) on admission's own terms. A host that fits is not a start: the
jobs waiting ahead of a new one take the free capacity first, its queue's quota may be spent,
or the room may be reserved for a blocked job. So the plan runs the pass itself (scheduler/
admission.py `admit`) on the jobs waiting now, the running ones and the planned jobs submitted
last, on a snapshot read for the purpose, and reports each planned job's fate. A read: the loop
decides for real, and may decide otherwise if jobs arrive or end meanwhile."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

from sqlalchemy import select as sa_select
from sqlmodel import Session, col

from gpuflow.scheduler.admission import RESERVED_FOR, Decision, Reservation, Waiting, admit
from gpuflow.scheduler.model import Placement, Snapshot
from gpuflow.scheduler.usage import apply_placement, release_placement
from gpuflow.services.queues import queues_in
from gpuflow.services.running import admitted_rows, counted_queue, running_of, waiting_of
from gpuflow.services.snapshot import columns, read_snapshot
from gpuflow.services.verdicts import WAITING
from gpuflow.specs.job import JobSpec
from gpuflow.store.tables import QueueEntryRow

PLANNED = "planned job "
"""Names of the planned jobs in the pass (no job id has a space)."""

WAITING_COLUMNS = columns(
    QueueEntryRow, "job_id queue priority preemptible submitted_at may_wait reason spec"
)


@dataclass(frozen=True)
class Preview:
    """One planned job's fate in a pass run now."""

    placement: Placement | None = None
    """Where the pass would start it now; None: it would wait (or, if it may not, be refused)."""
    preempts: list[str] = field(default_factory=list)
    """The running jobs the pass would preempt for it (it starts once they have stopped)."""
    waits: str | None = None
    """Why it would wait: no_capacity, quota or reserved_for:<job>; None when it starts."""
    ahead: int = 0
    """Jobs that would still wait ahead of it in its queue."""
    first: int = 0
    """Jobs waiting now that the pass would start (or preempt for) instead, when it waits."""


def preview(session: Session, specs: list[JobSpec]) -> list[Preview]:
    """Each planned job's fate, in the order given (the order they would be submitted in)."""
    return preview_each(session, [specs])[0]


def preview_each(
    session: Session, plans: list[list[JobSpec]], snapshot: Snapshot | None = None
) -> list[list[Preview]]:
    """`preview` of each list of jobs on its own (a dry run's resource options, each as if it
    were the job), the waiting and running jobs read once; on `snapshot` when the caller read
    the fleets in this transaction already (it is given back as it was), else on a fresh read."""
    if not plans:
        return []
    queues = queues_in(session)
    known = {queue.name for queue in queues}
    now = datetime.now(UTC).timestamp()
    waiting, holder = _waiting_now(session, known)
    running = running_of(session, admitted_rows(session), known)
    reserved = None
    if holder is not None:
        reserved = Reservation(holder, None, frozenset())  # its hosts: found again
    snapshot = read_snapshot(session) if snapshot is None else snapshot
    live = {job.name: job.placement for job in running}
    fates = []
    for specs in plans:
        planned = [
            Waiting(
                name=f"{PLANNED}{k}",
                queue=counted_queue(spec.queue, known),
                job=spec,
                submitted_at=now + k * 1e-6,
                priority=spec.priority,
                preemptible=spec.preemptible,
                options=tuple(spec.resource_options()),
                may_wait=spec.may_wait,
            )
            for k, spec in enumerate(specs)
        ]
        decision = admit(
            queues=queues,
            running=running,
            waiting=[*waiting, *planned],
            snapshot=snapshot,
            now=now,
            reserved=reserved,
        )
        fates.append([_fate(decision, job.name) for job in planned])
        _undo(snapshot, decision, live)
    return fates


def _undo(snapshot: Snapshot, decision: Decision, live: dict[str, Placement]) -> None:
    """Give the snapshot back the state before the pass: each admission released, each of its
    victims applied again, newest first (reading the fleet again costs more than the pass on a
    big one)."""
    for admitted in reversed(decision.admitted):
        release_placement(snapshot, admitted.placement)
        for victim in admitted.victims:
            apply_placement(snapshot, live[victim])


def _fate(decision: Decision, name: str) -> Preview:
    """The planned job's fate in the pass's decision."""
    for admitted in decision.admitted:
        if admitted.job.name == name:
            return Preview(admitted.placement, list(admitted.victims))
    (mine,) = [held for held in decision.waiting if held.job.name == name]
    queue = mine.job.queue
    ahead = sum(1 for h in decision.waiting if h.job.queue == queue and h.position < mine.position)
    first = sum(1 for a in decision.admitted if not a.job.name.startswith(PLANNED))
    return Preview(waits=mine.reason, ahead=ahead, first=first)


def _waiting_now(session: Session, known: set[str]) -> tuple[list[Waiting], str | None]:
    """The waiting jobs as a pass reads them, and the job the last pass reserved for (the one
    the others wait `reserved_for`), if any: the pass keeps its reservation to itself, so a
    holder nobody waits behind is found again by the preview's own pass."""
    query = sa_select(*WAITING_COLUMNS).where(col(QueueEntryRow.state) == WAITING)
    waiting, holder = [], None
    for row in session.connection().execute(query).all():
        spec = JobSpec.model_validate(row.spec)
        queue = counted_queue(row.queue, known)
        waiting.append(waiting_of(row, spec, tuple(spec.resource_options()), queue))
        if row.reason and row.reason.startswith(RESERVED_FOR):
            holder = row.reason.removeprefix(RESERVED_FOR)
    return waiting, holder
