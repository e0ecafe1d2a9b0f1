"""The fast path keeps, per kind of request, the usage states ranked by score between
placements (gpuflow/scheduler/ranking.py). These cases walk it through the moves that could
leave it stale; the property test in test_invariants.py compares it with full passes."""

from __future__ import annotations

from gpuflow.scheduler import Placement, Snapshot, apply_placement, place, release_placement
from tests.unit.scheduler.conftest import HostLoader, JobBuilder, SnapshotBuilder

HOSTS = 70
"""Enough alike hosts for the fast path (it starts at 64)."""


def fleet(host: HostLoader, snapshot: SnapshotBuilder, scorer: str) -> Snapshot:
    return snapshot(*(host("h100x8", name=f"gpu-{i:02}") for i in range(HOSTS)), scorer=scorer)


def put(snap: Snapshot, job: JobBuilder, gpus: int = 1) -> Placement:
    result = place(job({"gpu": f"H100:{gpus}"}), snap)
    assert isinstance(result, Placement)
    apply_placement(snap, result)
    return result


def test_a_state_that_empties_and_fills_again_is_ranked_again(
    host: HostLoader, snapshot: SnapshotBuilder, job: JobBuilder
) -> None:
    snap = fleet(host, snapshot, "binpack")
    one, two = put(snap, job), put(snap, job)
    assert [one.nodes[0].host_name, two.nodes[0].host_name] == ["gpu-00", "gpu-00"]
    # gpu-00 goes back to idle: its states "one GPU taken" and "two taken" have no host left.
    release_placement(snap, two)
    release_placement(snap, one)
    assert put(snap, job).nodes[0].host_name == "gpu-00"
    # "One GPU taken" has a host again (the same one): bin-packing fills it, not gpu-01.
    assert put(snap, job).nodes[0].host_name == "gpu-00"


def test_ties_go_to_the_first_host_when_the_first_of_a_state_changes(
    host: HostLoader, snapshot: SnapshotBuilder, job: JobBuilder
) -> None:
    snap = fleet(host, snapshot, "spread")
    # Spread: each job takes the next idle host, gpu-00 .. gpu-02.
    taken = [put(snap, job) for _ in range(3)]
    assert [p.nodes[0].host_name for p in taken] == ["gpu-00", "gpu-01", "gpu-02"]
    # gpu-01 becomes idle again: the idle state's first host is now gpu-01, not gpu-03.
    release_placement(snap, taken[1])
    assert put(snap, job).nodes[0].host_name == "gpu-01"
    # gpu-00 too, and it comes before everything idle.
    release_placement(snap, taken[0])
    assert put(snap, job).nodes[0].host_name == "gpu-00"
    assert put(snap, job).nodes[0].host_name == "gpu-03"
