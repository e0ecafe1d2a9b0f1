"""Taking and releasing capacity. Each is one transaction keyed by (job, attempt), so an activity
that runs twice changes nothing the second time, and placement passes never overlap."""

from __future__ import annotations

import threading
import weakref
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, and_, bindparam, or_
from sqlalchemy import select as sa_select
from sqlmodel import Session, col, select

from gpuflow.scheduler import place
from gpuflow.scheduler.model import NodePlacement, Placement, Snapshot, Unschedulable
from gpuflow.services.changes import bump_hosts
from gpuflow.services.snapshot import columns as _columns
from gpuflow.services.snapshot import read_snapshot, use_of
from gpuflow.services.warm import WarmCapacity, warm_capacity
from gpuflow.specs.job import JobSpec
from gpuflow.status import JobStatus
from gpuflow.store.bulk import delete_rows, flush_pending
from gpuflow.store.db import Store
from gpuflow.store.tables import AllocationRow, JobRow

__all__ = ["read_snapshot", "release_allocation", "take_allocation"]

_VERIFY_TRIES = 3


_ALLOCATIONS = AllocationRow.__table__.c  # type: ignore[attr-defined]
_HELD_QUERY = (
    sa_select(_ALLOCATIONS.fleet, _ALLOCATIONS.node, _ALLOCATIONS.score, _ALLOCATIONS.scorer)
    .where(_ALLOCATIONS.job_id == bindparam("job_id"), _ALLOCATIONS.attempt == bindparam("attempt"))
    .order_by(_ALLOCATIONS.rank)
)


def held_allocation(session: Session, job_id: str, attempt: int) -> Placement | None:
    """The placement the job's attempt holds, as it was placed; None when it holds none. Read
    as columns by one prepared statement: every job's first step and every repeated placement
    asks."""
    flush_pending(session)  # what the session holds but has not written counts
    found = session.connection().execute(_HELD_QUERY, {"job_id": job_id, "attempt": attempt})
    return placement_of(found.all())


def placement_of(rows: Sequence[Sequence[Any]]) -> Placement | None:
    """A placement from its allocation rows' (fleet, node, score, scorer), in rank order."""
    if not rows:
        return None
    fleet, _, score, scorer = rows[0]
    nodes = [NodePlacement.model_validate(row[1]) for row in rows]
    return Placement(fleet=fleet, nodes=nodes, score=score, scorer=scorer)


def take_allocation(
    store: Store,
    *,
    job_id: str,
    attempt: int,
    job: JobSpec,
    fleets: list[str] | None = None,
    warm: bool = True,
) -> Placement | Unschedulable:
    """Place the job and record the allocation in one serialized transaction.

    Repeating the call for the same (job, attempt) returns the allocation already taken.
    `warm=False` reads the whole fleet instead of the warm state (benchmarks, checks).
    """
    with store.placement_transaction() as session:
        return take_allocation_in(
            session, job_id=job_id, attempt=attempt, job=job, fleets=fleets, warm=warm
        )


def take_allocation_in(
    session: Session,
    *,
    job_id: str,
    attempt: int,
    job: JobSpec,
    fleets: list[str] | None = None,
    warm: bool = True,
) -> Placement | Unschedulable:
    """`take_allocation` inside the caller's `placement_transaction`."""
    held = held_allocation(session, job_id, attempt)
    if held is not None:
        return held
    state = warm_capacity(session)
    versions = state.hold(session)
    snapshot: Snapshot | None = None
    if warm and versions is not None:
        snapshot = state.catch_up(session, versions)
    elif versions is not None:
        state.track(versions)
    # An earlier attempt's allocation is never carried over: give it back first.
    _release(session, state, _ALLOCATIONS.job_id == job_id)
    if snapshot is not None and not set(fleets or []) <= {f.name for f in snapshot.fleets}:
        snapshot = None  # a fleet it does not know: let the cold read word the refusal
    result: Placement | Unschedulable | None = None
    for _ in range(_VERIFY_TRIES if snapshot is not None else 0):
        assert snapshot is not None
        result = place(job, snapshot, fleets=fleets)
        if isinstance(result, Unschedulable):
            break
        if state.verify(session, [node.host_id for node in result.nodes]):
            break
        result = None  # a write that was not counted: place again on what the database says
    if result is None:
        result = place(job, read_snapshot(session, fleets=fleets), fleets=fleets)
    if isinstance(result, Unschedulable):
        return result
    rows = allocation_rows(job_id, attempt, result)
    session.add_all(rows)
    session.flush()  # the rows' ids: the order their usage adds up in
    for row in rows:
        state.taken(row.host_id, use_of(row))
    state.counted(bump_hosts(session, "allocations", (row.host_id for row in rows)))
    return result


