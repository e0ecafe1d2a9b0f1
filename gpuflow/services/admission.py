"""The admission pass over the store (entries: services/queue_entries.py): the pass that
decides (scheduler/admission.py) and commits, in one placement transaction, which waiting jobs
start where and which running jobs are preempted for them (DESIGN.md, "Queues and admission").

Every function runs inside the caller's `placement_transaction`, so a pass never overlaps a
placement, a release or another pass, whichever control worker runs it. All are idempotent:
asking again for the same (job, attempt) returns what became of it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cache, partial
from typing import Any

from sqlalchemy import Row, update
from sqlalchemy import select as sa_select
from sqlalchemy.orm import defer
from sqlmodel import Session, col, select

from gpuflow.naming import RECORDED
from gpuflow.scheduler import place
from gpuflow.scheduler.admission import QUOTA_HELD_FOR, Decision, Held, Running, Waiting, admit
from gpuflow.scheduler.model import Snapshot
from gpuflow.scheduler.quota import Quotas, never_admitted, quota_allows_some, quota_wait
from gpuflow.scheduler.reservation import Reservation
from gpuflow.services.capacity import JOBS_PER_READ
from gpuflow.services.queues import queues_in
from gpuflow.services.running import admitted_rows, counted_queue, running_of, waiting_of
from gpuflow.services.snapshot import columns, read_snapshot
from gpuflow.services.verdicts import (
    PREEMPTING,
    WAITING,
    admit_placement_in,
    mark_reserved,
    no_fit_lines,
    refuse_in,
    say_waiting,
    set_values,
)
from gpuflow.services.warm import WarmCapacity, warm_capacity
from gpuflow.specs.job import DEFAULT_QUEUE, JobSpec
from gpuflow.specs.queue import QueueSpec
from gpuflow.store.tables import QueueEntryRow
from gpuflow.workflows.queue_models import (
    AdmittedJob,
    PreemptedJob,
    RefusedJob,
    ReservationState,
)

__all__ = ["PassOutcome", "SpecCache", "run_pass_in", "snapshot_in"]


@dataclass
class PassOutcome:
    admitted: list[AdmittedJob] = field(default_factory=list)
    preempted: list[PreemptedJob] = field(default_factory=list)
    refused: list[RefusedJob] = field(default_factory=list)
    held: list[RefusedJob] = field(default_factory=list)
    """Jobs newly left waiting (or for a new reason), with why in words."""
    reservation: ReservationState | None = None
    waiting: int = 0
    more: bool = False
    """The pass left admissions or words for a next pass (see NODES_ADMITTED_PER_PASS)."""


NODES_ADMITTED_PER_PASS = 1_000
"""Nodes a pass admits at most (the first admissions of its order; one at least), and
TOLD_PER_PASS the jobs it words a refusal or a wait for, each in at most TOLD_LINES lines: the
pass's result is one Temporal payload (2 MiB at most; some 350 bytes a node, 80 a line). A
pass that leaves some for the next says so (`more`), and the loop passes again at once. Before,
a burst of 884 jobs newly waiting on openb's 1,213 hosts made a result of 1.27 MB (14,007
lines), and 88 on 800 of its hosts (a line per host) 3.69 MB, past 2 MiB, where the loop's
workflow task cannot complete and nothing is admitted any more (benchmarks/admission_scale.py
reports the largest result)."""
TOLD_PER_PASS = 500
TOLD_LINES = 10


def told(reasons: list[str]) -> list[str]:
    """A job's reasons as a pass tells them: the first TOLD_LINES, the last counting the rest.
    The job's queue entry keeps them all, and so does a waiting job's row; a refused job ends
    with the message it was told (`gpuflow offers` says why for every option, by reason)."""
    if len(reasons) <= TOLD_LINES:
        return reasons
    rest = len(reasons) - TOLD_LINES + 1
    return [*reasons[: TOLD_LINES - 1], f"... and {rest:,} more lines"]


SpecCache = dict[tuple[str, int], tuple[JobSpec, tuple[JobSpec, ...]]]


def run_pass_in(
    session: Session,
    *,
    reservation: ReservationState | None,
    now: datetime | None = None,
    specs: SpecCache | None = None,
    warm: bool = True,
    pass_id: str | None = None,
) -> PassOutcome:
    """One admission pass: decide on every waiting job and commit the decision; the entries it
    admits or refuses record `pass_id` (see QueueEntryRow.decided_by)."""
    now = now or datetime.now(UTC)
    specs = {} if specs is None else specs
    waiting_rows, worded, admitted = _read_entries(session)
    outcome = PassOutcome()
    if not waiting_rows:
        return outcome
    queues = queues_in(session)
    known = {queue.name for queue in queues}
    for entry in waiting_rows:
        if entry.queue not in known:  # deleted while the job was on its way in: the default
            entry.queue = counted_queue(entry.queue, known)
    snapshot, state = _snapshot(session, warm)
    running = _running_jobs(session, admitted, known)
    by_id = {entry.job_id: entry for entry in waiting_rows}
    for key in [key for key in specs if key[0] not in by_id]:
        del specs[key]  # admitted, refused or gone: not parsed again
    _parse_specs(session, waiting_rows, specs)
    waiting = [_waiting(entry, specs) for entry in waiting_rows]
    held_before = None
    if reservation is not None and reservation.job in by_id:
        held_before = Reservation(
            reservation.job, reservation.starts_at, frozenset(reservation.hosts)
        )
    decision = admit(
        queues=queues,
        running=running,
        waiting=waiting,
        snapshot=snapshot,
        now=now.timestamp(),
        reserved=held_before,
    )
    attempts = {row.job_id: row.attempt for row in admitted}
    attempts.update((entry.job_id, entry.attempt) for entry in waiting_rows)
    _commit(session, decision, by_id, attempts, now, outcome)
    live = {job.name for job in running}
    _hold(
        session,
        decision.waiting,
        by_id,
        (worded, live),
        (snapshot, queues, cache(partial(_used, queues, decision, running))),
        outcome,
    )
    for job_id in [job.job_id for job in outcome.admitted] + [
        job.job_id for job in outcome.refused
    ]:
        by_id[job_id].decided_by = pass_id
    _resync(session, state, decision, running)
    mark_reserved(session, decision.reservation)
    if decision.reservation is not None:
        outcome.reservation = ReservationState(
            job=decision.reservation.job,
            starts_at=decision.reservation.starts_at,
            hosts=sorted(decision.reservation.hosts),
        )
    return outcome


def _used(queues: list[QueueSpec], decision: Decision, running: list[Running]) -> Quotas:
    """What each queue uses once the pass's decision is done: its running jobs but those
    preempted, and those it admitted."""
    victims = {victim for admitted in decision.admitted for victim in admitted.victims}
    kept = [(job.queue, job.placement) for job in running if job.name not in victims]
    return Quotas.holding(queues, [*kept, *((a.job.queue, a.placement) for a in decision.admitted)])


_UNREAD = [defer(QueueEntryRow.spec), defer(QueueEntryRow.detail)]  # type: ignore[arg-type]
"""Waiting entries' columns a pass does not read: the spec (parsed once per attempt,
`_parse_specs`) and the reasons in words (one line per host: tens of KB an entry)."""


def _read_entries(
    session: Session,
) -> tuple[list[QueueEntryRow], set[str], Sequence[Row[Any]]]:
    """The waiting entries, which the pass updates (`_UNREAD` left out), the ids of those whose
    reasons are in words already, and the admitted entries as plain columns (every pass reads
    them all, and never writes them), each in submission order."""
    order = (col(QueueEntryRow.submitted_at), col(QueueEntryRow.job_id))
    waiting = (
        select(QueueEntryRow, col(QueueEntryRow.detail).is_not(None))
        .where(QueueEntryRow.state == WAITING)
        .options(*_UNREAD)
        .order_by(*order)
    )
    rows = session.exec(waiting).all()  # flushes what this transaction wrote before
    worded = {entry.job_id for entry, has_detail in rows if has_detail}
    return [entry for entry, _ in rows], worded, admitted_rows(session)


def _parse_specs(session: Session, entries: list[QueueEntryRow], specs: SpecCache) -> None:
    """Parse the specs of the waiting attempts not parsed before, read in one query."""
    new = {e.job_id: e.attempt for e in entries if (e.job_id, e.attempt) not in specs}
    if not new:
        return
    job_ids = sorted(new)
    for start in range(0, len(job_ids), JOBS_PER_READ):
        some = col(QueueEntryRow.job_id).in_(job_ids[start : start + JOBS_PER_READ])
        query = sa_select(*columns(QueueEntryRow, "job_id attempt spec")).where(some)
        for job_id, attempt, raw in session.connection().execute(query):
            if new[job_id] == attempt:
                spec = JobSpec.model_validate(raw, context=RECORDED)
                specs[job_id, attempt] = (spec, tuple(spec.resource_options()))


def snapshot_in(session: Session, warm: bool = True) -> Snapshot:
    """The fleets as this placement transaction sees them: the warm state (a fresh read when
    the warm state cannot say, or with `warm=False`)."""
    return _snapshot(session, warm)[0]


def _snapshot(session: Session, warm: bool) -> tuple[Snapshot, WarmCapacity | None]:
    """The fleets as this transaction sees them: the warm state's own snapshot, which the pass
    changes as it decides (see `_resync`), or a fresh read."""
    if warm:
        state = warm_capacity(session)
        caught_up = state.current(session)
        if caught_up is not None:
            return caught_up, state
        versions = state.hold(session)
        if versions is not None:
            return state.catch_up(session, versions), state
    return read_snapshot(session), None


def _resync(
    session: Session, state: WarmCapacity | None, decision: Decision, running: list[Running]
) -> None:
    """Give the warm snapshot back the database's usage on every host the pass changed in
    memory: a committed admission is there already (its allocation rows), a preemptor and its
    victims are not (their allocations change only when the victims release)."""
    if state is None:
        return
    hosts = {node.host_id for a in decision.admitted for node in a.placement.nodes}
    victims = {p.victim for p in decision.preemptions}
    hosts |= {n.host_id for r in running if r.name in victims for n in r.placement.nodes}
    if hosts:
        state.resync(session, sorted(hosts))


def _running_jobs(
    session: Session, admitted: Sequence[Row[Any]], queues: set[str]
) -> list[Running]:
    """`running_of`, with the entries of a queue deleted meanwhile recorded in the default
    queue, as they are counted."""
    lost = [row.job_id for row in admitted if row.queue not in queues]
    if lost:
        moved = update(QueueEntryRow).where(col(QueueEntryRow.job_id).in_(lost))
        session.execute(moved.values(queue=DEFAULT_QUEUE))
    return running_of(session, admitted, queues)


def _waiting(entry: QueueEntryRow, specs: SpecCache) -> Waiting:
    key = (entry.job_id, entry.attempt)
    cached = specs.get(key)
    if cached is None:
        spec = JobSpec.model_validate(entry.spec, context=RECORDED)
        cached = (spec, tuple(spec.resource_options()))
        specs[key] = cached
    spec, options = cached
    return waiting_of(entry, spec, options, entry.queue)


def _commit(
    session: Session,
    decision: Decision,
    by_id: dict[str, QueueEntryRow],
    attempts: dict[str, int],
    now: datetime,
    outcome: PassOutcome,
) -> None:
    """Admitted jobs take their allocation now; one that preempts waits for its victims to
    release theirs (the next pass admits it), so no GPU is ever held twice."""
    nodes = 0
    for admitted in decision.admitted:
        nodes += len(admitted.placement.nodes)
        if nodes > NODES_ADMITTED_PER_PASS and (outcome.admitted or outcome.preempted):
            outcome.more = True  # the rest waits for the next pass, which decides again
            break
        entry = by_id[admitted.job.name]
        if admitted.victims:
            # first of its queue: it starts as soon as its victims have released (ps: #1)
            reason = PREEMPTING + ",".join(admitted.victims)
            set_values(entry, position=0, reason=reason, detail=None)
            session.add(entry)
            outcome.preempted.extend(
                PreemptedJob(job_id=victim, attempt=attempts[victim], for_job=entry.job_id)
                for victim in admitted.victims
                if victim in attempts
            )
            continue
        admit_placement_in(session, entry, admitted.placement, now)
        outcome.admitted.append(
            AdmittedJob(job_id=entry.job_id, attempt=entry.attempt, placement=admitted.placement)
        )


def _hold(
    session: Session,
    held: list[Held],
    by_id: dict[str, QueueEntryRow],
    known: tuple[set[str], set[str]],
    fleet: tuple[Snapshot, list[QueueSpec], Callable[[], Quotas]],
    outcome: PassOutcome,
) -> None:
    """Jobs left waiting learn their position and why; one that may not wait is refused, with
    the per-host reasons of the fleet as the pass leaves it. `known`: the jobs whose reasons
    are in words already, and the running jobs."""
    worded, live = known
    places: dict[str, int] = {}
    for item in held:
        entry = by_id[item.job.name]
        position = places.setdefault(entry.queue, 0)  # its place among its queue's waiting
        places[entry.queue] = position + 1
        item = Held(item.job, item.reason, position)
        if _claim_stands(entry.reason, live):
            # Its victims are stopping: it keeps its claim, and a job that may not wait is not
            # refused for the room they still hold (it was stopped for it).
            outcome.waiting += 1
            continue
        if entry.may_wait:
            outcome.waiting += 1
            if entry.reason != item.reason or entry.job_id not in worded:
                # Newly held, or held for another reason: say why in words, once.
                if _told_enough(outcome):
                    continue
                reasons = _reasons(item, *fleet)
                set_values(
                    entry, position=item.position, reason=item.reason, detail="\n".join(reasons)
                )
                say_waiting(session, entry.job_id, reasons)
                outcome.held.append(
                    RefusedJob(job_id=entry.job_id, attempt=entry.attempt, reasons=told(reasons))
                )
                session.add(entry)
            elif position == 0:  # the next of its queue: its words follow the fleet's changes
                reasons = _reasons(item, *fleet)
                if say_waiting(session, entry.job_id, reasons):
                    set_values(entry, position=0, detail="\n".join(reasons))
                    session.add(entry)
                elif entry.position != 0:
                    entry.position = 0
                    session.add(entry)
            elif entry.position != item.position:
                entry.position = item.position
                session.add(entry)
            continue
        if _told_enough(outcome):
            continue
        reasons = _reasons(item, *fleet)
        refuse_in(session, entry, item.reason, reasons)
        outcome.refused.append(
            RefusedJob(job_id=entry.job_id, attempt=entry.attempt, reasons=told(reasons))
        )


def _claim_stands(reason: str | None, live: set[str]) -> bool:
    """A preemptor keeps its claim (and says so) while a job stopped for it still holds
    capacity; once they have all released and it still waits, it waits as any job does."""
    if not reason or not reason.startswith(PREEMPTING):
        return False
    return not live.isdisjoint(reason.removeprefix(PREEMPTING).split(","))


def _told_enough(outcome: PassOutcome) -> bool:
    """Whether the pass has worded TOLD_PER_PASS jobs already (the rest: the next pass)."""
    if len(outcome.held) + len(outcome.refused) < TOLD_PER_PASS:
        return False
    outcome.more = True
    return True


def _reasons(
    item: Held, snapshot: Snapshot, queues: list[QueueSpec], used: Callable[[], Quotas]
) -> list[str]:
    """Why the job cannot start now, in words: per host for a job nothing fits, after its
    queue's quota when that would hold it too once a host frees. `used`: what the queues use
    once the pass's decision is done (counted when first asked)."""
    reason = item.reason
    if reason.startswith("reserved_for:"):
        return [f"the capacity it needs is reserved for {reason.split(':', 1)[1]}"]
    if reason.startswith(QUOTA_HELD_FOR):
        head = reason.removeprefix(QUOTA_HELD_FOR)
        return [
            f"queue {item.job.queue}'s quota it needs is held for {head}, before it in "
            "line and waiting for quota"
        ]
    if reason == "quota":
        never = never_admitted(queues, item.job.queue, item.job.job)
        if never is None:
            return [quota_wait(used(), item.job.queue, item.job.job)]
        waits = "; it waits until a queue's quota changes (gpuflow queue apply)"
        return [never + (waits if item.job.may_wait else "")]
    options = item.job.options or (item.job.job,)
    lines = no_fit_lines([(option, place(option, snapshot)) for option in options])
    queue = item.job.queue
    if any(q.name == queue and q.unlimited for q in queues):
        return lines
    quotas = used()
    if quota_allows_some(quotas, queue, item.job.job):
        return lines
    return [quota_wait(quotas, queue, item.job.job), *lines]
