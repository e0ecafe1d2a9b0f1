"""Taking and releasing capacity. Each is one transaction keyed by (job, attempt), so an activity
that runs twice changes nothing the second time, and placement passes never overlap."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import String, cast
from sqlalchemy import select as sa_select
from sqlmodel import Session, col, delete, select

from gpuflow.scheduler import place
from gpuflow.scheduler.model import (
    FleetSnapshot,
    GpuSlot,
    HostSnapshot,
    NodePlacement,
    Placement,
    Snapshot,
    Unschedulable,
)
from gpuflow.services.mix import fill_workloads
from gpuflow.specs.job import JobSpec
from gpuflow.specs.units import format_duration
from gpuflow.status import HostState, JobStatus
from gpuflow.store.db import Store
from gpuflow.store.tables import AllocationRow, FleetRow, GpuRow, HostRow, JobRow


def _state_detail(host: Any, now: datetime) -> str | None:
    detail: str | None = host.state_detail
    if host.state == HostState.READY or host.last_heartbeat is None:
        return detail
    beat = host.last_heartbeat
    if beat.tzinfo is None:
        beat = beat.replace(tzinfo=UTC)
    ago = f"last heartbeat {format_duration((now - beat).total_seconds())} ago"
    return f"{detail}; {ago}" if detail else ago


# The columns a snapshot needs, read as plain rows: every placement reads the whole fleet, and
# building ORM objects for it (allocations with their node JSON included) cost more than the
# scheduler itself.
def _columns(table: Any, names: str) -> list[Any]:
    return [table.__table__.c[name] for name in names.split()]


_HOST_COLUMNS = _columns(
    HostRow,
    "id name fleet state state_detail last_heartbeat os arch cpus memory_mib disk_mib backend "
    "driver_version labels taints blocks simulated address task_queue",
)
_GPU_COLUMNS = _columns(GpuRow, "host_id index name vendor memory_mib compute_capability uuid")
# Allocation index lists come back as their JSON text, parsed by `_ints` (a tenth of the cost
# of the JSON type's processing, paid for every allocation of every placement).
_USE_COLUMNS = [
    AllocationRow.__table__.c["host_id"],  # type: ignore[attr-defined]
    cast(AllocationRow.__table__.c["gpu_indices"], String),  # type: ignore[attr-defined]
    *_columns(AllocationRow, "gpu_fraction"),
    cast(AllocationRow.__table__.c["blocks"], String),  # type: ignore[attr-defined]
    *_columns(AllocationRow, "cpus memory_mib disk_mib"),
]


def _ints(text: str | None) -> list[int]:
    """A JSON list of integers, e.g. `[0, 3]`."""
    inner = (text or "").strip().removeprefix("[").removesuffix("]")
    return [int(item) for item in inner.split(",") if item.strip()]


def read_snapshot(session: Session, *, fleets: list[str] | None = None) -> Snapshot:
    """The fleets as they are now, with every allocation applied."""
    now = datetime.now(UTC)
    fleet_query = select(FleetRow).order_by(col(FleetRow.name))
    host_query = sa_select(*_HOST_COLUMNS).order_by(col(HostRow.fleet), col(HostRow.name))
    if fleets:
        fleet_query = fleet_query.where(col(FleetRow.name).in_(fleets))
        host_query = host_query.where(col(HostRow.fleet).in_(fleets))
    fleet_rows = session.exec(fleet_query).all()
    rows = session.connection()  # plain column reads: no ORM row processing
    host_rows = rows.execute(host_query).all()
    host_ids = [host.id for host in host_rows]
    slots_by_host: dict[str, dict[int, GpuSlot]] = defaultdict(dict)
    uses: dict[str, list[Any]] = defaultdict(list)
    if host_ids:
        gpus = (
            sa_select(*_GPU_COLUMNS)
            .where(col(GpuRow.host_id).in_(host_ids))
            .order_by(col(GpuRow.host_id), col(GpuRow.index))
        )
        for host_id, index, name, vendor, memory_mib, cc, uuid in rows.execute(gpus).all():
            slots_by_host[host_id][index] = GpuSlot(
                index=index,
                name=name,
                vendor=vendor,
                memory_mib=memory_mib,
                compute_capability=cc,
                uuid=uuid,
            )
        held = sa_select(*_USE_COLUMNS).where(col(AllocationRow.host_id).in_(host_ids))
        for use in rows.execute(held).all():
            uses[use[0]].append(use)

    by_fleet: dict[str, FleetSnapshot] = {
        row.name: FleetSnapshot(
            name=row.name,
            kind=row.kind,
            scorer=row.scorer,
            scorer_weights=dict(row.spec.get("scorer_weights") or {}),
        )
        for row in fleet_rows
    }
    for host in host_rows:
        if host.fleet not in by_fleet:
            continue
        slots = slots_by_host[host.id]
        snap = HostSnapshot(
            id=host.id,
            name=host.name,
            fleet=host.fleet,
            state=HostState(host.state),
            state_detail=_state_detail(host, now),
            os=host.os,
            arch=host.arch,
            cpus=host.cpus,
            memory_mib=host.memory_mib,
            disk_mib=host.disk_mib,
            gpus=list(slots.values()),
            backend=host.backend,
            driver_version=host.driver_version,
            labels=dict(host.labels or {}),
            taints=list(host.taints or []),
            blocks=host.blocks,
            simulated=host.simulated,
            address=host.address,
            task_queue=host.task_queue,
        )
        for _, indices, fraction, blocks, cpus, memory_mib, disk_mib in uses[host.id]:
            share = fraction if fraction is not None else 1.0
            for index in _ints(indices):
                if index in slots:
                    slots[index].used += share
            snap.blocks_used.update(_ints(blocks))
            snap.cpus_used += cpus
            snap.memory_used_mib += memory_mib
            snap.disk_used_mib += disk_mib
        by_fleet[host.fleet].hosts.append(snap)
    snapshot = Snapshot(fleets=list(by_fleet.values()))
    fill_workloads(session, snapshot)  # the request mix the fleet's recent jobs make
    return snapshot


def _placement_from_rows(rows: list[AllocationRow]) -> Placement:
    rows = sorted(rows, key=lambda r: r.rank)
    return Placement(
        fleet=rows[0].fleet,
        nodes=[NodePlacement.model_validate(row.node) for row in rows],
        score=rows[0].score,
        scorer=rows[0].scorer,
    )


def held_allocation(session: Session, job_id: str, attempt: int) -> Placement | None:
    rows = list(
        session.exec(
            select(AllocationRow).where(
                AllocationRow.job_id == job_id, AllocationRow.attempt == attempt
            )
        )
    )
    return _placement_from_rows(rows) if rows else None


def take_allocation(
    store: Store, *, job_id: str, attempt: int, job: JobSpec, fleets: list[str] | None = None
) -> Placement | Unschedulable:
    """Place the job and record the allocation in one serialized transaction.

    Repeating the call for the same (job, attempt) returns the allocation already taken.
    """
    with store.placement_transaction() as session:
        return take_allocation_in(session, job_id=job_id, attempt=attempt, job=job, fleets=fleets)


def take_allocation_in(
    session: Session, *, job_id: str, attempt: int, job: JobSpec, fleets: list[str] | None = None
) -> Placement | Unschedulable:
    """`take_allocation` inside the caller's `placement_transaction`."""
    held = held_allocation(session, job_id, attempt)
    if held is not None:
        return held
    # An earlier attempt's allocation is never carried over: give it back first.
    session.exec(delete(AllocationRow).where(col(AllocationRow.job_id) == job_id))
    result = place(job, read_snapshot(session, fleets=fleets), fleets=fleets)
    if isinstance(result, Unschedulable):
        return result
    for node in result.nodes:
        session.add(
            AllocationRow(
                job_id=job_id,
                attempt=attempt,
                rank=node.rank,
                fleet=result.fleet,
                host_id=node.host_id,
                gpu_indices=list(node.gpu_indices),
                gpu_fraction=node.gpu_fraction,
                blocks=list(node.blocks),
                cpus=node.cpus,
                memory_mib=node.memory_mib,
                disk_mib=node.disk_mib,
                node=node.model_dump(mode="json"),
                score=result.score,
                scorer=result.scorer,
            )
        )
    return result


