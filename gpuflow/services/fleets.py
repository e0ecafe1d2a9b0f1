"""Fleets and their hosts in the database."""

from __future__ import annotations

import re
import socket
from collections.abc import Collection, Sequence
from datetime import UTC, datetime

from sqlmodel import Session, col, select

from gpuflow.errors import GpuflowError, NotFoundError
from gpuflow.naming import host_id, host_task_queue
from gpuflow.services.changes import bump, bump_hosts
from gpuflow.services.mix import forget_mix_in
from gpuflow.services.verdicts import WAITING
from gpuflow.specs.fleet import FleetSpec, HostDecl
from gpuflow.status import HostState
from gpuflow.store.db import Store
from gpuflow.store.tables import AllocationRow, FleetRow, GpuRow, HostRow, QueueEntryRow
from gpuflow.workflows.models import HostFacts


def local_host_name() -> str:
    name = re.sub(r"[^a-z0-9-]", "-", socket.gethostname().lower()).strip("-")
    return (name if name and name[0].isalpha() else f"host-{name}")[:41] or "localhost"


def _host_rows(spec: FleetSpec, facts: dict[str, HostFacts]) -> list[tuple[HostRow, list[GpuRow]]]:
    rows = []
    if spec.kind == "local":
        name = local_host_name()
        fact = facts[name]
        blocks = spec.blocks or 1
        decl = HostDecl(name=name, cpus=fact.cpus, blocks=blocks)
        rows.append(_from_facts(spec, decl, fact, simulated=False, blocks=decl.block_count()))
        return rows
    for decl in spec.hosts:
        if spec.kind == "sim":
            gpus = []
            index = 0
            for gpu in decl.gpus:
                for _ in range(gpu.count):
                    gpus.append(
                        GpuRow(
                            host_id=host_id(spec.name, decl.name),
                            index=index,
                            name=gpu.name,
                            vendor=gpu.vendor,
                            memory_mib=gpu.memory,
                            uuid=f"SIM-{spec.name}-{decl.name}-{index}",
                            compute_capability=gpu.compute_capability,
                        )
                    )
                    index += 1
            host = HostRow(
                id=host_id(spec.name, decl.name),
                fleet=spec.name,
                name=decl.name,
                state=decl.state,
                state_detail=None if decl.state == "ready" else "declared",
                os=decl.os,
                arch=decl.arch,
                cpus=decl.cpus,
                memory_mib=decl.memory,
                disk_mib=decl.disk,
                backend=decl.effective_backend,
                driver_version=decl.driver_version,
                labels={**spec.labels, **decl.labels},
                taints=list(decl.taints),
                blocks=decl.block_count(),
                simulated=True,
                task_queue=host_task_queue(host_id(spec.name, decl.name)),
                # A state declared in the fleet file has no heartbeat whose age could mean anything.
                last_heartbeat=datetime.now(UTC) if decl.state == "ready" else None,
                sim_utilization={
                    **spec.utilization.model_dump(),
                    "memory_total_mib": decl.gpus[0].memory if decl.gpus else 0,
                },
            )
            rows.append((host, gpus))
        else:
            fact = facts[decl.name]
            host, gpus = _from_facts(spec, decl, fact, simulated=False, blocks=decl.block_count())
            host.address = decl.hostname or "127.0.0.1"
            host.ssh = decl.ssh_settings()
            rows.append((host, gpus))
    return rows


def _from_facts(
    spec: FleetSpec, decl: HostDecl, fact: HostFacts, *, simulated: bool, blocks: int
) -> tuple[HostRow, list[GpuRow]]:
    hid = host_id(spec.name, decl.name)
    if blocks > 1 and (len(fact.gpus) % blocks or fact.cpus % blocks):
        raise GpuflowError(
            f"host {decl.name}: blocks={blocks} must divide its {len(fact.gpus)} GPUs "
            f"and {fact.cpus} CPUs evenly"
        )
    host = HostRow(
        id=hid,
        fleet=spec.name,
        name=decl.name,
        state=HostState.READY,
        os=fact.os,
        arch=fact.arch,
        cpus=fact.cpus,
        memory_mib=fact.memory_mib,
        disk_mib=fact.disk_mib,
        backend=fact.backend,
        driver_version=fact.driver_version,
        labels={**spec.labels, **decl.labels},
        taints=list(decl.taints),
        blocks=blocks,
        simulated=simulated,
        task_queue=host_task_queue(hid),
        last_heartbeat=datetime.now(UTC),
    )
    gpus = [
        GpuRow(
            host_id=hid,
            index=gpu.index,
            name=gpu.name,
            vendor=gpu.vendor,
            memory_mib=gpu.memory_mib,
            uuid=gpu.uuid,
            compute_capability=gpu.compute_capability,
        )
        for gpu in fact.gpus
    ]
    return host, gpus


