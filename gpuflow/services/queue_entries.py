"""A job's entry in its queue, over the store: entering (at submit, or by its workflow's
enqueue step), asking what became of it, withdrawing, leaving. Each runs inside the caller's
transaction (the placement transaction where it writes) and is idempotent per (job, attempt).
A job that enters while nobody waits is decided at once by the pass (services/admission.py)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import ColumnElement, and_, bindparam, or_
from sqlalchemy import select as sa_select
from sqlmodel import Session, col, select

from gpuflow.scheduler import place
from gpuflow.scheduler.admission import NO_CAPACITY, first_fit
from gpuflow.scheduler.model import Placement, Unschedulable
from gpuflow.services.admission import run_pass_in, snapshot_in, told
from gpuflow.services.capacity import held_allocation, placement_of
from gpuflow.services.jobs import record_status_in
from gpuflow.services.queue_usage import admitted, quotas_now
from gpuflow.services.queues import queues_in
from gpuflow.services.verdicts import (
    ADMITTED,
    REFUSED,
    WAITING,
    admit_placement_in,
    no_fit_lines,
    refuse_in,
)
from gpuflow.specs.job import JobSpec
from gpuflow.specs.queue import QueueSpec
from gpuflow.status import JobStatus
from gpuflow.store.bulk import IDS_PER_STATEMENT, delete_rows
from gpuflow.store.tables import AllocationRow, JobRow, QueueEntryRow
from gpuflow.workflows.queue_models import AdmittedJob, EnqueueInput, QueueVerdict, RefusedJob

__all__ = [
    "anyone_waits_in",
    "enqueue_in",
    "enter_at_submit_in",
    "leave_queue_in",
    "leave_queues_in",
    "look_all_in",
    "look_in",
    "set_priority_in",
    "withdraw_in",
]


def _utc(at: datetime) -> datetime:
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


def _verdict(session: Session, entry: QueueEntryRow) -> QueueVerdict:
    held = None
    if entry.state == ADMITTED:
        held = held_allocation(session, entry.job_id, entry.attempt)
    return _verdict_of(entry.state, entry.reason, entry.detail, held)


def _verdict_of(
    state: str, reason: str | None, detail: str | None, held: Placement | None
) -> QueueVerdict:
    """What an entry says of its job: admitted with the placement it holds, refused with the
    reasons, or waiting and why. `held`: what an admitted entry's attempt holds."""
    if state == ADMITTED and held is not None:
        return QueueVerdict(placement=held)
    lines = [line for line in (detail or "").split("\n") if line]
    if state == REFUSED:
        return QueueVerdict(refused=lines or [reason or "no capacity"])
    return QueueVerdict(reason=reason, detail=lines)


_ENTRIES = QueueEntryRow.__table__.c  # type: ignore[attr-defined]
_ALLOCATIONS = AllocationRow.__table__.c  # type: ignore[attr-defined]
_LOOK = (
    sa_select(
        *(_ENTRIES.job_id, _ENTRIES.attempt, _ENTRIES.state, _ENTRIES.reason, _ENTRIES.detail),
        *(_ALLOCATIONS.fleet, _ALLOCATIONS.node, _ALLOCATIONS.score, _ALLOCATIONS.scorer),
    )
    .select_from(
        QueueEntryRow.__table__.outerjoin(  # type: ignore[attr-defined]
            AllocationRow.__table__,  # type: ignore[attr-defined]
            (_ALLOCATIONS.job_id == _ENTRIES.job_id) & (_ALLOCATIONS.attempt == _ENTRIES.attempt),
        )
    )
    .where(_ENTRIES.job_id.in_(bindparam("job_ids", expanding=True)))
    .order_by(_ENTRIES.job_id, _ALLOCATIONS.rank)
)


def look_in(session: Session, *, job_id: str, attempt: int) -> QueueVerdict | None:
    """What became of the job's attempt in its queue, read without the placement lock; None
    when it has not entered it."""
    return look_all_in(session, [(job_id, attempt)])[0]