def release_allocation(store: Store, *, job_id: str) -> int:
    """Give back everything the job holds. Returns how many nodes were released (0 the 2nd time)."""
    with store.placement_transaction() as session:
        return release_allocation_in(session, job_id=job_id)


def release_allocation_in(session: Session, *, job_id: str) -> int:
    """`release_allocation` inside the caller's `placement_transaction`."""
    rows = list(session.exec(select(AllocationRow).where(AllocationRow.job_id == job_id)))
    for row in rows:
        session.delete(row)
    return len(rows)


def allocations_of(store: Store, job_id: str) -> list[AllocationRow]:
    with store.read() as session:
        return list(session.exec(select(AllocationRow).where(AllocationRow.job_id == job_id)))


def release_attempt_in(session: Session, *, job_id: str, attempt: int) -> int:
    """Give back what one attempt of the job holds, inside the caller's `placement_transaction`
    (a later attempt's allocation is left alone). Returns how many nodes were released."""
    rows = list(
        session.exec(
            select(AllocationRow).where(
                AllocationRow.job_id == job_id, AllocationRow.attempt == attempt
            )
        )
    )
    for row in rows:
        session.delete(row)
    return len(rows)


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


def held_attempts(store: Store, *, fleet: str, limit: int = 2000) -> list[HeldAttempt]:
    """Every (job, attempt) holding capacity in the fleet, oldest first, with its nodes and
    the job's recorded status: what reconciliation checks. At most `limit` allocation rows."""
    with store.read() as session:
        query = (
            sa_select(*_columns(AllocationRow, "job_id attempt rank node"))
            .where(col(AllocationRow.fleet) == fleet)
            .order_by(col(AllocationRow.created_at), col(AllocationRow.job_id))
            .limit(limit)
        )
        rows = session.connection().execute(query).all()
        nodes: dict[tuple[str, int], list[HeldNode]] = {}
        for job_id, attempt, rank, node in rows:
            nodes.setdefault((job_id, attempt), []).append(
                HeldNode(
                    rank=rank,
                    host_name=str(node.get("host_name", "")),
                    task_queue=str(node.get("task_queue", "")),
                )
            )
        job_ids = sorted({job_id for job_id, _ in nodes})
        recorded = sa_select(*_columns(JobRow, "id status attempt")).where(
            col(JobRow.id).in_(job_ids)
        )
        jobs = {
            job_id: (JobStatus(status), attempt)
            for job_id, status, attempt in session.connection().execute(recorded).all()
        }
    return [
        HeldAttempt(
            job_id=job_id,
            attempt=attempt,
            nodes=sorted(held, key=lambda n: n.rank),
            job_status=jobs[job_id][0] if job_id in jobs else None,
            job_attempt=jobs[job_id][1] if job_id in jobs else None,
        )
        for (job_id, attempt), held in nodes.items()
    ]