def _one_local_fleet(session: Session, fleet: str, hosts: list[str]) -> None:
    """A machine is one local fleet's: a second (an embedded stack's `local` and another
    applied beside it) would list it twice, its CPUs and GPUs counted twice, with no agent
    serving the second. Each GPU host that registers itself (infra/README.md) is its own."""
    local = select(FleetRow.name).where(FleetRow.kind == "local", FleetRow.name != fleet)
    taken = session.exec(
        select(HostRow.fleet, HostRow.name).where(
            col(HostRow.fleet).in_(local), col(HostRow.name).in_(hosts)
        )
    ).first()
    if taken is not None:
        raise GpuflowError(
            f"this machine ({taken[1]}) is fleet {taken[0]}'s already (kind local); delete "
            f"that fleet first to list it as {fleet}"
        )


def apply_fleet(
    store: Store, spec: FleetSpec, facts: dict[str, HostFacts] | None = None
) -> list[str]:
    """Create or update the fleet, its hosts and GPUs in one transaction.

    Hosts that left the spec are removed, unless a job still holds them: those go to
    maintenance, so nothing new lands there and the running job keeps its allocation. A host
    left with fewer GPUs than a running job holds keeps that job too; what is returned says so
    (warnings, one per host).
    """
    warnings: list[str] = []
    rows = _host_rows(spec, facts or {})
    with store.placement_transaction() as session:
        fleet = session.get(FleetRow, spec.name)
        if spec.kind == "local":
            _one_local_fleet(session, spec.name, [host.name for host, _ in rows])
        if fleet is None:
            fleet = FleetRow(name=spec.name, kind=spec.kind)
        elif fleet.kind != spec.kind:
            raise GpuflowError(
                f"fleet {spec.name} is a {fleet.kind} fleet; delete it first to make it {spec.kind}"
            )
        fleet.scorer = spec.scorer
        fleet.spec = spec.model_dump(mode="json")
        session.add(fleet)
        bump(session, "structure")
        wanted = {host.id for host, _ in rows}
        existing = session.exec(select(HostRow).where(HostRow.fleet == spec.name)).all()
        for old in existing:
            if old.id in wanted:
                continue
            if _holds_allocations(session, old.id):
                old.state = HostState.MAINTENANCE
                old.state_detail = DRAINING
                session.add(old)
            else:
                _delete_host(session, old.id)
        held = _held_gpus(session, spec.name)
        for host, gpus in rows:
            current = session.get(HostRow, host.id)
            if current is not None:
                warnings += _dropped_gpus(held.get(host.id, []), host.name, len(gpus))
                for field, value in host.model_dump(exclude={"id"}).items():
                    setattr(current, field, value)
                session.add(current)
            else:
                session.add(host)
            before = list(session.exec(select(GpuRow).where(GpuRow.host_id == host.id)))
            if current is not None:
                warnings += _changed_models(held.get(host.id, []), host.name, before, gpus)
            for gpu in before:
                session.delete(gpu)
            session.flush()
            for gpu in gpus:
                session.add(gpu)
    return warnings


def _held_gpus(session: Session, fleet: str) -> dict[str, list[tuple[str, int]]]:
    """Host id -> (job id, GPU index) of every GPU the fleet's allocations hold: one read for
    an apply of thousands of hosts."""
    query = select(AllocationRow.host_id, AllocationRow.job_id, AllocationRow.gpu_indices)
    held: dict[str, list[tuple[str, int]]] = {}
    for hid, job_id, indices in session.exec(query.where(AllocationRow.fleet == fleet)):
        held.setdefault(hid, []).extend((job_id, index) for index in indices)
    return held


def _dropped_gpus(held: list[tuple[str, int]], name: str, count: int) -> list[str]:
    """A warning when running jobs hold GPUs of the host at or past `count` (its new spec's)."""
    dropped = sorted({(job, i) for job, i in held if i >= count})
    if not dropped:
        return []
    jobs = ", ".join(f"{job} (GPU {i})" for job, i in dropped)
    return [
        f"host {name} now has {count} GPU(s), but {jobs} still run(s) on the GPUs it drops: "
        "they keep running, and nothing new is placed there"
    ]


def _changed_models(
    held: list[tuple[str, int]], name: str, before: list[GpuRow], after: list[GpuRow]
) -> list[str]:
    """A warning when running jobs hold GPUs whose model the new spec changes."""
    was = {gpu.index: gpu.name for gpu in before}
    now = {gpu.index: gpu.name for gpu in after}
    changed: dict[tuple[str, str, str], list[int]] = {}
    for job, i in sorted(set(held)):
        if i in now and was.get(i, now[i]) != now[i]:
            changed.setdefault((job, was[i], now[i]), []).append(i)
    if not changed:
        return []
    jobs = ", ".join(
        f"{job} (GPU{'s' if len(ids) > 1 else ''} {', '.join(map(str, ids))}: {old} -> {new})"
        for (job, old, new), ids in changed.items()
    )
    return [
        f"host {name}: {jobs} still run(s) on GPUs the fleet now declares another model: they "
        "keep running as placed; new jobs are placed by the new models"
    ]


DRAINING = "removed from the fleet spec; draining"
"""A host its fleet's spec no longer lists, kept while a job holds it (`sweep_drained`)."""


