"""The fragmentation measure (gpuflow/scheduler/frag.py) on hand-checked cases."""

from __future__ import annotations

import pytest

from gpuflow.scheduler import TypicalRequest
from gpuflow.scheduler.frag import Workload
from gpuflow.scheduler.index import HostClass, index_of
from tests.unit.scheduler.conftest import HostLoader, SnapshotBuilder

IDLE = (1000,) * 8


def host_class(host: HostLoader, snapshot: SnapshotBuilder, cpus: int = 96) -> HostClass:
    return index_of(snapshot(host("h100x8", cpus=cpus))).views[0].cls


@pytest.mark.parametrize("idle", [1.0, 0.0])
def test_breaking_an_idle_host_is_never_a_gain_for_a_kind_it_holds_only_partly(
    host: HostLoader, snapshot: SnapshotBuilder, idle: float
) -> None:
    # A 96-CPU 8-GPU host holds one 60-CPU 4-GPU request, never two: 4 GPUs are out of that
    # kind's reach on the idle host already. Taking one GPU (and 8 CPUs) leaves 7 GPUs and 88
    # CPUs: still one such request, so nothing was lost for it.
    cls = host_class(host, snapshot)
    workload = Workload([TypicalRequest(weight=1, gpus=4, cpus=60)], capacity=1.0, idle=idle)
    before = workload.fragmentation(cls, IDLE, 96, 1 << 20)
    after = workload.fragmentation(cls, (0,) + (1000,) * 7, 88, 1 << 20)
    if idle:
        assert (before, after) == (0, 0)
    else:  # counted as FGD-like absolute loss, breaking the host looks like a 1-GPU gain
        assert (before, after) == (4000, 3000)


def test_what_using_a_host_makes_unusable_is_counted_beyond_the_idle_loss(
    host: HostLoader, snapshot: SnapshotBuilder
) -> None:
    # Same host and kind; taking 40 CPUs leaves 56: no 60-CPU request fits any more, and all
    # 7 free GPUs are lost to it (as in FGD), not 7 - 4 idle.
    cls = host_class(host, snapshot)
    workload = Workload([TypicalRequest(weight=1, gpus=4, cpus=60)], capacity=1.0)
    assert workload.fragmentation(cls, (0,) + (1000,) * 7, 56, 1 << 20) == 7000
    # Two GPUs taken, 80 CPUs left: one request still fits in the 6 free GPUs.
    assert workload.fragmentation(cls, (0, 0) + (1000,) * 6, 80, 1 << 20) == 0


def test_a_kind_that_never_fits_the_class_loses_all_of_it(
    host: HostLoader, snapshot: SnapshotBuilder
) -> None:
    cls = host_class(host, snapshot)
    workload = Workload([TypicalRequest(weight=1, gpus=8, cpus=120)], capacity=1.0)
    assert workload.fragmentation(cls, IDLE, 96, 1 << 20) == 8000


def pinned_weight(supply: dict[str, int], mix: list[TypicalRequest], scarcity: float) -> float:
    """Weight of the A100-pinned kind relative to the one that may run anywhere."""
    workload = Workload(mix, supply=supply, scarcity=scarcity)
    weights = {kind.names: kind.weight for kind in workload.kinds}
    return weights[frozenset({"A100"})] / weights[frozenset()]


def test_pinned_kinds_weigh_by_demand_per_gpu_as_far_as_they_can_fill_their_gpus() -> None:
    supply = {"A100": 25, "H100": 75}  # A100 is a quarter of the GPUs

    def mix(pinned: float) -> list[TypicalRequest]:
        return [
            TypicalRequest(weight=pinned, gpus=1, gpu_names=frozenset({"A100"})),
            TypicalRequest(weight=1 - pinned, gpus=1),
        ]

    # A quarter of the demand is pinned to a quarter of the GPUs: 4 times the demand per GPU.
    assert pinned_weight(supply, mix(0.25), 1.0) == pytest.approx(4 * 0.25 / 0.75)
    # Half of the demand: the pinned jobs more than fill the A100s; still 4 times per GPU.
    assert pinned_weight(supply, mix(0.5), 1.0) == pytest.approx(4 * 0.5 / 0.5)
    # A tenth: they fill 40% of the A100s, the rest goes to jobs that may run anywhere.
    assert pinned_weight(supply, mix(0.1), 1.0) == pytest.approx(4 * 0.4 * 0.1 / 0.9)
    # A fortieth: they would fill a tenth of them; never weighed below their share.
    assert pinned_weight(supply, mix(0.025), 1.0) == pytest.approx(0.025 / 0.975)
    # scarcity 0: FGD's weights, the share alone.
    assert pinned_weight(supply, mix(0.25), 0.0) == pytest.approx(0.25 / 0.75)