def _release(session: Session, state: WarmCapacity, *where: ColumnElement[bool]) -> list[str]:
    """Delete the allocation rows that match, keeping the warm state in step: one DELETE that
    returns what it deleted (each release runs under the placement lock, so no rows are loaded
    as objects to be deleted one by one). The job of each row deleted."""
    rows = delete_rows(session, AllocationRow, *where, returning=("id", "host_id", "job_id"))
    for allocation_id, host_id, _ in rows:
        state.released(host_id, allocation_id)
    if rows:
        state.counted(bump_hosts(session, "allocations", (row[1] for row in rows)))
    return [row[2] for row in rows]


def release_allocation(store: Store, *, job_id: str) -> int:
    """Give back everything the job holds. Returns how many nodes were released (0 the 2nd time)."""
    with store.placement_transaction() as session:
        return release_allocation_in(session, job_id=job_id)


def release_allocation_in(session: Session, *, job_id: str) -> int:
    """`release_allocation` inside the caller's `placement_transaction`."""
    return release_allocations_in(session, [job_id])[job_id]


def release_allocations_in(session: Session, job_ids: Sequence[str]) -> Counter[str]:
    """`release_allocation_in` for several jobs, with one DELETE and one count of the change:
    how many nodes each job released."""
    state = warm_capacity(session)
    versions = state.hold(session)
    if versions is not None:
        state.track(versions)
    released = Counter(_release(session, state, _ALLOCATIONS.job_id.in_(list(job_ids))))
    return Counter({job_id: released[job_id] for job_id in job_ids})


def allocations_of(store: Store, job_id: str) -> list[AllocationRow]:
    with store.read() as session:
        return list(session.exec(select(AllocationRow).where(AllocationRow.job_id == job_id)))


def release_attempt_in(session: Session, *, job_id: str, attempt: int) -> int:
    """Give back what one attempt of the job holds, inside the caller's `placement_transaction`
    (a later attempt's allocation is left alone). Returns how many nodes were released."""
    state = warm_capacity(session)
    versions = state.hold(session)
    if versions is not None:
        state.track(versions)
    return len(
        _release(session, state, _ALLOCATIONS.job_id == job_id, _ALLOCATIONS.attempt == attempt)
    )


@dataclass(frozen=True)
class HeldNode:
    rank: int
    host_name: str
    task_queue: str


@dataclass(frozen=True)
class HeldAttempt:
    """One attempt of a job that holds capacity in a fleet, beside what the job's row says."""

    job_id: str
    attempt: int
    nodes: list[HeldNode] = field(default_factory=list)
    job_status: JobStatus | None = None
    """None when the job has no row."""
    job_attempt: int | None = None

    @property
    def ended(self) -> bool:
        """The job's row says this attempt is over: its status is final and no later attempt
        began (a retrying job's row may still read final while its next attempt runs)."""
        return (
            self.job_status is not None
            and self.job_status.is_final
            and self.job_attempt is not None
            and self.job_attempt >= self.attempt
        )


HeldKey = tuple[str, int]
"""(job id, attempt): where a page of held attempts ends."""


def held_attempts(
    store: Store, *, fleet: str, limit: int = 2000, after: HeldKey | None = None
) -> list[HeldAttempt]:
    """The (job, attempt)s holding capacity in the fleet after `after` (job id, then attempt
    order), with their nodes and the job's recorded status: what reconciliation checks. At
    most `limit` allocation rows, and only whole attempts: an attempt whose rows a full page
    cut is left for the next (`held_page`)."""
    return held_page(store, fleet=fleet, limit=limit, after=after)[0]


def held_page(
    store: Store, *, fleet: str, limit: int = 2000, after: HeldKey | None = None
) -> tuple[list[HeldAttempt], HeldKey | None]:
    """`held_attempts`, and the key the next page starts after (None: this was the last)."""
    with store.read() as session:
        query = sa_select(*_columns(AllocationRow, "job_id attempt rank node")).where(
            col(AllocationRow.fleet) == fleet
        )
        if after is not None:
            job_id, attempt = col(AllocationRow.job_id), col(AllocationRow.attempt)
            query = query.where(
                or_(job_id > after[0], and_(job_id == after[0], attempt > after[1]))
            )
        query = query.order_by(col(AllocationRow.job_id), col(AllocationRow.attempt))
        rows = session.connection().execute(query.limit(limit)).all()
        nodes: dict[tuple[str, int], list[HeldNode]] = {}
        for job_id, attempt, rank, node in rows:
            nodes.setdefault((job_id, attempt), []).append(
                HeldNode(
                    rank=rank,
                    host_name=str(node.get("host_name", "")),
                    task_queue=str(node.get("task_queue", "")),
                )
            )
        following: HeldKey | None = None
        if len(rows) >= limit:  # the last attempt may go on past the page: the next reads it
            last = (rows[-1][0], rows[-1][1])
            if len(nodes) > 1:
                del nodes[last]
            following = list(nodes)[-1]  # the database's order, which its collation decides
        job_ids = sorted({job_id for job_id, _ in nodes})
        recorded = sa_select(*_columns(JobRow, "id status attempt")).where(
            col(JobRow.id).in_(job_ids)
        )
        jobs = {
            job_id: (JobStatus(status), attempt)
            for job_id, status, attempt in session.connection().execute(recorded).all()
        }
    attempts = [
        HeldAttempt(
            job_id=job_id,
            attempt=attempt,
            nodes=sorted(held, key=lambda n: n.rank),
            job_status=jobs[job_id][0] if job_id in jobs else None,
            job_attempt=jobs[job_id][1] if job_id in jobs else None,
        )
        for (job_id, attempt), held in nodes.items()
    ]
    return attempts, following


