"""Fixture hosts (tests/fixtures/hosts/*.yaml) as the scheduler sees them, and small builders.

A host file holds HostSnapshot fields; sizes are written like in fleet files (80GB, 2TB) and
`gpus` entries carry a `count`. Any field can be overridden when loading, e.g.
`host("h100x8", name="gpu-7")`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuflow.scheduler import FleetSnapshot, GpuSlot, HostSnapshot, Snapshot
from gpuflow.specs import JobSpec, parse_size_mib
from gpuflow.status import HostState

HOSTS_DIR = Path(__file__).resolve().parents[2] / "fixtures" / "hosts"

HostLoader = Callable[..., HostSnapshot]
SnapshotBuilder = Callable[..., Snapshot]
JobBuilder = Callable[..., JobSpec]


def load_host(file: str, *, fleet: str = "lab", **overrides: Any) -> HostSnapshot:
    data = yaml.safe_load((HOSTS_DIR / f"{file}.yaml").read_text())
    data.update(overrides)
    gpus: list[GpuSlot] = []
    for entry in data.pop("gpus", []):
        for _ in range(int(entry.get("count", 1))):
            gpus.append(
                GpuSlot(
                    index=len(gpus),
                    name=str(entry["name"]).upper(),
                    vendor=entry.get("vendor", "nvidia"),
                    memory_mib=parse_size_mib(entry["memory"]),
                    compute_capability=entry.get("compute_capability"),
                )
            )
    name = data.pop("name")
    return HostSnapshot(
        id=f"{fleet}/{name}",
        name=name,
        fleet=fleet,
        state=HostState(data.pop("state", "ready")),
        os=data.pop("os"),
        arch=data.pop("arch"),
        cpus=int(data.pop("cpus")),
        memory_mib=parse_size_mib(data.pop("memory")),
        disk_mib=parse_size_mib(data.pop("disk")),
        gpus=gpus,
        **data,
    )


def make_snapshot(
    *hosts: HostSnapshot, scorer: str = "fragmentation", weights: dict[str, float] | None = None
) -> Snapshot:
    """One fleet per distinct `host.fleet`, in order of first appearance."""
    fleets: dict[str, FleetSnapshot] = {}
    for host in hosts:
        fleet = fleets.setdefault(
            host.fleet,
            FleetSnapshot(
                name=host.fleet, kind="sim", scorer=scorer, scorer_weights=dict(weights or {})
            ),
        )
        fleet.hosts.append(host)
    return Snapshot(fleets=list(fleets.values()))


def make_job(resources: Any = None, **fields: Any) -> JobSpec:
    fields.setdefault("name", "train")
    fields.setdefault("commands", ["python train.py"])
    if resources is not None:
        fields["resources"] = resources
    return JobSpec.model_validate(fields)


@pytest.fixture(scope="session")
def host() -> HostLoader:
    return load_host


@pytest.fixture(scope="session")
def snapshot() -> SnapshotBuilder:
    return make_snapshot


@pytest.fixture(scope="session")
def job() -> JobBuilder:
    return make_job
