"""Placement behaviour: scenarios of the issue, and the rules of docs/architecture.md
("Placement")."""

from __future__ import annotations

import pytest

from gpuflow.scheduler import (
    FleetSnapshot,
    Placement,
    Snapshot,
    TypicalRequest,
    Unschedulable,
    apply_placement,
    blocks_busy,
    explain,
    place,
    release_placement,
)
from gpuflow.status import HostState
from tests.unit.scheduler.conftest import HostLoader, JobBuilder, SnapshotBuilder


def placed(result: Placement | Unschedulable) -> Placement:
    assert isinstance(result, Placement), (
        result.message() if isinstance(result, Unschedulable) else result
    )
    return result


def test_not_ready_host_is_never_chosen_even_when_its_gpus_are_named(
    host: HostLoader, snapshot: SnapshotBuilder, job: JobBuilder
) -> None:
    snap = snapshot(host("not-ready"), host("a100x8-blocks"))
    automatic = placed(place(job({"gpu": "A100:1"}), snap))
    assert automatic.nodes[0].host_name == "node-3"
    by_gpu = place(job({"gpu": "A100:1"}, placement={"gpus": ["gpu-2:0"]}), snap)
    by_host = place(job({"gpu": "A100:1"}, placement={"hosts": ["gpu-2"]}), snap)
    for result in (by_gpu, by_host):
        assert isinstance(result, Unschedulable)
        assert result.lines == ["gpu-2: not ready (last heartbeat 3m ago)"]


def test_cuda_job_never_lands_on_a_mac_automatically_or_by_hand(
    host: HostLoader, snapshot: SnapshotBuilder, job: JobBuilder
) -> None:
    cuda = {"gpu": "nvidia:1", "os": "linux"}
    automatic = place(job(cuda), snapshot(host("mac-m2-ultra")))
    by_hand = place(job(cuda, placement={"hosts": ["mac-1"]}), snapshot(host("mac-m2-ultra")))
    by_gpu = place(job(cuda, placement={"gpus": ["mac-1:0"]}), snapshot(host("mac-m2-ultra")))
    for result in (automatic, by_hand, by_gpu):
        assert isinstance(result, Unschedulable)
        assert result.lines == ["mac-1: needs CUDA, host has Metal"]
    # With a Linux host next to it, the Linux host is chosen, never the Mac.
    mixed = snapshot(host("mac-m2-ultra"), host("h100x8"))
    assert placed(place(job(cuda), mixed)).nodes[0].host_name == "gpu-1"


def test_two_node_job_reuses_split_hosts_after_their_blocks_are_released(
    host: HostLoader, snapshot: SnapshotBuilder, job: JobBuilder
) -> None:
    snap = snapshot(host("a100x8-blocks", name="node-3"), host("a100x8-blocks", name="node-5"))
    singles = []
    for i in range(5):
        single = placed(place(job({"gpu": "A100:2"}, name=f"s{i}"), snap))
        apply_placement(snap, single)
        singles.append(single)
    nodes = snap.fleets[0].hosts
    assert sum(blocks_busy(h)[0] for h in nodes) == 5
    gang = job({"gpu": "A100:8"}, nodes=2, name="gang")
    assert isinstance(place(gang, snap), Unschedulable)
    for single in singles:
        release_placement(snap, single)
    assert [blocks_busy(h) for h in nodes] == [(0, 4), (0, 4)]
    result = placed(place(gang, snap))
    assert [(n.rank, n.host_name) for n in result.nodes] == [(0, "node-3"), (1, "node-5")]
    assert all(n.blocks == [0, 1, 2, 3] and n.gpu_indices == list(range(8)) for n in result.nodes)
    apply_placement(snap, result)
    assert [blocks_busy(h) for h in nodes] == [(4, 4), (4, 4)]


def test_gang_is_all_or_nothing_and_within_one_fleet(
    host: HostLoader, snapshot: SnapshotBuilder, job: JobBuilder
) -> None:
    snap = snapshot(host("h100x8", name="a-1", fleet="a"), host("h100x8", name="b-1", fleet="b"))
    result = place(job({"gpu": 8}, nodes=2), snap)
    assert isinstance(result, Unschedulable)
    assert all(not h.blocks_used and h.gpus[0].used == 0 for h in snap.hosts())


