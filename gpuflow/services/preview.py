"""What an admission pass would do now with jobs about to be submitted: the plan's verdict
(`gpuflow apply`, `Client.plan`) on admission's own terms. A host that fits is not a start: the
jobs waiting ahead of a new one take the free capacity first, its queue's quota may be spent,
or the room may be reserved for a blocked job. So the plan runs the pass itself (scheduler/
admission.py `admit`) on the jobs waiting now, the running ones and the planned jobs, on a
snapshot read for the purpose, and reports each planned job's fate. The planned jobs are
submitted one after the other, and each enters while the ones before it have run or wait (a
job that enters while nothing waits is decided at once, services/queue_entries.py): so each
gets a pass of its own, on the state the passes of the jobs before it left (their admissions
running, their victims gone, the rest waiting). A read: the loop decides for real, and may
decide otherwise if jobs arrive or end meanwhile."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

from sqlalchemy import select as sa_select
from sqlmodel import Session, col

from gpuflow.naming import RECORDED
from gpuflow.scheduler.admission import (
    RESERVED_FOR,
    Decision,
    Reservation,
    Running,
    Waiting,
    admit,
)
from gpuflow.scheduler.model import Placement, Snapshot
from gpuflow.scheduler.usage import apply_placement, release_placement
from gpuflow.services.queues import queues_in
from gpuflow.services.running import admitted_rows, counted_queue, running_of, waiting_of
from gpuflow.services.snapshot import columns, read_snapshot
from gpuflow.services.verdicts import WAITING
from gpuflow.specs.job import JobSpec
from gpuflow.specs.queue import QueueSpec
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
    """The running jobs the pass would preempt for it (it starts once they have stopped): ids,
    or `planned NAME` for a job planned before it."""
    waits: str | None = None
    """Why it would wait: no_capacity, quota, reserved_for:<job> or quota_held_for:<job>; None
    when it starts."""
    ahead: int = 0
    """Jobs that would still wait ahead of it in its queue."""
    first: int = 0
    """Jobs waiting now that the pass would start (or preempt for) instead, when it waits."""
    took: tuple[Placement, ...] = ()
    """Every placement its pass admitted (its own, and waiting jobs' that went first)."""
    freed: tuple[Placement, ...] = ()
    """The placements of the running jobs its pass preempted."""


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
    state = _State(queues, running, waiting, reserved, snapshot, now)
    fates = []
    for specs in plans:
        fates.append([state.enter(k, spec, known) for k, spec in enumerate(specs)])
        state.give_back()
    return fates


class _State:
    """The passes of one list of planned jobs, one per job in order, each on what the ones
    before it left; `give_back` returns the snapshot and the jobs to the state read."""

    def __init__(
        self,
        queues: list[QueueSpec],
        running: list[Running],
        waiting: list[Waiting],
        reserved: Reservation | None,
        snapshot: Snapshot,
        now: float,
    ) -> None:
        self.queues, self.snapshot, self.now = queues, snapshot, now
        self.read = (running, waiting, reserved)
        self.running, self.waiting, self.reserved = running, waiting, reserved
        self.live = {job.name: job.placement for job in running}
        self.decisions: list[Decision] = []
        self.names: dict[str, str] = {}
        """Planned job's name in the pass -> its own name."""

    def enter(self, k: int, spec: JobSpec, known: set[str]) -> Preview:
        job = Waiting(
            name=f"{PLANNED}{k}",
            queue=counted_queue(spec.queue, known),
            job=spec,
            submitted_at=self.now + k * 1e-6,
            priority=spec.priority,
            preemptible=spec.preemptible,
            options=tuple(spec.resource_options()),
            may_wait=spec.may_wait,
        )
        self.names[job.name] = f"planned {spec.name}"  # names need not be unique
        decision = admit(
            queues=self.queues,
            running=self.running,
            waiting=[*self.waiting, job],
            snapshot=self.snapshot,
            now=self.now,
            reserved=self.reserved,
        )
        self.decisions.append(decision)
        fate = _fate(decision, job.name, self.live, self.names)
        victims = {victim for admitted in decision.admitted for victim in admitted.victims}
        self.running = [r for r in self.running if r.name not in victims]
        for admitted in decision.admitted:
            self.live[admitted.job.name] = admitted.placement
            self.running.append(Running.admitted(admitted.job, admitted.placement, self.now))
        self.waiting = [held.job for held in decision.waiting]
        self.reserved = decision.reservation
        return fate

    def give_back(self) -> None:
        for decision in reversed(self.decisions):
            _undo(self.snapshot, decision, self.live)
        self.decisions.clear()
        self.running, self.waiting, self.reserved = self.read
        self.live = {job.name: job.placement for job in self.running}


def _undo(snapshot: Snapshot, decision: Decision, live: dict[str, Placement]) -> None:
    """Give the snapshot back the state before the pass: each admission released, each of its
    victims applied again, newest first (reading the fleet again costs more than the pass on a
    big one)."""
    for admitted in reversed(decision.admitted):
        release_placement(snapshot, admitted.placement)
        for victim in admitted.victims:
            apply_placement(snapshot, live[victim])


def _fate(
    decision: Decision, name: str, live: dict[str, Placement], names: dict[str, str]
) -> Preview:
    """The planned job's fate in the pass's decision; `live`: every running job's placement
    before the pass; `names`: the planned jobs' own names."""
    took = tuple(admitted.placement for admitted in decision.admitted)
    victims = [victim for admitted in decision.admitted for victim in admitted.victims]
    freed = tuple(live[victim] for victim in victims)
    for admitted in decision.admitted:
        if admitted.job.name == name:
            preempts = [names.get(victim, victim) for victim in admitted.victims]
            return Preview(admitted.placement, preempts, took=took, freed=freed)
    (mine,) = [held for held in decision.waiting if held.job.name == name]
    queue = mine.job.queue
    ahead = sum(1 for h in decision.waiting if h.job.queue == queue and h.position < mine.position)
    first = sum(1 for a in decision.admitted if not a.job.name.startswith(PLANNED))
    kind, sep, whom = mine.reason.partition(":")  # reserved_for:<job>, preempting:<jobs>, ...
    waits = kind + sep + ",".join(names.get(job, job) for job in whom.split(",")) if sep else kind
    return Preview(waits=waits, ahead=ahead, first=first, took=took, freed=freed)


def _waiting_now(session: Session, known: set[str]) -> tuple[list[Waiting], str | None]:
    """The waiting jobs as a pass reads them, and the job the last pass reserved for (the one
    the others wait `reserved_for`), if any: the pass keeps its reservation to itself, so a
    holder nobody waits behind is found again by the preview's own pass."""
    query = sa_select(*WAITING_COLUMNS).where(col(QueueEntryRow.state) == WAITING)
    waiting, holder = [], None
    for row in session.connection().execute(query).all():
        spec = JobSpec.model_validate(row.spec, context=RECORDED)
        queue = counted_queue(row.queue, known)
        waiting.append(waiting_of(row, spec, tuple(spec.resource_options()), queue))
        if row.reason and row.reason.startswith(RESERVED_FOR):
            holder = row.reason.removeprefix(RESERVED_FOR)
    return waiting, holder
