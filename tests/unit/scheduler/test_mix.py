"""The learned request mix (gpuflow/scheduler/mix.py), checked by hand on small cases."""

from __future__ import annotations

import math

import pytest

from gpuflow.scheduler.frag import DEFAULT_MIX
from gpuflow.scheduler.index import index_of
from gpuflow.scheduler.mix import (
    DRIFT,
    MIN_HALF_LIFE,
    PRIOR_JOBS,
    MixLearner,
    drift,
    half_life,
    kind_of,
    learned_mix,
)
from gpuflow.scheduler.model import (
    FleetSnapshot,
    GpuSlot,
    HostSnapshot,
    Snapshot,
    TypicalRequest,
)
from gpuflow.scheduler.scorers import scoring_for
from gpuflow.specs import JobSpec
from gpuflow.status import HostState

A = (1, None, 8.0, 32768, frozenset[str]())
B = (0, 0.5, 4.0, 16384, frozenset({"T4"}))


def _job(resources: dict[str, object], **extra: object) -> JobSpec:
    return JobSpec.model_validate(
        {"name": "j", "commands": ["true"], "resources": resources, **extra}
    )


def _weights(learner: MixLearner) -> dict[object, float]:
    return {
        (r.gpus, r.gpu_fraction, r.cpus, r.memory_mib, r.gpu_names): r.weight
        for r in learner.mix().requests
    }


def test_no_history_is_the_built_in_mix() -> None:
    mix = MixLearner(10).mix()
    assert mix.source == "built-in" and mix.jobs == 0
    assert mix.requests == DEFAULT_MIX


def test_one_job_weighs_as_one_of_prior_plus_one() -> None:
    learner = MixLearner(100)
    learner.observe(A)
    mix = learner.mix()
    assert mix.source == "learned" and mix.jobs == pytest.approx(1.0)
    weights = _weights(learner)
    # 1 job against a prior worth 8: the job 1/9, the built-in mix 8/9 of its own shares
    whole = DEFAULT_MIX[3]  # 1 GPU, 8 CPUs, 32 GiB: the same kind as A, so the two add up
    assert (whole.gpus, whole.cpus, whole.memory_mib) == (1, 8, 32768)
    assert weights[A] == pytest.approx(1 / 9 + 8 / 9 * 0.40)
    assert math.fsum(weights.values()) == pytest.approx(1.0)


def test_older_jobs_halve_every_half_life() -> None:
    learner = MixLearner(1)  # half-life of one job: A (older) 1/2, B 1
    learner.observe(A)
    learner.observe(B)
    assert learner.jobs == pytest.approx(1.5)
    learned = 1.5 / (1.5 + PRIOR_JOBS)
    weights = _weights(learner)
    assert weights[B] == pytest.approx(learned * 2 / 3)
    assert weights[A] - 8 / 9.5 * 0.40 == pytest.approx(learned * 1 / 3)


def test_long_history_is_rescaled_and_prior_fades() -> None:
    learner = MixLearner(2)
    for _ in range(2000):  # 2 ** (2000 / 2) would overflow a float without rescaling
        learner.observe(B)
    # effective history: sum of 2 ** (-i / 2) = 1 / (1 - 2 ** -0.5)
    assert learner.jobs == pytest.approx(1 / (1 - 2**-0.5))
    assert learner.observed == 2000
    weights = _weights(learner)
    assert weights[B] == pytest.approx(learner.jobs / (learner.jobs + PRIOR_JOBS))


def test_half_life_is_the_fleet_s_gpus_with_a_floor() -> None:
    assert half_life(8) == MIN_HALF_LIFE
    assert half_life(6212) == 6212
    with pytest.raises(ValueError):
        MixLearner(0)


def test_kind_of_reads_the_request_like_the_scheduler() -> None:
    shared = _job({"gpu": {"names": ["t4"], "count": 0.5}, "cpu": 4, "memory": "16GB"})
    assert kind_of(shared) == ((0, 0.5, 4.0, 16384, frozenset({"T4"})), 1)
    gang = _job({"gpu": "A100:8", "cpu": "32..64", "memory": "256GB"}, nodes=2)
    assert kind_of(gang) == ((8, None, 32.0, 262144, frozenset({"A100"})), 2)
    cpu = _job({"cpu": 2})
    assert kind_of(cpu) == ((0, None, 2.0, 0, frozenset()), 1)