def test_binpack_fills_one_host_before_the_next_and_spread_does_the_opposite(
    host: HostLoader, snapshot: SnapshotBuilder, job: JobBuilder
) -> None:
    def hosts_used(scorer: str) -> list[str]:
        snap = snapshot(host("h100x8", name="gpu-1"), host("h100x8", name="gpu-3"), scorer=scorer)
        names = []
        for i in range(8):
            result = placed(place(job({"gpu": "H100:2"}, name=f"j{i}"), snap))
            apply_placement(snap, result)
            names.append(result.nodes[0].host_name)
        return names

    assert hosts_used("binpack") == ["gpu-1"] * 4 + ["gpu-3"] * 4
    assert hosts_used("spread") == ["gpu-1", "gpu-3"] * 4


def test_job_scorer_beats_the_fleet_scorer(
    host: HostLoader, snapshot: SnapshotBuilder, job: JobBuilder
) -> None:
    snap = snapshot(host("h100x8", name="gpu-1"), host("h100x8", name="gpu-3"), scorer="binpack")
    first = placed(place(job({"gpu": 2}, scorer="spread"), snap))
    apply_placement(snap, first)
    second = placed(place(job({"gpu": 2}, scorer="spread"), snap))
    assert (first.nodes[0].host_name, second.nodes[0].host_name) == ("gpu-1", "gpu-3")
    assert second.scorer == "spread"


def test_count_range_takes_as_many_free_gpus_as_allowed(
    host: HostLoader, snapshot: SnapshotBuilder, job: JobBuilder
) -> None:
    node = host("h100x8")
    for gpu in node.gpus[:5]:
        gpu.used = 1.0
    snap = snapshot(node)
    assert placed(place(job({"gpu": "H100:1..2"}), snap)).nodes[0].gpu_indices == [5, 6]
    assert placed(place(job({"gpu": "H100:2..8"}), snap)).nodes[0].gpu_indices == [5, 6, 7]
    assert isinstance(place(job({"gpu": "H100:4..8"}), snap), Unschedulable)


def test_fractions_share_a_gpu_and_never_exceed_it(
    host: HostLoader, snapshot: SnapshotBuilder, job: JobBuilder
) -> None:
    snap = snapshot(host("h100x8"))
    shares = []
    for i in range(4):
        result = placed(place(job({"gpu": 0.5}, name=f"f{i}"), snap))
        apply_placement(snap, result)
        shares.append((result.nodes[0].gpu_indices[0], result.nodes[0].gpu_fraction))
    gpu_of = [index for index, _ in shares]
    assert all(fraction == 0.5 for _, fraction in shares)
    assert sorted(gpu_of.count(i) for i in set(gpu_of)) == [2, 2]
    assert all(gpu.used <= 1 for gpu in snap.hosts()[0].gpus)
    # 0.3 does not fit a full GPU; it opens another one.
    third = placed(place(job({"gpu": 0.3}), snap))
    assert third.nodes[0].gpu_indices[0] not in gpu_of


def test_blocks_take_the_fewest_that_fit(
    host: HostLoader, snapshot: SnapshotBuilder, job: JobBuilder
) -> None:
    snap = snapshot(host("a100x8-blocks"))
    one = placed(place(job({"gpu": "A100:1"}), snap))
    assert (one.nodes[0].blocks, one.nodes[0].gpu_indices, one.nodes[0].cpus) == ([0], [0], 16)
    apply_placement(snap, one)
    three = placed(place(job({"gpu": "A100:3", "cpu": 4}), snap))
    assert three.nodes[0].blocks == [1, 2]
    assert three.nodes[0].gpu_indices == [2, 3, 4]
    cpu_heavy = placed(place(job({"cpu": 40}), snap))
    assert len(cpu_heavy.nodes[0].blocks) == 3  # 40 CPUs need three 16-CPU blocks
    assert blocks_busy(snap.hosts()[0]) == (1, 4)