def look_all_in(session: Session, asks: Sequence[tuple[str, int]]) -> list[QueueVerdict | None]:
    """`look_in` for several (job, attempt)s, in their order, in one prepared statement: the
    entries' verdict columns (not their specs) with the allocations admitted entries hold."""
    found: dict[str, list[Any]] = {}
    ids = list(dict.fromkeys(job_id for job_id, _ in asks))
    for start in range(0, len(ids), IDS_PER_STATEMENT):
        rows = session.connection().execute(
            _LOOK, {"job_ids": ids[start : start + IDS_PER_STATEMENT]}
        )
        for row in rows:
            found.setdefault(row[0], []).append(row)
    return [_looked(found.get(job_id), attempt) for job_id, attempt in asks]


def _looked(rows: list[Any] | None, attempt: int) -> QueueVerdict | None:
    if not rows or rows[0][1] != attempt:
        return None
    _, _, state, reason, detail = rows[0][:5]
    held = placement_of([row[5:] for row in rows if row[5] is not None])
    return _verdict_of(state, reason, detail, held if state == ADMITTED else None)


def retold_in(session: Session, pass_id: str) -> tuple[list[AdmittedJob], list[RefusedJob]]:
    """What a run of the pass `pass_id` committed, when the loop did not record its result (its
    worker died first) and runs that pass again: the entries it admitted, with the placement
    they hold, and those it refused, with the reasons. The run again tells those jobs; none of
    them waits any more, so it would decide nothing for them and they would never hear."""
    found = select(QueueEntryRow.job_id, QueueEntryRow.attempt).where(
        QueueEntryRow.decided_by == pass_id
    )
    asks = [(job_id, attempt) for job_id, attempt in session.exec(found).all()]
    admitted: list[AdmittedJob] = []
    refused: list[RefusedJob] = []
    for (job_id, attempt), verdict in zip(asks, look_all_in(session, asks), strict=True):
        if verdict is not None and verdict.placement is not None:
            placement = verdict.placement
            admitted.append(AdmittedJob(job_id=job_id, attempt=attempt, placement=placement))
        elif verdict is not None and verdict.refused is not None:
            reasons = told(verdict.refused)
            refused.append(RefusedJob(job_id=job_id, attempt=attempt, reasons=reasons))
    return admitted, refused


def set_waiting(entry: QueueEntryRow | None, inp: EnqueueInput) -> QueueEntryRow:
    """The entry (a new one when None) as the job's attempt enters its queue: waiting, with
    what a pass reads."""
    values = entry_values(inp)
    if entry is None:
        return QueueEntryRow(**values)
    for name, value in values.items():
        setattr(entry, name, value)
    return entry


def entry_values(inp: EnqueueInput, *, dumped: dict[str, Any] | None = None) -> dict[str, Any]:
    """`set_waiting`'s entry as column values; `dumped`: the spec as JSON, when the caller has
    it already."""
    spec = inp.spec
    return {
        "job_id": inp.job_id,
        "attempt": inp.attempt,
        "name": spec.name,
        "queue": spec.queue,
        "state": WAITING,
        "priority": spec.priority,
        "preemptible": spec.preemptible,
        "may_wait": inp.may_wait,
        "spec": spec.model_dump(mode="json") if dumped is None else dumped,
        "fleets": list(spec.fleets),
        "submitted_at": _utc(inp.submitted_at),
        "admitted_at": None,
        "decided_by": None,
        "max_duration_s": None if spec.max_duration is None else float(spec.max_duration),
        "position": None,
        "reason": None,
        "detail": None,
    }


def enqueue_in(session: Session, inp: EnqueueInput, *, warm: bool = True) -> QueueVerdict:
    """Put the job's attempt in its queue (an earlier attempt's entry is replaced), or, when it
    is there already, say what became of it. When no other job waits, the pass runs here at
    once (on the warm state, or a fresh read with `warm=False`); otherwise the entry is
    `waiting` until the loop's next pass decides."""
    entry = session.get(QueueEntryRow, inp.job_id)
    if entry is not None and entry.attempt == inp.attempt:
        return _verdict(session, entry)
    spec = inp.spec
    known = [queue.name for queue in queues_in(session)]
    if spec.queue not in known:  # deleted since (a schedule's runs name it still)
        if entry is not None:
            session.delete(entry)
        return QueueVerdict(refused=[queue_gone(spec.queue, known)], unknown_queue=True)
    entry = set_waiting(entry, inp)
    session.add(entry)
    session.flush()
    if not anyone_waits_in(session, besides=inp.job_id):
        # Nobody else waits: the pass over this job alone is what the loop would decide, so it is
        # decided here, in the same transaction, without a round trip to the loop.
        alone = _decided_alone(session, entry, spec, warm)
        if alone is not None:
            return alone
        run_pass_in(session, reservation=None, warm=warm)
        return _verdict(session, entry)
    return QueueVerdict()


