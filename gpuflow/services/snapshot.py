"""Reading the fleets from the database as the scheduler's Snapshot: the cold path (every host,
GPU and allocation) and the pieces the warm state (warm.py) re-reads when a counter moved."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import String, cast
from sqlalchemy import select as sa_select
from sqlmodel import Session, col, select

from gpuflow.scheduler.model import FleetSnapshot, GpuSlot, HostSnapshot, Snapshot
from gpuflow.services.mix import fill_workloads
from gpuflow.specs.units import format_duration
from gpuflow.status import HostState
from gpuflow.store.tables import AllocationRow, FleetRow, GpuRow, HostRow

Use = tuple[int, tuple[int, ...], float | None, tuple[int, ...], float, int, int]
"""One allocation row as usage: (allocation id, GPU indices, GPU fraction, blocks, CPUs,
memory MiB, disk MiB)."""


def state_detail(host: Any, now: datetime) -> str | None:
    """What an explanation says about a host's state (how long ago a lost host was heard)."""
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
def columns(table: Any, names: str) -> list[Any]:
    return [table.__table__.c[name] for name in names.split()]


_HOST_COLUMNS = columns(
    HostRow,
    "id name fleet state state_detail last_heartbeat os arch cpus memory_mib disk_mib backend "
    "driver_version labels taints blocks simulated address task_queue",
)
STATE_COLUMNS = columns(HostRow, "id state state_detail last_heartbeat")
_GPU_COLUMNS = columns(GpuRow, "host_id index name vendor memory_mib compute_capability uuid")
# Allocation index lists come back as their JSON text, parsed by `_ints` (a tenth of the cost
# of the JSON type's processing, paid for every allocation of every placement).
_USE_COLUMNS = [
    AllocationRow.__table__.c["host_id"],  # type: ignore[attr-defined]
    AllocationRow.__table__.c["id"],  # type: ignore[attr-defined]
    cast(AllocationRow.__table__.c["gpu_indices"], String),  # type: ignore[attr-defined]
    *columns(AllocationRow, "gpu_fraction"),
    cast(AllocationRow.__table__.c["blocks"], String),  # type: ignore[attr-defined]
    *columns(AllocationRow, "cpus memory_mib disk_mib"),
]


_PARSED: dict[str | None, tuple[int, ...]] = {}
"""JSON text -> its integers: a fleet's allocations hold few distinct index lists, and every
allocation is read again when another worker writes one."""


def _ints(text: str | None) -> tuple[int, ...]:
    """A JSON list of integers, e.g. `[0, 3]`."""
    found = _PARSED.get(text)
    if found is None:
        inner = (text or "").strip().removeprefix("[").removesuffix("]")
        found = tuple(int(item) for item in inner.split(",") if item.strip())
        if len(_PARSED) > 10_000:
            _PARSED.clear()
        _PARSED[text] = found
    return found


def read_uses(session: Session, host_ids: list[str] | None) -> dict[str, list[Use]]:
    """The allocations on these hosts (None: on every host), per host, oldest first (the order
    their shares add up in, so a warm and a cold read sum floats alike)."""
    uses: dict[str, list[Use]] = defaultdict(list)
    if host_ids is not None and not host_ids:
        return uses
    held = sa_select(*_USE_COLUMNS).order_by(col(AllocationRow.id))
    if host_ids is not None:
        held = held.where(col(AllocationRow.host_id).in_(host_ids))
    result = session.connection().execute(held)
    try:
        rows = result.cursor.fetchall()  # the driver's rows: every allocation, for a reload
    finally:
        result.close()
    for host_id, row_id, indices, fraction, blocks, cpus, memory, disk in rows:
        uses[host_id].append((row_id, _ints(indices), fraction, _ints(blocks), cpus, memory, disk))
    return uses


def use_of_values(row_id: int, values: Mapping[str, Any]) -> Use:
    """An allocation just written from these column values with this id, as `read_uses` would
    read it back."""
    return (
        row_id,
        tuple(values["gpu_indices"]),
        values["gpu_fraction"],
        tuple(values["blocks"]),
        values["cpus"],
        values["memory_mib"],
        values["disk_mib"],
    )


