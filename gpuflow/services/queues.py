"""Queues in the database: applied queue files, the built-in default queue, and what each queue
uses of its quota (`gpuflow queue list`).

Usage is counted as admission counts it (gpuflow/scheduler/quota.py): the GPUs held by the
allocations of the queue's admitted entries, per quota key (a GPU model, or ANY_MODEL for a
queue whose quota is a total), a shared GPU as its fraction.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from sqlalchemy import exists, func
from sqlalchemy import select as sa_select
from sqlmodel import Session, col, select

from gpuflow.errors import GpuflowError, NotFoundError, SpecError
from gpuflow.scheduler.model import NodePlacement, Placement
from gpuflow.scheduler.quota import EPSILON, Quotas, mixed_cohort
from gpuflow.specs.job import DEFAULT_QUEUE
from gpuflow.specs.queue import ANY_MODEL, MAX_QUOTA_GPUS, QueueSpec, queue_name, unknown_queue
from gpuflow.status import JobStatus
from gpuflow.store.db import Store
from gpuflow.store.tables import AllocationRow, GpuRow, JobRow, QueueEntryRow, QueueRow

WAITING = "waiting"
ADMITTED = "admitted"


Applied = Literal["created", "updated", "unchanged"]


def default_queue() -> QueueSpec:
    """The queue of jobs that name none, while no queue file named `default` is applied: no
    cohort, and a quota no fleet reaches."""
    return QueueSpec(name=DEFAULT_QUEUE, gpus=MAX_QUOTA_GPUS)


def queues_in(session: Session) -> list[QueueSpec]:
    """Every queue, by name: the applied ones, and the built-in default unless one named
    `default` was applied. One read of the queues table (admission calls it on every pass)."""
    rows = session.exec(select(QueueRow).order_by(col(QueueRow.name))).all()
    queues = [QueueSpec.model_validate(_as_counted(row.spec)) for row in rows]
    if all(queue.name != DEFAULT_QUEUE for queue in queues):
        queues.append(default_queue())
        queues.sort(key=lambda queue: queue.name)
    return queues


def _as_counted(spec: dict[str, Any]) -> dict[str, Any]:
    """A stored queue as admission counted it: one applied before a per-model quota could no
    longer name `*` counted its `*` alone, as a total (its models' quotas meant nothing)."""
    gpus = spec.get("gpus")
    if isinstance(gpus, dict) and ANY_MODEL in gpus:
        return {**spec, "gpus": gpus[ANY_MODEL]}
    return spec


def queue_names(store: Store) -> list[str]:
    with store.read() as session:
        return [queue.name for queue in queues_in(session)]


def apply_queue(store: Store, spec: QueueSpec) -> Applied:
    """Create or update the queue, and say which (`unchanged`: it was so already, and nothing
    is written). Jobs already admitted keep running: a smaller quota is given back by
    admission (preempting borrowers), never here."""
    # The placement transaction: an admission pass reads queues and writes entries in one, so
    # it sees a queue either before or after this change, never half of it.
    with store.placement_transaction() as session:
        row = session.get(QueueRow, spec.name)
        dumped = spec.model_dump(mode="json", exclude_none=True)
        if row is not None and row.spec == dumped:
            return "unchanged"
        mixed = mixed_cohort(spec, queues_in(session))
        if mixed is not None:
            raise SpecError(mixed)
        # the default queue always exists (built in): a file named default updates it
        done: Applied = "created" if row is None and spec.name != DEFAULT_QUEUE else "updated"
        row = row or QueueRow(name=spec.name)
        row.spec = dumped
        row.updated_at = datetime.now(UTC)
        session.add(row)
    return done


def delete_queue(store: Store, name: str) -> None:
    """Delete an applied queue that holds no job. Deleting an applied `default` brings back
    the built-in one (jobs that name no queue always have one); the built-in one itself cannot
    be deleted. A name that no queue could have is a SpecError saying what a name is."""
    queue_name(name)
    with store.placement_transaction() as session:
        row = session.get(QueueRow, name)
        if row is None:
            if name == DEFAULT_QUEUE:
                raise GpuflowError(
                    "queue default is built in and cannot be deleted (apply a queue file named "
                    "default to change its quota)"
                )
            raise NotFoundError(unknown_queue(name, [queue.name for queue in queues_in(session)]))
        counts = _entry_counts(session, [name]).get(name, {})
        waiting, running = counts.get(WAITING, 0), counts.get(ADMITTED, 0)
        between = _between_attempts(session, [name]).get(name, 0)
        if (waiting or running or between) and name != DEFAULT_QUEUE:
            more = f", {between} between attempts" if between else ""
            raise GpuflowError(
                f"queue {name} still holds {waiting + running + between} job(s) ({waiting} "
                f"waiting, {running} running{more}); stop them or let them finish first"
            )
        session.delete(row)


def _between_attempts(session: Session, names: Sequence[str]) -> dict[str, int]:
    """Queue -> its jobs that have not ended and hold no entry: between two attempts (their
    next one enters the queue again), or submitted and not yet entered. A job that names no
    queue is the default queue's."""
    finals = [status.value for status in JobStatus if status.is_final]
    queue = func.coalesce(col(JobRow.spec)["queue"].as_string(), DEFAULT_QUEUE).label("queue")
    entered = exists().where(col(QueueEntryRow.job_id) == col(JobRow.id))
    query = (
        select(queue, func.count())
        .select_from(JobRow)
        .where(queue.in_(names))
        .where(col(JobRow.status).not_in(finals))
        .where(~entered)
        .group_by(queue)  # by its label: PostgreSQL sees the same expression
    )
    return {str(name): int(count) for name, count in session.exec(query).all()}


def _entry_counts(session: Session, names: Sequence[str]) -> dict[str, dict[str, int]]:
    """Queue -> entry state -> number of entries."""
    rows = session.exec(
        select(QueueEntryRow.queue, QueueEntryRow.state, func.count())
        .where(col(QueueEntryRow.queue).in_(names))
        .group_by(col(QueueEntryRow.queue), col(QueueEntryRow.state))
    ).all()
    counts: dict[str, dict[str, int]] = defaultdict(dict)
    for queue, state, count in rows:
        counts[queue][state] = count
    return counts


@dataclass(frozen=True)
class QueueUsage:
    """A queue and what it uses now. GPU amounts are per quota key: GPU model names, or
    ANY_MODEL (`*`) for a queue whose quota is a total; a key appears once it is non-zero."""

    spec: QueueSpec
    built_in: bool
    """The default queue, not applied from a file."""
    used: dict[str, float] = field(default_factory=dict)
    """GPUs held by the queue's admitted jobs."""
    borrowed: dict[str, float] = field(default_factory=dict)
    """The part of `used` beyond the queue's nominal quota that idle quota of its cohort
    covers."""
    lent: dict[str, float] = field(default_factory=dict)
    """The part of the queue's idle quota that covers its cohort's borrowing (`lent_shares`)."""
    over_quota: dict[str, float] = field(default_factory=dict)
    """The part of `used` beyond the queue's nominal quota that nothing covers now: a quota
    lowered (the queue's, or a lender's) under jobs that keep running. A job that needs the
    quota back preempts them if they are preemptible; otherwise it ends with them."""
    waiting: int = 0
    admitted: int = 0
    """Jobs admitted: starting or running."""
    between_attempts: int = 0
    """Jobs between two attempts (retrying), neither waiting nor running now."""


def admitted_placements(session: Session) -> list[tuple[str, Placement]]:
    """(queue, placement) of every admitted entry that holds an allocation."""
    rows = session.exec(
        select(QueueEntryRow.job_id, QueueEntryRow.queue, AllocationRow)
        .join(AllocationRow, col(AllocationRow.job_id) == col(QueueEntryRow.job_id))
        .where(QueueEntryRow.state == ADMITTED)
    ).all()
    nodes: dict[str, list[AllocationRow]] = defaultdict(list)
    queue_of: dict[str, str] = {}
    for job_id, queue, allocation in rows:
        nodes[job_id].append(allocation)
        queue_of[job_id] = queue
    return [
        (
            queue_of[job_id],
            Placement(
                fleet=held[0].fleet,
                nodes=[
                    NodePlacement.model_validate(row.node)
                    for row in sorted(held, key=lambda row: row.rank)
                ],
            ),
        )
        for job_id, held in sorted(nodes.items())
    ]


def uncovered(quotas: Quotas) -> dict[str, dict[str, float]]:
    """Queue -> quota key -> GPUs of its use beyond its nominal quota that no lending covers:
    all of it for a queue without a cohort; in a cohort whose queues borrow more than its
    queues lend now, the excess, shared among its borrowers in proportion to what each
    borrows."""
    over: dict[str, dict[str, float]] = defaultdict(dict)
    cohorts: dict[str, list[str]] = defaultdict(list)
    for name, spec in quotas.queues.items():
        if spec.cohort is None:
            beyond = {key: quotas.borrowed(name, key) for key in quotas.usage[name]}
            over[name] = {key: gpus for key, gpus in beyond.items() if gpus > EPSILON}
        else:
            cohorts[spec.cohort].append(name)
    for members in cohorts.values():
        for key in sorted({key for name in members for key in quotas.usage[name]}):
            borrowed = {name: quotas.borrowed(name, key) for name in members}
            total = sum(borrowed.values())
            excess = total - sum(quotas.lendable(name, key) for name in members)
            if excess <= EPSILON:
                continue
            for name, gpus in borrowed.items():
                if gpus > EPSILON:
                    over[name][key] = gpus * min(1.0, excess / total)
    return over


def lent_shares(quotas: Quotas) -> dict[str, dict[str, float]]:
    """Queue -> quota key -> GPUs of its idle quota that its cohort borrows now.

    The cohort's borrowing of a key (the sum of its queues' use beyond their nominal quota) is
    covered by the idle quota its queues lend (`Quotas.lendable`: idle, within
    `lending_limit`). No row says which lender covers which borrower, so each lender is counted
    in proportion to what it lends, and never beyond that: the shares add up to the borrowing
    whenever the cohort's lending covers it (admission keeps it so, except while an owner takes
    its quota back and the borrowers are being preempted)."""
    lent: dict[str, dict[str, float]] = defaultdict(dict)
    cohorts: dict[str, list[str]] = defaultdict(list)
    for name, spec in quotas.queues.items():
        if spec.cohort is not None:
            cohorts[spec.cohort].append(name)
    for members in cohorts.values():
        keys = {key for name in members for key in (*quotas.usage[name], *quotas.queue(name).quota)}
        for key in sorted(keys):
            borrowed = sum(quotas.borrowed(name, key) for name in members)
            lendable = {name: quotas.lendable(name, key) for name in members}
            offered = sum(lendable.values())
            if borrowed <= EPSILON or offered <= EPSILON:
                continue
            for name, gpus in lendable.items():
                share = min(gpus, borrowed * gpus / offered)
                if share > EPSILON:
                    lent[name][key] = share
    return lent


def queue_usage(session: Session) -> list[QueueUsage]:
    """Every queue (by name) with its usage, borrowing, lending and entries."""
    queues = queues_in(session)
    applied = set(session.exec(select(QueueRow.name)).all())
    quotas = Quotas.holding(queues, admitted_placements(session))  # a deleted queue's: none
    lent, over = lent_shares(quotas), uncovered(quotas)
    names = [queue.name for queue in queues]
    counts, between = _entry_counts(session, names), _between_attempts(session, names)
    out = []
    for queue in queues:
        name = queue.name
        used = {key: gpus for key, gpus in quotas.usage[name].items() if gpus > EPSILON}
        mine = over.get(name, {})
        borrowed = {key: quotas.borrowed(name, key) - mine.get(key, 0.0) for key in used}
        out.append(
            QueueUsage(
                spec=queue,
                built_in=name not in applied,
                used=used,
                borrowed={key: gpus for key, gpus in borrowed.items() if gpus > EPSILON},
                lent=dict(lent.get(name, {})),
                over_quota=dict(mine),
                waiting=counts.get(name, {}).get(WAITING, 0),
                admitted=counts.get(name, {}).get(ADMITTED, 0),
                between_attempts=between.get(name, 0),
            )
        )
    return out


def list_queues(store: Store) -> list[QueueUsage]:
    with store.read() as session:
        return queue_usage(session)


@dataclass(frozen=True)
class WaitingPlace:
    """Where a waiting job stands, as the last admission pass left it."""

    queue: str
    position: int | None
    """Its place in that pass's order, 1 first; None before a pass has looked at it."""
    reason: str | None
    """no_capacity, quota, reserved_for:<job id>, quota_held_for:<job id>,
    preempting:<job ids>; None before a pass."""
    reserved_hosts: tuple[str, ...] = ()
    """The hosts reserved for it, when it holds the backfill reservation."""
    reserved_start: datetime | None = None
    """When it can start at the latest, if known (QueueEntryRow.reserved_start)."""


_PLACE = (
    QueueEntryRow.job_id,
    QueueEntryRow.queue,
    QueueEntryRow.position,
    QueueEntryRow.reason,
    QueueEntryRow.reserved_hosts,
    QueueEntryRow.reserved_start,
)


def waiting_places(session: Session, job_ids: Iterable[str]) -> dict[str, WaitingPlace]:
    """Job id -> its place, for those of `job_ids` that wait in a queue."""
    ids = list(job_ids)
    if not ids:
        return {}
    # Not the entry's spec: a waiting job's spec may be large, and ps needs none of it.
    query = sa_select(*(col(column) for column in _PLACE)).where(
        col(QueueEntryRow.job_id).in_(ids), col(QueueEntryRow.state) == WAITING
    )
    entries = session.connection().execute(query).all()
    return {
        job_id: WaitingPlace(
            queue=queue,
            position=None if position is None else position + 1,
            reason=reason,
            reserved_hosts=tuple(hosts.split(",")) if hosts else (),
            reserved_start=None if start is None else start.replace(tzinfo=start.tzinfo or UTC),
        )
        for job_id, queue, position, reason, hosts, start in (tuple(row) for row in entries)
    }


def unknown_models(store: Store, spec: QueueSpec) -> list[str]:
    """A warning for a per-model quota naming GPU models no fleet has (a typo, or a fleet to
    come): jobs can use that quota only once a fleet has them."""
    with store.read() as session:
        have = {name.upper() for name in session.exec(select(GpuRow.name).distinct())}
    unknown = [model for model in spec.quota if model != ANY_MODEL and model not in have]
    if not unknown:
        return []
    known = ", ".join(sorted(have)) or "no GPUs yet"
    return [
        f"queue {spec.name}: no fleet has GPU model {', '.join(unknown)} (fleets have: {known}); "
        "its quota for it is used only once one does"
    ]