def queue_gone(name: str, known: list[str]) -> str:
    """What a job whose queue does not exist when it enters it is told: most likely it was
    deleted since the job's schedule (or submit) named it."""
    return (
        f'queue "{name}" is gone (deleted since the job was scheduled or submitted, or never '
        f"applied); known: {', '.join(known)}"
    )


def decided_alone(queue: QueueSpec | None) -> bool:
    """Whether a pass over one job of this queue, nothing else waiting, admits it wherever it
    fits, whatever else runs: a queue without quota limit or cohort."""
    return queue is not None and queue.unlimited


def _decided_alone(
    session: Session, entry: QueueEntryRow, spec: JobSpec, warm: bool
) -> QueueVerdict | None:
    """What a pass over one waiting job of a queue without quota limit or cohort decides,
    found without reading the running jobs a full pass counts quotas, preemptions and
    reservations with: admitted on the first of its options that fits, whatever else runs;
    or, when none fits, it may not wait and nothing of its queue could be preempted for it,
    refused with the per-host reasons. None when the full pass must decide."""
    queues = queues_in(session)
    queue = next((q for q in queues if q.name == entry.queue), None)
    if queue is None:
        return None
    if not decided_alone(queue):
        return _admitted_within_quota(session, entry, spec, queues) if warm else None
    snapshot = snapshot_in(session, warm)
    tries: list[tuple[JobSpec, Placement | Unschedulable]] = []
    for option in spec.resource_options():
        found = place(option, snapshot)
        if isinstance(found, Placement):
            admit_placement_in(session, entry, found, datetime.now(UTC))
            return QueueVerdict(placement=found)
        tries.append((option, found))
    if entry.may_wait or victims_possible(session, entry.queue, entry.priority):
        return None
    reasons = no_fit_lines(tries)
    refuse_in(session, entry, NO_CAPACITY, reasons)
    return QueueVerdict(refused=reasons)


def _admitted_within_quota(
    session: Session, entry: QueueEntryRow, spec: JobSpec, queues: list[QueueSpec]
) -> QueueVerdict | None:
    """What a pass over one waiting job of a queue with a quota limit or a cohort decides when
    the first of its options that fits is within its queue's quota: admitted there (a pass
    takes a lone job's first fit when its quota allows it). None when the full pass must
    decide: nothing fits (preemption, a reservation, a refusal), or the quota holds it."""
    found = first_fit(spec.resource_options(), snapshot_in(session, warm=True))
    if found is None:
        return None
    quotas, counted_at = quotas_now(session, queues)
    if not quotas.allows(entry.queue, quotas.demand(entry.queue, found)):
        return None
    admit_placement_in(session, entry, found, datetime.now(UTC))
    admitted(session, queues, counted_at, entry.queue, found)
    return QueueVerdict(placement=found)


def victims_possible(session: Session, queue: str, priority: int) -> bool:
    """Whether a running job could be preempted for a job of this queue and priority: one of
    its queue, preemptible, of a lower priority, or a preemptible one of another queue (which
    the full pass preempts if that queue uses beyond its quota what nothing lends it)."""
    preemptible = select(QueueEntryRow.job_id).where(
        QueueEntryRow.state == ADMITTED,
        QueueEntryRow.preemptible == True,  # noqa: E712 (a column comparison)
    )
    own = and_(col(QueueEntryRow.queue) == queue, col(QueueEntryRow.priority) < priority)
    others = [q.name for q in queues_in(session) if q.name != queue and not q.unlimited]
    # by the queues' names, so the index's first column serves (a `!=` would read every entry)
    found = preemptible.where(or_(own, col(QueueEntryRow.queue).in_(others)) if others else own)
    return session.exec(found.limit(1)).first() is not None