def use_of(row: AllocationRow) -> Use:
    """An allocation row just written, as `read_uses` would read it back."""
    assert row.id is not None, "flush the row first"
    return use_of_values(row.id, {name: getattr(row, name) for name in _USE_FIELDS})


_USE_FIELDS = ("gpu_indices", "gpu_fraction", "blocks", "cpus", "memory_mib", "disk_mib")


def set_usage(host: HostSnapshot, uses: list[Use]) -> None:
    """Make the host's usage what these allocations take, summed in their order."""
    slots = {gpu.index: gpu for gpu in host.gpus}
    for gpu in host.gpus:
        gpu.used = 0.0
    host.blocks_used = set()
    host.cpus_used, host.memory_used_mib, host.disk_used_mib = 0.0, 0, 0
    for _, indices, fraction, blocks, cpus, memory_mib, disk_mib in uses:
        share = fraction if fraction is not None else 1.0
        for index in indices:
            if index in slots:
                slots[index].used += share
        host.blocks_used.update(blocks)
        host.cpus_used += cpus
        host.memory_used_mib += memory_mib
        host.disk_used_mib += disk_mib


def read_snapshot(session: Session, *, fleets: list[str] | None = None) -> Snapshot:
    """The fleets as they are now, with every allocation applied."""
    return read_fleets(session, fleets=fleets)[0]


def read_fleets(
    session: Session, *, fleets: list[str] | None = None
) -> tuple[Snapshot, dict[str, list[Use]], dict[str, Any]]:
    """`read_snapshot`, with each host's allocations and its state row (what warm.py keeps)."""
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
    by_host = set(host_ids)
    slots_by_host: dict[str, dict[int, GpuSlot]] = defaultdict(dict)
    if host_ids:
        gpus = sa_select(*_GPU_COLUMNS).order_by(col(GpuRow.host_id), col(GpuRow.index))
        if fleets:  # else every host's (a list of every host id costs more than the read)
            gpus = gpus.where(col(GpuRow.host_id).in_(host_ids))
        for host_id, index, name, vendor, memory_mib, cc, uuid in rows.execute(gpus).all():
            if host_id not in by_host:
                continue  # a host of no fleet (being deleted)
            slots_by_host[host_id][index] = GpuSlot(
                index=index,
                name=name,
                vendor=vendor,
                memory_mib=memory_mib,
                compute_capability=cc,
                uuid=uuid,
            )
    uses = read_uses(session, host_ids if fleets else None)

    by_fleet: dict[str, FleetSnapshot] = {
        row.name: FleetSnapshot(
            name=row.name,
            kind=row.kind,
            scorer=row.scorer,
            scorer_weights=dict(row.spec.get("scorer_weights") or {}),
        )
        for row in fleet_rows
    }
    states: dict[str, Any] = {}
    for host in host_rows:
        if host.fleet not in by_fleet:
            continue
        states[host.id] = host
        snap = HostSnapshot(
            id=host.id,
            name=host.name,
            fleet=host.fleet,
            state=HostState(host.state),
            state_detail=state_detail(host, now),
            os=host.os,
            arch=host.arch,
            cpus=host.cpus,
            memory_mib=host.memory_mib,
            disk_mib=host.disk_mib,
            gpus=list(slots_by_host[host.id].values()),
            backend=host.backend,
            driver_version=host.driver_version,
            labels=dict(host.labels or {}),
            taints=list(host.taints or []),
            blocks=host.blocks,
            simulated=host.simulated,
            address=host.address,
            task_queue=host.task_queue,
        )
        set_usage(snap, uses.get(host.id, []))
        by_fleet[host.fleet].hosts.append(snap)
    snapshot = Snapshot(fleets=list(by_fleet.values()))
    fill_workloads(session, snapshot)  # the request mix the fleet's recent jobs make
    return snapshot, uses, states