def commit_placement_in(
    session: Session, *, job_id: str, attempt: int, placement: Placement
) -> None:
    """Record a placement decided elsewhere in this `placement_transaction` (the admission
    pass decides on its own copy of the fleets): the allocation rows, the warm state and the
    change counter, as `take_allocation_in` does for the placement it decides."""
    state = warm_capacity(session)
    versions = state.hold(session)
    if versions is not None:
        state.track(versions)
    rows = allocation_rows(job_id, attempt, placement)
    session.add_all(rows)
    session.flush()
    for row in rows:
        state.taken(row.host_id, use_of(row))
    state.counted(bump_hosts(session, "allocations", (row.host_id for row in rows)))


def allocation_rows(job_id: str, attempt: int, placement: Placement) -> list[AllocationRow]:
    """What the job's attempt holds on each of its nodes, as rows."""
    return [AllocationRow(**values) for values in allocation_values(job_id, attempt, placement)]


def allocation_values(job_id: str, attempt: int, placement: Placement) -> list[dict[str, Any]]:
    """`allocation_rows` as column values (for `store.bulk.insert_rows`)."""
    return [
        {
            "job_id": job_id,
            "attempt": attempt,
            "rank": node.rank,
            "fleet": placement.fleet,
            "host_id": node.host_id,
            "gpu_indices": list(node.gpu_indices),
            "gpu_fraction": node.gpu_fraction,
            "blocks": list(node.blocks),
            "cpus": node.cpus,
            "memory_mib": node.memory_mib,
            "disk_mib": node.disk_mib,
            "node": node.model_dump(mode="json"),
            "score": placement.score,
            "scorer": placement.scorer,
        }
        for node in placement.nodes
    ]


AdmissionKey = tuple[str, int, datetime | None]
"""An admitted queue entry: (job id, attempt, admitted_at). An attempt's allocation is written
only in the transaction that admits it (`commit_placement_in`, which the admission stamps with a
new `admitted_at`) and deleted only with its entry (a release, reconciliation), so while an entry
reads the same key, what its job holds is what was read for that key before."""

_NODE_COLUMNS = _columns(AllocationRow, "job_id attempt rank fleet node score scorer")
JOBS_PER_READ = 5000
"""Job ids per query: SQLite bounds the parameters of a statement."""


class _Held:
    """Parsed placements of admitted attempts, by AdmissionKey, kept between passes."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by_key: dict[AdmissionKey, Placement] = {}


_HELD: weakref.WeakKeyDictionary[Any, _Held] = weakref.WeakKeyDictionary()
_HELD_LOCK = threading.Lock()


def placements_of(
    session: Session, admitted: Sequence[AdmissionKey]
) -> dict[AdmissionKey, Placement]:
    """What each admitted attempt holds (one that holds nothing is left out). Placements are
    kept in memory per engine, keyed by their entry (see AdmissionKey): a pass reads and parses
    only the attempts admitted since the one before, and forgets those no longer admitted."""
    engine = session.get_bind()
    with _HELD_LOCK:
        held = _HELD.get(engine)
        if held is None:
            held = _HELD[engine] = _Held()
    with held.lock:
        known = held.by_key
        read = _read_placements(session, [key for key in admitted if key not in known])
        found: dict[AdmissionKey, Placement] = {}
        for key in admitted:
            placement = known.get(key) or read.get((key[0], key[1]))
            if placement is not None:
                found[key] = placement
        held.by_key = found
    return found


def _read_placements(
    session: Session, keys: Sequence[AdmissionKey]
) -> dict[tuple[str, int], Placement]:
    """The allocations of these attempts, as this transaction reads them (plain columns: the
    ORM's row objects cost more than the parse)."""
    wanted = {(job_id, attempt) for job_id, attempt, _ in keys}
    job_ids = sorted({job_id for job_id, _ in wanted})
    nodes: dict[tuple[str, int], list[Any]] = defaultdict(list)
    for start in range(0, len(job_ids), JOBS_PER_READ):
        some = job_ids[start : start + JOBS_PER_READ]
        query = sa_select(*_NODE_COLUMNS).where(col(AllocationRow.job_id).in_(some))
        for row in session.connection().execute(query):
            if (row.job_id, row.attempt) in wanted:
                nodes[row.job_id, row.attempt].append(row)
    found = {}
    for key, rows in nodes.items():
        rows.sort(key=lambda row: row.rank)
        found[key] = Placement(
            fleet=rows[0].fleet,
            nodes=[NodePlacement.model_validate(row.node) for row in rows],
            score=rows[0].score,
            scorer=rows[0].scorer,
        )
    return found