def submitted_key(run_id: str) -> str:
    """The key of a job's `submitted` record: the same from its submit and its workflow."""
    return f"1:{JobStatus.PENDING.value}:{run_id}:submitted"


def enter_at_submit_in(
    session: Session, *, job_id: str, run_id: str, spec: JobSpec, at: datetime, warm: bool = True
) -> QueueVerdict:
    """A job just submitted enters its queue at once, before its workflow's first step, so no
    pass can miss it in between: its `submitted` record (the one its workflow writes, same key)
    and its entry (which its workflow's enqueue step then finds). A job with a row already was
    entered with it, by its workflow's first step or an earlier try of this submit: what became
    of the entry is the answer, and a job that ended meanwhile (its entry gone with its
    release) is not entered again."""
    if session.get(JobRow, job_id) is not None:
        return look_in(session, job_id=job_id, attempt=1) or QueueVerdict()
    return enter_new_in(session, job_id=job_id, run_id=run_id, spec=spec, at=at, warm=warm)


def enter_new_in(
    session: Session, *, job_id: str, run_id: str, spec: JobSpec, at: datetime, warm: bool = True
) -> QueueVerdict:
    """`enter_at_submit_in` for a job not entered before (a group of submits writes their jobs'
    rows first, so that the fleets' mix counts them: services/group_entry.py)."""
    record_status_in(
        session,
        job_id=job_id,
        name=spec.name,
        spec=spec.model_dump(mode="json"),
        status=JobStatus.PENDING,
        event_key=submitted_key(run_id),
        attempt=1,
        message="submitted",
        at=at,
    )
    ask = EnqueueInput(job_id=job_id, attempt=1, spec=spec, submitted_at=at, may_wait=spec.may_wait)
    return enqueue_in(session, ask, warm=warm)


def withdraw_in(session: Session, *, job_id: str, attempt: int) -> QueueVerdict:
    """The job stops waiting (stopped, or its wait is over). An attempt already admitted keeps
    its entry and gets its placement back (the caller takes it or releases it); otherwise the
    entry is gone and the verdict says why it waited."""
    entry = session.get(QueueEntryRow, job_id)
    if entry is None or entry.attempt != attempt:
        return QueueVerdict()
    verdict = _verdict(session, entry)
    if verdict.placement is None:
        session.delete(entry)
    return verdict


def set_priority_in(session: Session, *, job_id: str, priority: int) -> bool:
    """The job's priority within its queue from now on: in its row's spec (what `ps` shows)
    and in its entry, waiting or admitted (the next pass orders it, and chooses whom to
    preempt, by that). Whether it has an entry."""
    row = session.get(JobRow, job_id)
    if row is not None and row.spec and row.spec.get("priority") != priority:
        row.spec = {**row.spec, "priority": priority}  # a new value: the JSON column is written
        session.add(row)
    entry = session.get(QueueEntryRow, job_id)
    if entry is None:
        return False
    entry.priority = priority
    if entry.spec:
        entry.spec = {**entry.spec, "priority": priority}
    session.add(entry)
    return True


def anyone_waits_in(session: Session, *, besides: str | None = None) -> bool:
    """Whether any job (but `besides`) waits in a queue. While none does, a job that enters is
    decided as it enters, on what is free then, and capacity freed needs no pass."""
    found = select(QueueEntryRow.job_id).where(QueueEntryRow.state == WAITING)
    if besides is not None:
        found = found.where(QueueEntryRow.job_id != besides)
    return session.exec(found.limit(1)).first() is not None


def leave_queue_in(session: Session, *, job_id: str, attempt: int | None = None) -> bool:
    """The job released its capacity (or ended): its entry (of that attempt, when given) is
    gone. Whether there was one."""
    where = [_ENTRIES.job_id == job_id]
    if attempt is not None:
        where.append(_ENTRIES.attempt == attempt)
    return bool(_leave(session, where))


def leave_queues_in(session: Session, job_ids: Sequence[str]) -> set[str]:
    """`leave_queue_in` for several jobs with one DELETE: those that had an entry."""
    return _leave(session, [_ENTRIES.job_id.in_(list(job_ids))])


def _leave(session: Session, where: list[ColumnElement[bool]]) -> set[str]:
    return {row[0] for row in delete_rows(session, QueueEntryRow, *where, returning=("job_id",))}