def sweep_drained(store: Store, fleet: str) -> list[str]:
    """Delete the fleet's hosts that its spec no longer lists once no job holds them (the
    health checks call it each round); their ids. Reads only, unless there is one to go."""
    drained = (
        select(HostRow.id)
        .where(HostRow.fleet == fleet, HostRow.state == HostState.MAINTENANCE)
        .where(HostRow.state_detail == DRAINING)
    )
    with store.read() as session:
        if not [hid for hid in session.exec(drained) if not _holds_allocations(session, hid)]:
            return []
    with store.placement_transaction() as session:  # looked at again under the lock
        gone = [hid for hid in session.exec(drained) if not _holds_allocations(session, hid)]
        for hid in gone:
            _delete_host(session, hid)
        if gone:
            bump(session, "structure")
    return gone


def _holds_allocations(session: Session, hid: str) -> bool:
    return (
        session.exec(select(AllocationRow).where(AllocationRow.host_id == hid)).first() is not None
    )


def _delete_host(session: Session, hid: str) -> None:
    for gpu in session.exec(select(GpuRow).where(GpuRow.host_id == hid)):
        session.delete(gpu)
    host = session.get(HostRow, hid)
    if host is not None:
        session.delete(host)


def delete_fleet(store: Store, name: str) -> None:
    with store.placement_transaction() as session:
        fleet = session.get(FleetRow, name)
        if fleet is None:
            raise NotFoundError(f"no fleet named {name!r}")
        hosts = session.exec(select(HostRow).where(HostRow.fleet == name)).all()
        busy = [h.name for h in hosts if _holds_allocations(session, h.id)]
        if busy:
            raise GpuflowError(
                f"fleet {name} still runs jobs on {', '.join(busy)}; stop them first"
            )
        stranded = _waiting_only_for(session, name)
        if stranded:
            shown = ", ".join(stranded[:5]) + (", ..." if len(stranded) > 5 else "")
            raise GpuflowError(
                f"fleet {name}: {len(stranded)} waiting job(s) can run on no other fleet "
                f"({shown}); stop them first, or apply the fleets they name"
            )
        for host in hosts:
            _delete_host(session, host.id)
        session.delete(fleet)
        forget_mix_in(session, name)
        bump(session, "structure")


def _waiting_only_for(session: Session, name: str) -> list[str]:
    """The waiting jobs (names) that name this fleet and no other fleet that exists: deleting
    it would leave them waiting for nothing."""
    existing = set(session.exec(select(FleetRow.name)).all())
    rows = session.exec(
        select(QueueEntryRow.name, QueueEntryRow.fleets).where(QueueEntryRow.state == WAITING)
    ).all()
    return sorted(
        job
        for job, fleets in rows
        if name in fleets and all(f == name or f not in existing for f in fleets)
    )


def set_host_state(
    store: Store,
    hid: str,
    state: HostState,
    detail: str | None = None,
    *,
    only_from: Collection[HostState] | None = None,
) -> bool:
    """Set the host's state (and bump the change counters when it changes). With `only_from`,
    only a host in one of those states changes. Whether it was set."""
    with store.session() as session:
        host = session.get(HostRow, hid)
        if host is None or (only_from is not None and host.state not in only_from):
            return False
        if (host.state, host.state_detail) != (state, detail):
            bump_hosts(session, "states", [hid])
        host.state = state
        host.state_detail = detail
        if state == HostState.READY:
            host.last_heartbeat = datetime.now(UTC)
        session.add(host)
        session.commit()
    return True


def mark_unreachable(store: Store, hid: str, detail: str) -> bool:
    """The host's agent cannot be started (its SSH login or start failed: `detail` says why);
    whether it was marked. A host in maintenance stays so: it may be draining."""
    others = [state for state in HostState if state != HostState.MAINTENANCE]
    return set_host_state(store, hid, HostState.UNREACHABLE, detail, only_from=others)


AGENT_STARTED = "agent started over SSH; not answering yet"


def mark_agent_started(store: Store, hid: str) -> None:
    """The host's agent was started over SSH: an unreachable host is reachable again, and not
    ready until its agent answers (the health round records that)."""
    set_host_state(
        store, hid, HostState.NOT_READY, AGENT_STARTED, only_from=[HostState.UNREACHABLE]
    )


def get_host(store: Store, hid: str) -> HostRow | None:
    with store.read() as session:
        return session.get(HostRow, hid)


def list_hosts(store: Store, *, kind: str | None = None) -> list[HostRow]:
    with store.read() as session:
        query = select(HostRow).order_by(col(HostRow.fleet), col(HostRow.name))
        if kind is not None:
            fleets = [f.name for f in session.exec(select(FleetRow).where(FleetRow.kind == kind))]
            query = query.where(col(HostRow.fleet).in_(fleets))
        return list(session.exec(query))


def host_names_in(session: Session, names: Sequence[str]) -> set[str]:
    """Which of `names` some fleet has a host of."""
    if not names:
        return set()
    return set(session.exec(select(HostRow.name).where(col(HostRow.name).in_(list(names)))))


def fleet_names_in(session: Session) -> list[str]:
    """The fleets' names, without reading their specs (a large fleet's is large)."""
    return list(session.exec(select(FleetRow.name).order_by(col(FleetRow.name))))
