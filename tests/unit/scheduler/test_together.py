"""Planning several jobs together: each sees what the jobs before it take."""

from __future__ import annotations

from gpuflow.scheduler import explain
from gpuflow.scheduler.together import plan_together
from tests.unit.scheduler.conftest import HostLoader, JobBuilder, SnapshotBuilder


def test_each_job_sees_the_gpus_the_ones_before_it_take(
    host: HostLoader, snapshot: SnapshotBuilder, job: JobBuilder
) -> None:
    snap = snapshot(host("h100x8"))
    jobs = [job({"gpu": "H100:6"}, name="a"), job({"gpu": "H100:4"}, name="b")]
    # Alone, each fits on gpu-1.
    assert all(explain(j, snap).placement is not None for j in jobs)
    a, b = plan_together(jobs, snap)
    assert a.placement is not None and len(a.placement.nodes[0].gpu_indices) == 6
    assert a.alone is not None and not a.displaced
    assert b.placement is None and b.taken is None
    assert b.displaced and b.alone is not None and b.alone.nodes[0].host_name == "gpu-1"
    assert any("gpu-1" in str(r) for r in b.options[0].rejections)


def test_no_two_jobs_get_the_same_gpus_and_a_job_moves_to_the_free_host(
    host: HostLoader, snapshot: SnapshotBuilder, job: JobBuilder
) -> None:
    snap = snapshot(host("h100x8", name="gpu-1"), host("h100x8", name="gpu-2"))
    jobs = [job({"gpu": "H100:2"}, name=f"j{k}") for k in range(4)] + [
        job({"gpu": "H100:8"}, name="whole")
    ]
    plans = plan_together(jobs, snap)
    taken = [
        (node.host_name, gpu)
        for plan in plans
        if plan.placement is not None
        for node in plan.placement.nodes
        for gpu in node.gpu_indices
    ]
    assert len(taken) == len(set(taken)) == 16  # every job placed, no GPU twice
    whole = plans[-1]
    assert whole.placement is not None
    hosts_of_small = {p.placement.nodes[0].host_name for p in plans[:-1] if p.placement}
    assert whole.placement.nodes[0].host_name not in hosts_of_small


def test_a_gang_after_a_job_that_takes_one_of_its_hosts(
    host: HostLoader, snapshot: SnapshotBuilder, job: JobBuilder
) -> None:
    snap = snapshot(host("h100x8", name="gpu-1"), host("h100x8", name="gpu-2"))
    gang = job({"gpu": "H100:8"}, name="gang", nodes=2)
    small = job({"gpu": "H100:1"}, name="small")
    first, second = plan_together([small, gang], snap)
    assert first.placement is not None
    assert second.placement is None and second.displaced
    assert "needs 2 in one fleet" in " ".join(str(r) for r in second.options[0].rejections)
    # The other order: the gang takes both hosts whole, nothing is left for the small job.
    snap = snapshot(host("h100x8", name="gpu-1"), host("h100x8", name="gpu-2"))
    first, second = plan_together([gang, small], snap)
    assert first.placement is not None and len(first.placement.nodes) == 2
    assert second.placement is None


def test_alternatives_fall_back_in_order(
    host: HostLoader, snapshot: SnapshotBuilder, job: JobBuilder
) -> None:
    snap = snapshot(host("h100x8"))
    big = job({"gpu": "H100:8"}, name="big")
    flexible = job({"gpu": "H100:4"}, name="flex", alternatives=[{"gpu": "H100:0.5"}])
    _, plan = plan_together([job({"gpu": "H100:7"}, name="first"), flexible], snap)
    assert plan.taken == 1  # the share, since 4 whole GPUs are no longer free
    assert plan.placement is not None and plan.placement.nodes[0].gpu_fraction == 0.5
    assert plan_together([big], snapshot(host("h100x8")))[0].taken == 0


def test_a_plan_says_whether_the_job_could_ever_fit_its_fleets(
    host: HostLoader, snapshot: SnapshotBuilder, job: JobBuilder
) -> None:
    """Nothing fits now: a job that would fit on the fleets idle and ready waits for room (or a
    host's return); one that would not waits for a change of the fleets."""
    snap = snapshot(host("h100x8", name="gpu-1"), host("not-ready", name="down"))
    whole, later, gang, l4, a100 = plan_together(
        [
            job({"gpu": "H100:8"}, name="whole"),
            job({"gpu": "H100:8"}, name="later"),
            job({"gpu": "H100:1"}, name="gang", nodes=2),
            job({"gpu": "L4:1"}, name="l4"),
            job({"gpu": "A100:1"}, name="a100"),
        ],
        snap,
    )
    assert whole.placement is not None and whole.fits_idle
    assert later.placement is None and later.fits_idle  # room once `whole` ends
    assert gang.placement is None and not gang.fits_idle  # one H100 host in all
    assert l4.placement is None and not l4.fits_idle
    assert a100.placement is None and a100.fits_idle  # the host that is down may come back
    assert snap.hosts()[0].gpus[0].used == 1  # the caller's snapshot keeps its usage