def test_cpu_jobs_prefer_cpu_hosts_and_respect_gpu_host_taints(
    host: HostLoader, snapshot: SnapshotBuilder, job: JobBuilder
) -> None:
    snap = snapshot(host("h100x8"), host("cpu-only"))
    assert placed(place(job({"cpu": 4}), snap)).nodes[0].host_name == "cpu-1"
    # A GPU host without taints takes CPU jobs too.
    assert placed(place(job({"cpu": 4}), snapshot(host("h100x8")))).nodes[0].host_name == "gpu-1"
    tainted = snapshot(host("h100x8", taints=["gpu-only"]))
    assert isinstance(place(job({"cpu": 4}), tainted), Unschedulable)


def test_node_placement_carries_what_the_workflow_needs(
    host: HostLoader, snapshot: SnapshotBuilder, job: JobBuilder
) -> None:
    snap = snapshot(host("h100x8", simulated=True))
    node = placed(place(job({"gpu": "H100:2", "cpu": 8, "memory": "64GB"}), snap)).nodes[0]
    assert node.rank == 0
    assert node.host_id == "lab/gpu-1"
    assert node.task_queue == "host-gpu-1"
    assert node.address == "10.0.0.11"
    assert node.simulated is True
    assert node.gpu_names == ["H100", "H100"]
    assert (node.cpus, node.memory_mib) == (8, 64 * 1024)


def test_fleets_are_tried_in_order(
    host: HostLoader, snapshot: SnapshotBuilder, job: JobBuilder
) -> None:
    snap = snapshot(host("h100x8", name="a-1", fleet="a"), host("h100x8", name="b-1", fleet="b"))
    assert placed(place(job({"gpu": 1}), snap)).fleet == "a"
    assert placed(place(job({"gpu": 1}, fleets=["b", "a"]), snap)).fleet == "b"
    assert placed(place(job({"gpu": 1}, fleets=["b", "a"]), snap, fleets=["a"])).fleet == "a"


def test_explain_lists_fits_best_first_and_agrees_with_place(
    host: HostLoader, snapshot: SnapshotBuilder, job: JobBuilder
) -> None:
    busy = host("h100x8", name="gpu-3")
    busy.gpus[0].used = 1.0
    snap = snapshot(host("h100x8"), busy, host("mac-m2-ultra"), host("not-ready"))
    spec = job({"gpu": "nvidia:1"})
    offers = explain(spec, snap)
    assert [offer.host for offer in offers.fits] == ["gpu-3", "gpu-1"]
    assert offers.fits[0].score >= offers.fits[1].score
    assert offers.fits[0].gpus == "1x H100 80GB (1)"
    assert [str(r) for r in offers.rejections] == [
        "gpu-2: not ready (last heartbeat 3m ago)",
        "mac-1: needs CUDA, host has Metal",
    ]
    assert offers.placement == place(spec, snap)
    assert offers.verdict() == offers.placement


def test_apply_refuses_to_go_over_capacity(
    host: HostLoader, snapshot: SnapshotBuilder, job: JobBuilder
) -> None:
    snap = snapshot(host("h100x8"))
    result = placed(place(job({"gpu": 8}), snap))
    apply_placement(snap, result)
    with pytest.raises(ValueError, match="GPU 0 is taken"):
        apply_placement(snap, result)
    release_placement(snap, result)
    release_placement(snap, result)  # never below zero
    assert all(gpu.used == 0 for gpu in snap.hosts()[0].gpus)


def test_usage_edited_by_hand_is_noticed(
    host: HostLoader, snapshot: SnapshotBuilder, job: JobBuilder
) -> None:
    snap = snapshot(host("h100x8", name="gpu-1"), host("h100x8", name="gpu-3"))
    first = placed(place(job({"gpu": 8}), snap))
    # The store could hand back a snapshot edited in place; the scheduler must not trust what it
    # read before.
    for gpu in snap.fleets[0].hosts[0].gpus:
        gpu.used = 1.0
    second = placed(place(job({"gpu": 8}), snap))
    assert first.nodes[0].host_name == "gpu-1"
    assert second.nodes[0].host_name == "gpu-3"


