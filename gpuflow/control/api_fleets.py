"""The fleets' listing as the API answers it (`api_fleets`, gpuflow/control/api.py): a page of
hosts (gpuflow/workflows/api_fleets.py FleetsPage), each with what placement reads of it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlmodel import col, select

from gpuflow.scheduler import blocks_busy
from gpuflow.scheduler.model import FleetSnapshot, HostSnapshot
from gpuflow.services.capacity import read_snapshot
from gpuflow.services.mix import mix_info
from gpuflow.specs.hosts import SimulatedUtilization
from gpuflow.store.db import Store
from gpuflow.store.tables import HostRow
from gpuflow.workflows.api_fleets import FleetRecord, FleetsPage

__all__ = ["read_fleets"]


def read_fleets(store: Store, page: FleetsPage) -> list[FleetRecord]:
    """The page's fleets, each with its hosts in the page, as the client shows them."""
    with store.read() as session:
        snapshot = read_snapshot(session)
        fleets = [f for f in snapshot.fleets if page.fleet in (None, f.name)]
        window = _window(fleets, page)
        mixes = {f.name: mix_info(session, f) for f, _ in window}
        simulated = [h.id for _, shown in window for h in shown if h.simulated]
        sources: dict[str, Any] = {}
        if simulated:  # where their utilization comes from (placement's snapshot lacks it)
            query = select(HostRow.id, HostRow.sim_utilization)
            sources = dict(session.exec(query.where(col(HostRow.id).in_(simulated))).all())
    out = []
    for fleet, shown in window:
        common = common_labels(fleet.hosts)
        hosts = [_host(host, common, sources.get(host.id)) for host in shown]
        out.append(
            FleetRecord(
                name=fleet.name,
                kind=fleet.kind,
                scorer=fleet.scorer,
                hosts=hosts,
                workload=mixes[fleet.name],
                common_labels=common,
            )
        )
    return out


def common_labels(hosts: list[HostSnapshot]) -> dict[str, str]:
    """The labels every host has, with the same value (the fleet file's `labels`, as a rule):
    sent once a fleet, not once a host (they may be kilobytes, times hundreds of hosts)."""
    if not hosts:
        return {}
    common = dict(hosts[0].labels)
    for host in hosts[1:]:
        common = {k: v for k, v in common.items() if host.labels.get(k) == v}
    return common


def _host(
    host: HostSnapshot, common: dict[str, str], source: Mapping[str, Any] | None
) -> dict[str, Any]:
    busy, total = blocks_busy(host)
    utilization = None
    if host.simulated:  # a real host's GPUs report their own (NVML)
        declared = {k: v for k, v in (source or {}).items() if k != "memory_total_mib"}
        utilization = SimulatedUtilization.model_validate(declared).model_dump()
    return {
        "name": host.name,
        "state": host.state.value,
        "state_detail": host.state_detail,
        "os": host.os,
        "arch": host.arch,
        "backend": host.backend,
        "driver_version": host.driver_version,
        "gpus": [
            {
                "index": g.index,
                "name": g.name,
                "memory_mib": g.memory_mib,
                "used": g.used,
                "compute_capability": g.compute_capability,
            }
            for g in host.gpus
        ],
        "gpu_used": sum(g.used for g in host.gpus),
        "cpus": host.cpus,
        "cpus_used": host.cpus_used,
        "memory_mib": host.memory_mib,
        "memory_used_mib": host.memory_used_mib,
        "disk_mib": host.disk_mib,
        "disk_used_mib": host.disk_used_mib,
        "blocks": total,
        "blocks_busy": busy,
        "other_labels": {k: v for k, v in host.labels.items() if common.get(k) != v},
        "taints": host.taints,
        "simulated": host.simulated,
        "utilization": utilization,
    }


def _window(
    fleets: list[FleetSnapshot], page: FleetsPage
) -> list[tuple[FleetSnapshot, list[HostSnapshot]]]:
    """The fleets of the page, each with its hosts in it (see FleetsPage)."""
    stop = None if page.most is None else page.after + page.most
    found = []
    first = 0  # the place of the fleet's first host in the listing
    for fleet in fleets:
        hosts = fleet.hosts
        end = len(hosts) if stop is None else max(0, min(stop - first, len(hosts)))
        shown = hosts[max(0, page.after - first) : end]
        if shown or (not hosts and page.after <= first and (stop is None or first < stop)):
            found.append((fleet, shown))
        first += len(hosts)
    return found