def test_learned_mix_feeds_jobs_oldest_first() -> None:
    one = _job({"gpu": 1, "cpu": 8, "memory": "32GB"})
    half = _job({"gpu": 0.5, "cpu": 4, "memory": "16GB"})
    mix = learned_mix([one] * 3 + [half], fleet_gpus=4)
    share = {(r.gpus, r.gpu_fraction): r.weight for r in mix.requests if not r.gpu_names}
    g = 2 ** (-1 / MIN_HALF_LIFE)  # the newest (half) weighs 1, the ones before g, g^2, g^3
    jobs = 1 + g + g**2 + g**3
    learned = jobs / (jobs + PRIOR_JOBS)
    assert mix.jobs == pytest.approx(jobs)
    built_in = {(r.gpus, r.gpu_fraction): r.weight for r in DEFAULT_MIX}
    assert share[0, 0.5] == pytest.approx(learned / jobs + (1 - learned) * built_in[0, 0.5])


def test_drift_is_the_share_that_moved() -> None:
    a = {A: 0.5, B: 0.5}
    assert drift(a, a) == 0
    assert drift(a, {A: 1.0}) == pytest.approx(0.5)
    assert drift({A: 1.0}, {B: 1.0}) == pytest.approx(1.0)
    assert drift({A: 0.7, B: 0.3}, {A: 0.4, B: 0.6}) == pytest.approx(0.3)


def test_refreshed_replaces_the_mix_only_once_it_moved() -> None:
    learner = MixLearner(1000)
    learner.observe(A)
    first = learner.refreshed(None)
    assert first is not None and first.source == "learned"
    learner = MixLearner(1000)
    for _ in range(100):
        learner.observe(A)
    in_use = learner.mix()
    for _ in range(3):
        learner.observe(A)
        assert learner.refreshed(in_use) is None  # the same requests: nothing moved
    for _ in range(100):  # as many B: half of the learned weight moved to B
        learner.observe(B)
    fresh = learner.refreshed(in_use)
    assert fresh is not None
    assert drift(in_use.shares or {}, fresh.shares or {}) >= DRIFT


def _fleet(workload: list[TypicalRequest]) -> Snapshot:
    host = HostSnapshot(
        id="f/h",
        name="h",
        fleet="f",
        state=HostState.READY,
        os="linux",
        arch="x86_64",
        cpus=16,
        memory_mib=65536,
        disk_mib=1 << 20,
        gpus=[GpuSlot(index=i, name="T4", vendor="nvidia", memory_mib=15360) for i in range(2)],
    )
    return Snapshot(fleets=[FleetSnapshot(name="f", kind="sim", hosts=[host], workload=workload)])


def test_scorer_uses_the_fleet_s_current_mix() -> None:
    learner = MixLearner(10)
    learner.observe(A)
    snapshot = _fleet(list(learner.mix().requests))
    fleet = snapshot.fleets[0]
    index = index_of(snapshot)
    first = scoring_for(index, fleet, None, "j").workload
    assert scoring_for(index, fleet, None, "j").workload is first  # same list: same prepared mix
    learner.observe(B)
    fleet.workload = list(learner.mix().requests)  # replaced, same length or not
    second = scoring_for(index, fleet, None, "j").workload
    assert second is not first and second is not None
    names = {kind.names for kind in second.kinds}
    assert frozenset({"T4"}) in names and frozenset({"T4"}) not in {k.names for k in first.kinds}


def test_an_unknown_scorer_is_refused_not_replaced_by_the_default() -> None:
    snapshot = _fleet([])
    index = index_of(snapshot)
    assert scoring_for(index, snapshot.fleets[0], "spread", "j").name == "spread"
    with pytest.raises(ValueError, match="unknown scorer 'fgd'"):
        scoring_for(index, snapshot.fleets[0], "fgd", "j")