def test_state_changed_in_place_is_noticed(
    host: HostLoader, snapshot: SnapshotBuilder, job: JobBuilder
) -> None:
    snap = snapshot(host("h100x8"))
    assert isinstance(place(job({"gpu": 1}), snap), Placement)
    snap.fleets[0].hosts[0].state = HostState.MAINTENANCE
    assert isinstance(place(job({"gpu": 1}), snap), Unschedulable)
    snap.fleets[0].hosts[0].state = HostState.READY
    assert isinstance(place(job({"gpu": 1}), snap), Placement)


def test_hosts_added_to_a_fleet_are_seen(
    host: HostLoader, snapshot: SnapshotBuilder, job: JobBuilder
) -> None:
    snap = Snapshot(fleets=[FleetSnapshot(name="lab", kind="sim", hosts=[host("cpu-only")])])
    assert isinstance(place(job({"gpu": 1}), snap), Unschedulable)
    snap.fleets[0].hosts.append(host("h100x8"))
    assert placed(place(job({"gpu": 1}), snap)).nodes[0].host_name == "gpu-1"


@pytest.mark.parametrize(("scarcity", "expected"), [(1.0, "h100-1"), (0.0, "a100")])
def test_unpinned_job_leaves_the_scarce_model_to_jobs_pinned_to_it(
    host: HostLoader, snapshot: SnapshotBuilder, job: JobBuilder, scarcity: float, expected: str
) -> None:
    # As many jobs are pinned to the one A100 host as to the three H100 hosts: per GPU, the
    # A100s are wanted three times as much. Weighing by request counts alone (FGD's, scarcity 0)
    # sees a tie, which goes to the host listed first.
    a100 = [{"name": "A100", "memory": "80GB", "count": 8}]
    snap = snapshot(
        host("h100x8", name="a100", gpus=a100),
        *(host("h100x8", name=f"h100-{i}") for i in (1, 2, 3)),
        weights={"scarcity": scarcity},
    )
    snap.fleets[0].workload = [
        TypicalRequest(weight=weight, gpus=1, cpus=8, memory_mib=32 * 1024, gpu_names=names)
        for weight, names in (
            (0.4, frozenset[str]()),
            (0.3, frozenset({"A100"})),
            (0.3, frozenset({"H100"})),
        )
    ]
    result = placed(place(job({"gpu": 1, "cpu": 8, "memory": "32GB"}), snap))
    assert result.nodes[0].host_name == expected


def test_named_gpus_restrict_only_their_own_host_and_named_hosts_keep_all_theirs(
    host: HostLoader, snapshot: SnapshotBuilder, job: JobBuilder
) -> None:
    """`placement.gpus` limits the hosts it names to those GPUs and allows them; a host in
    `placement.hosts` that it does not name keeps all its GPUs (Selection.gpus says so)."""
    pinned = {"hosts": ["gpu-1"], "gpus": ["gpu-2:3"]}
    snap = snapshot(host("h100x8", name="gpu-1"), host("h100x8", name="gpu-2"))
    whole = placed(place(job({"gpu": 8}, placement=pinned), snap))
    assert (whole.nodes[0].host_name, whole.nodes[0].gpu_indices) == ("gpu-1", list(range(8)))
    full = host("h100x8", name="gpu-1")
    for gpu in full.gpus:
        gpu.used = 1.0
    snap = snapshot(full, host("h100x8", name="gpu-2"))
    one = placed(place(job({"gpu": 1}, placement=pinned), snap))
    assert (one.nodes[0].host_name, one.nodes[0].gpu_indices) == ("gpu-2", [3])
    two = place(job({"gpu": 2}, placement=pinned), snap)
    assert isinstance(two, Unschedulable)
    assert two.lines == [
        "gpu-1: 0 of 8 GPUs free, job needs 2",
        "gpu-2: has 1 named GPU, job needs 2 GPUs",
    ]
