"""Invariants of docs/architecture.md, checked on random fleets and random streams of jobs:

1. allocated GPUs, blocks, GPU fractions, CPU, memory and disk never exceed a host's capacity;
2. a gang is placed whole (N distinct idle hosts of one fleet) or not at all;
5. automatic, manual and dry-run placement give the same verdict on the same snapshot;
and: non-ready hosts are never chosen, and what the scheduler keeps between calls never
changes a verdict (a fresh copy of the snapshot gets the same answer).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuflow.scheduler import (
    FleetSnapshot,
    GpuSlot,
    HostSnapshot,
    Placement,
    Snapshot,
    Unschedulable,
    apply_placement,
    explain,
    place,
    release_placement,
)
from gpuflow.specs import JobSpec, Selection
from gpuflow.status import HostState

EPSILON = 1e-9
STATES = [HostState.READY] * 5 + [
    HostState.NOT_READY,
    HostState.UNREACHABLE,
    HostState.MAINTENANCE,
    HostState.PROVISIONING,
]
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def hosts(draw: st.DrawFn, fleet: str, number: int) -> HostSnapshot:
    mac = draw(st.booleans()) and draw(st.booleans())
    count = 1 if mac else draw(st.sampled_from([0, 1, 2, 4, 8]))
    cpus = draw(st.sampled_from([8, 16, 32, 64]))
    blocks = 1
    if count > 1 and draw(st.booleans()):
        blocks = draw(st.sampled_from([b for b in (2, 4, 8) if count % b == 0 and cpus % b == 0]))
    model = "M2-ULTRA" if mac else draw(st.sampled_from(["A100", "H100", "T4"]))
    return HostSnapshot(
        id=f"{fleet}/h{number}",
        name=f"h{number}",
        fleet=fleet,
        state=draw(st.sampled_from(STATES)),
        os="macos" if mac else "linux",
        arch="arm64" if mac else "x86_64",
        cpus=cpus,
        memory_mib=cpus * 4096,
        disk_mib=500 * 1024,
        gpus=[
            GpuSlot(
                index=i,
                name=model,
                vendor="apple" if mac else "nvidia",
                memory_mib=24576,
                compute_capability=None if mac else "8.0",
            )
            for i in range(count)
        ],
        blocks=blocks,
        driver_version=None if mac else "550.54",
        task_queue=f"q-{number}",
    )


@st.composite
def snapshots(draw: st.DrawFn) -> Snapshot:
    fleets = []
    number = 0
    for fleet in ["a", "b"][: draw(st.integers(1, 2))]:
        members = []
        for _ in range(draw(st.integers(1, 5))):
            members.append(draw(hosts(fleet, number)))
            number += 1
        scorer = draw(st.sampled_from(["fragmentation", "binpack", "spread"]))
        fleets.append(FleetSnapshot(name=fleet, kind="sim", scorer=scorer, hosts=members))
    return Snapshot(fleets=fleets)


@st.composite
def jobs(draw: st.DrawFn, number: int) -> JobSpec:
    resources: dict[str, Any] = {
        "cpu": draw(st.sampled_from([1, 2, 4, 8, 16])),
        "memory": f"{draw(st.sampled_from([0, 4, 16, 64]))}GB",
    }
    nodes = 1
    kind = draw(st.sampled_from(["cpu", "fraction", "fraction", "whole", "range", "cuda"]))
    if kind == "fraction":
        resources["gpu"] = draw(st.sampled_from([0.25, 0.3, 0.5, 0.75]))
    elif kind == "whole":
        resources["gpu"] = draw(st.sampled_from([1, 2, 4, 8]))
        nodes = draw(st.sampled_from([1, 1, 1, 2, 3]))
    elif kind == "range":
        resources["gpu"] = draw(st.sampled_from(["1..2", "2..8", "1.."]))
    elif kind == "cuda":
        resources["gpu"] = "nvidia:1"
        resources["os"] = "linux"
    return JobSpec(name=f"j{number}", commands=["run"], resources=resources, nodes=nodes)


def fresh(snapshot: Snapshot, only: str | None = None) -> Snapshot:
    """A copy built from scratch (nothing remembered), optionally with only one host."""
    return Snapshot(
        fleets=[
            FleetSnapshot(
                name=f.name,
                kind=f.kind,
                scorer=f.scorer,
                scorer_weights=dict(f.scorer_weights),
                hosts=[
                    replace(h, gpus=[replace(g) for g in h.gpus], blocks_used=set(h.blocks_used))
                    for h in f.hosts
                    if only is None or h.id == only
                ],
            )
            for f in snapshot.fleets
        ]
    )


def check_capacity(snapshot: Snapshot) -> None:
    for host in snapshot.hosts():
        assert all(-EPSILON <= gpu.used <= 1 + EPSILON for gpu in host.gpus), host
        assert host.blocks_used <= set(range(host.blocks)), host
        assert host.cpus_used <= host.cpus + EPSILON, host
        assert host.memory_used_mib <= host.memory_mib, host
        assert host.disk_used_mib <= host.disk_mib, host


def check_placement(job: JobSpec, snapshot: Snapshot, placement: Placement) -> None:
    by_id = {host.id: host for host in snapshot.hosts()}
    chosen = [by_id[node.host_id] for node in placement.nodes]
    assert len(placement.nodes) == job.nodes
    assert [node.rank for node in placement.nodes] == list(range(job.nodes))
    assert len({host.id for host in chosen}) == job.nodes
    assert {host.fleet for host in chosen} == {placement.fleet}
    assert all(host.state == HostState.READY for host in chosen)
    if job.nodes > 1:
        assert all(host.idle for host in chosen)
    gpu = job.resources.gpu
    for node, host in zip(placement.nodes, chosen, strict=True):
        if gpu is not None and gpu.fraction is not None:
            assert node.gpu_fraction == gpu.fraction and len(node.gpu_indices) == 1
        elif gpu is not None:
            assert gpu.count.contains(len(node.gpu_indices))
            assert all(host.gpus[i].used <= EPSILON for i in node.gpu_indices)
        else:
            assert node.gpu_indices == []


@SETTINGS
@given(
    snapshots(),
    st.lists(st.tuples(st.integers(0, 30), st.integers(0, 3)), min_size=1, max_size=20),
    st.data(),
)
def test_random_streams_keep_every_invariant(
    snapshot: Snapshot, stream: list[tuple[int, int]], data: st.DataObject
) -> None:
    held: list[Placement] = []
    for number, action in stream:
        if action == 0 and held:  # one step in four gives something back
            release_placement(snapshot, held.pop(number % len(held)))
            check_capacity(snapshot)
            continue
        job = data.draw(jobs(number))
        before = fresh(snapshot)
        result = place(job, snapshot)
        # What the scheduler remembers between calls never changes a verdict.
        assert result == place(job, before)
        # The dry run agrees with placement.
        offers = explain(job, snapshot)
        assert offers.verdict() == result
        if isinstance(result, Placement):
            check_placement(job, snapshot, result)
            assert {f.host_id for f in offers.fits} >= {n.host_id for n in result.nodes}
            apply_placement(snapshot, result)
            held.append(result)
        else:
            assert offers.fits == [] or job.nodes > 1
            assert result.rejections
            gangs = [r for r in result.rejections if r.filter == "gang"]
            assert job.nodes > 1 or not gangs
        check_capacity(snapshot)


@SETTINGS
@given(snapshots(), st.integers(0, 30), st.data())
def test_naming_a_host_gives_the_verdict_of_a_snapshot_with_only_that_host(
    snapshot: Snapshot, number: int, data: st.DataObject
) -> None:
    # Take some capacity first, so hosts are in mixed states.
    for i in range(data.draw(st.integers(0, 6))):
        warmup = data.draw(jobs(100 + i))
        result = place(warmup, snapshot)
        if isinstance(result, Placement):
            apply_placement(snapshot, result)
    host = data.draw(st.sampled_from(snapshot.hosts()))
    spec = data.draw(jobs(number))
    if spec.nodes > 1:
        spec = spec.model_copy(update={"nodes": 1})
    by_name = place(spec.model_copy(update={"placement": Selection(hosts=[host.name])}), snapshot)
    alone = place(spec, fresh(snapshot, only=host.id))
    assert type(by_name) is type(alone)
    if isinstance(by_name, Unschedulable):
        assert isinstance(alone, Unschedulable)
        assert by_name.lines == alone.lines
    else:
        assert isinstance(alone, Placement)
        assert by_name.nodes == alone.nodes
    if host.gpus:
        every_gpu = [f"{host.name}:{gpu.index}" for gpu in host.gpus]
        by_gpus = place(spec.model_copy(update={"placement": Selection(gpus=every_gpu)}), snapshot)
        if isinstance(by_name, Placement):
            assert isinstance(by_gpus, Placement)
            assert by_gpus.nodes == by_name.nodes
        else:
            assert isinstance(by_gpus, Unschedulable)
            assert [r.filter for r in by_gpus.rejections] == [r.filter for r in by_name.rejections]


@st.composite
def large_fleets(draw: st.DrawFn) -> Snapshot:
    """One fleet of ready hosts, large enough for the fast path (64+ hosts, few shapes)."""
    shapes = draw(
        st.lists(
            st.tuples(
                st.sampled_from([0, 1, 2, 4, 8]),
                st.sampled_from([8, 16, 32, 64]),
                st.sampled_from(["A100", "T4"]),
            ),
            min_size=1,
            max_size=4,
        )
    )
    members = []
    for number in range(draw(st.integers(64, 90))):
        count, cpus, model = shapes[number % len(shapes)]
        members.append(
            HostSnapshot(
                id=f"big/h{number}",
                name=f"h{number}",
                fleet="big",
                state=HostState.READY,
                os="linux",
                arch="x86_64",
                cpus=cpus,
                memory_mib=cpus * 4096,
                disk_mib=500 * 1024,
                gpus=[
                    GpuSlot(index=i, name=model, vendor="nvidia", memory_mib=24576)
                    for i in range(count)
                ],
                task_queue=f"q-{number}",
            )
        )
    scorer = draw(st.sampled_from(["fragmentation", "binpack", "spread"]))
    return Snapshot(fleets=[FleetSnapshot(name="big", kind="sim", scorer=scorer, hosts=members)])


@SETTINGS
@given(
    large_fleets(),
    st.lists(st.tuples(st.integers(0, 30), st.integers(0, 3)), min_size=10, max_size=60),
    st.data(),
)
def test_the_kept_ranking_picks_what_a_full_pass_picks(
    snapshot: Snapshot, stream: list[tuple[int, int]], data: st.DataObject
) -> None:
    # Placing remembers, per kind of request, the usage states ranked by score and catches up
    # on the hosts that changed; releases make states vanish and come back, and change which
    # host comes first in a state. The dry run scores every host afresh.
    held: list[Placement] = []
    for number, action in stream:
        if action == 0 and held:
            release_placement(snapshot, held.pop(number % len(held)))
            continue
        job = data.draw(jobs(number))
        result = place(job, snapshot)
        assert result == explain(job, snapshot).verdict()
        assert result == place(job, fresh(snapshot))
        if isinstance(result, Placement):
            apply_placement(snapshot, result)
            held.append(result)
        check_capacity(snapshot)
