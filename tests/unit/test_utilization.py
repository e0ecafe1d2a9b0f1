"""The utilization verdict: windows, coverage, gaps, re-deliveries and constant state size."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuflow.specs.job import UtilizationPolicy
from gpuflow.utilization import (
    GpuSample,
    UtilizationState,
    break_coverage,
    check_interval_s,
    summarize,
    update,
    verdict,
)

T0 = 1_700_000_000.0
POLICY = UtilizationPolicy(min_gpu_utilization=50, time_window="10m")


def samples(
    gpu: int, start: float, end: float, utilization: float, step: float = 5.0
) -> list[GpuSample]:
    """Samples every `step` seconds over [start, end], offsets from T0."""
    out = []
    t = start
    while t <= end:
        out.append(
            GpuSample(
                gpu=gpu,
                ts=T0 + t,
                utilization=utilization,
                memory_used_mib=1000,
                memory_total_mib=81559,
            )
        )
        t += step
    return out


def fed(*batches: list[GpuSample], node: int = 0, nodes: int = 1) -> UtilizationState:
    state = UtilizationState(nodes=nodes)
    for batch in batches:
        update(state, node, batch, policy=POLICY, max_gap_s=15)
    return state


def test_idle_gpu_is_terminated_once_samples_cover_the_window() -> None:
    violation = verdict(fed(samples(1, 0, 600, 10)), POLICY)
    assert violation is not None
    assert (violation.node, violation.gpu) == (0, 1)
    assert violation.message == "GPU 1 utilization stayed below 50% for 10m"
    assert violation.idle_since == T0


def test_job_younger_than_the_window_is_not_terminated() -> None:
    assert verdict(fed(samples(0, 0, 595, 0)), POLICY) is None


def test_busy_gpu_is_not_terminated() -> None:
    assert verdict(fed(samples(0, 0, 3600, 90)), POLICY) is None


def test_utilization_equal_to_the_threshold_is_not_idle() -> None:
    assert verdict(fed(samples(0, 0, 3600, 50)), POLICY) is None
    assert verdict(fed(samples(0, 0, 3600, 49.9)), POLICY) is not None


def test_zero_threshold_never_terminates() -> None:
    policy = UtilizationPolicy(min_gpu_utilization=0, time_window=60)
    state = UtilizationState()
    update(state, 0, samples(0, 0, 600, 0), policy=policy, max_gap_s=15)
    assert verdict(state, policy) is None


def test_busy_sample_on_the_window_edge_saves_the_job() -> None:
    # Newest sample at 700; the window is [100, 700] and a busy sample sits at exactly 100.
    state = fed(samples(0, 0, 95, 10), samples(0, 100, 100, 80), samples(0, 105, 700, 10))
    assert verdict(state, POLICY) is None
    # Five seconds later the busy sample has left the window.
    update(state, 0, samples(0, 705, 705, 10), policy=POLICY, max_gap_s=15)
    violation = verdict(state, POLICY)
    assert violation is not None
    assert violation.idle_since == T0 + 100


def test_gpu_that_recovers_just_in_time_is_kept() -> None:
    state = fed(samples(0, 0, 595, 10), samples(0, 600, 600, 75))
    assert verdict(state, POLICY) is None


def test_gap_longer_than_max_gap_restarts_coverage() -> None:
    # Idle all along, but nothing arrived between 300 and 330 (agent unreachable).
    state = fed(samples(0, 0, 300, 0), samples(0, 330, 900, 0))
    assert verdict(state, POLICY) is None
    update(state, 0, samples(0, 905, 930, 0), policy=POLICY, max_gap_s=15)
    violation = verdict(state, POLICY)
    assert violation is not None
    assert violation.idle_since == T0 + 330


def test_gap_of_exactly_max_gap_keeps_coverage() -> None:
    state = fed(samples(0, 0, 300, 0), samples(0, 315, 600, 0))
    assert verdict(state, POLICY) is not None


def test_missing_samples_never_count_as_idle() -> None:
    # A single idle sample at the start and one ten minutes later: idle, but not covered.
    state = fed(samples(0, 0, 0, 0), samples(0, 600, 600, 0))
    assert verdict(state, POLICY) is None


def test_break_coverage_restarts_the_window() -> None:
    state = fed(samples(0, 0, 300, 0))
    break_coverage(state, node=0)
    update(state, 0, samples(0, 305, 600, 0), policy=POLICY, max_gap_s=15)
    assert verdict(state, POLICY) is None
    update(state, 0, samples(0, 605, 905, 0), policy=POLICY, max_gap_s=15)
    assert verdict(state, POLICY) is not None


def test_only_one_idle_gpu_of_many_is_enough() -> None:
    batch = samples(0, 0, 900, 95) + samples(1, 0, 900, 2) + samples(2, 0, 900, 70)
    violation = verdict(fed(batch), POLICY)
    assert violation is not None
    assert violation.gpu == 1


def test_multi_node_message_names_the_node() -> None:
    state = UtilizationState(nodes=2)
    update(state, 0, samples(0, 0, 900, 95), policy=POLICY, max_gap_s=15)
    update(state, 1, samples(0, 0, 900, 95) + samples(1, 0, 900, 3), policy=POLICY, max_gap_s=15)
    violation = verdict(state, POLICY)
    assert violation is not None
    assert (violation.node, violation.gpu) == (1, 1)
    assert violation.message == "node 1 GPU 1 utilization stayed below 50% for 10m"


def test_redelivered_and_out_of_order_samples_are_ignored() -> None:
    idle = samples(0, 0, 600, 10)
    state = fed(idle, idle, list(reversed(idle)))
    assert verdict(state, POLICY) is not None
    # A late busy sample from the past does not rewrite history.
    update(state, 0, samples(0, 300, 300, 100), policy=POLICY, max_gap_s=15)
    assert verdict(state, POLICY) is not None
    assert len(state.gpus["0/0"].recent) == 60


def test_unsorted_batch_reads_like_a_sorted_one() -> None:
    batch = samples(0, 0, 600, 10) + samples(0, 0, 600, 10)
    shuffled = batch[::2][::-1] + batch[1::2]
    assert fed(shuffled) == fed(sorted(batch, key=lambda s: s.ts))


def test_changing_the_threshold_restarts_the_idle_clock() -> None:
    state = fed(samples(0, 0, 590, 30))  # idle under POLICY's 50%
    lower = UtilizationPolicy(min_gpu_utilization=40, time_window="10m")
    update(state, 0, samples(0, 595, 1190, 30), policy=lower, max_gap_s=15)
    assert verdict(state, lower) is None  # idle clock restarted at 590, the switch
    assert verdict(state, POLICY) is None  # not the threshold being tracked any more
    update(state, 0, samples(0, 1195, 1195, 30), policy=lower, max_gap_s=15)
    assert verdict(state, lower) is not None


def test_no_policy_tracks_readings_but_never_terminates() -> None:
    state = UtilizationState()
    update(state, 0, samples(0, 0, 3600, 0), policy=None, max_gap_s=15)
    assert verdict(state, None) is None
    assert verdict(state, POLICY) is None
    [row] = summarize(state)
    assert row.idle_for_s is None


def test_summary_shows_newest_reading_and_idle_time() -> None:
    state = fed(samples(1, 0, 120, 10) + samples(0, 0, 120, 90))
    rows = summarize(state)
    assert [(r.node, r.gpu) for r in rows] == [(0, 0), (0, 1)]
    assert rows[0].utilization == 90 and rows[0].idle_for_s == 0
    assert rows[1].utilization == 10 and rows[1].idle_for_s == 120
    assert rows[1].at == T0 + 120
    assert (rows[1].memory_used_mib, rows[1].memory_total_mib) == (1000, 81559)
    assert not rows[1].simulated


def test_state_survives_a_json_round_trip() -> None:
    state = fed(samples(0, 0, 600, 10))
    again = UtilizationState.model_validate_json(state.model_dump_json())
    assert again == state
    assert verdict(again, POLICY) == verdict(state, POLICY)


def test_state_size_is_constant_for_a_seven_day_window() -> None:
    policy = UtilizationPolicy(min_gpu_utilization=50, time_window="7d")
    state = UtilizationState()
    sizes = []
    per_hour = 360  # one sample every 10 s
    for hour in range(7 * 24):
        batch = [
            GpuSample(
                gpu=0,
                ts=T0 + (hour * per_hour + i) * 10,
                utilization=10,
                memory_used_mib=1000,
                memory_total_mib=81559,
            )
            for i in range(per_hour)
        ]
        update(state, 0, batch, policy=policy, max_gap_s=15)
        sizes.append(len(state.model_dump_json()))
        assert verdict(state, policy) is None
    # One more sample completes the closed 7-day window: 60,481 samples in all.
    update(state, 0, samples(0, 7 * 86400, 7 * 86400, 10), policy=policy, max_gap_s=15)
    violation = verdict(state, policy)
    assert violation is not None
    assert violation.message == "GPU 0 utilization stayed below 50% for 7d"
    assert max(sizes) - min(sizes) < 32
    assert max(sizes) < 4_000
    assert len(state.gpus["0/0"].recent) == 60


def test_check_interval_is_a_sixth_of_the_window_within_10s_and_1m() -> None:
    assert check_interval_s(UtilizationPolicy(min_gpu_utilization=1, time_window=60)) == 10
    assert check_interval_s(UtilizationPolicy(min_gpu_utilization=1, time_window=180)) == 30
    assert check_interval_s(UtilizationPolicy(min_gpu_utilization=1, time_window="10m")) == 60
    assert check_interval_s(UtilizationPolicy(min_gpu_utilization=1, time_window="7d")) == 60
    assert check_interval_s(None) == 60


# -- property: the constant-size state agrees with a brute force over every sample --------


def accept(kept: dict[int, list[GpuSample]], batch: list[GpuSample]) -> None:
    """Keep every sample newer than the newest kept one of its GPU (a batch in time order)."""
    for sample in sorted(batch, key=lambda s: (s.gpu, s.ts)):
        seen = kept.setdefault(sample.gpu, [])
        if not seen or sample.ts > seen[-1].ts:
            seen.append(sample)


def reference(
    kept: dict[int, list[GpuSample]], policy: UtilizationPolicy, max_gap_s: float
) -> int | None:
    """The rule read literally over the samples kept: the first GPU whose samples reach back,
    gap-free, to the window's edge and are all below the threshold from the edge on."""
    for gpu in sorted(kept):
        seen = kept[gpu]
        edge = seen[-1].ts - policy.time_window
        i = len(seen) - 1
        while seen[i].ts > edge and i > 0 and seen[i].ts - seen[i - 1].ts <= max_gap_s:
            i -= 1
        covered = seen[i].ts <= edge
        in_window = [s for s in seen[i:] if s.ts >= edge]
        if covered and all(s.utilization < policy.min_gpu_utilization for s in in_window):
            return gpu
    return None


STEPS = [5] * 24 + [-30, -5, 0, 0, 1, 10, 15, 16, 40]
"""Mostly the agent's steady 5 s; sometimes a re-delivery, a late sample or a gap."""
LEVELS: list[float | None] = [None] * 42 + [0, 49, 49.5, 50, 51, 100]
"""A GPU keeps its level (None) most of the time, so long idle stretches and edges are common."""
EVENTS = list(itertools.product([0, 0, 0, 1], STEPS, LEVELS, [True, True, False]))
"""(gpu, step, new level, end of batch): one draw per sample keeps generation cheap."""


@st.composite
def deliveries(draw: st.DrawFn) -> list[list[GpuSample]]:
    """Samples of GPUs 0 and 1, delivered in batches (mostly one sample at a time, so that
    the verdict is checked at every edge)."""
    count = draw(st.integers(1, 160))  # st.lists alone favours short lists
    events = draw(st.lists(st.sampled_from(EVENTS), min_size=count, max_size=count))
    clocks = {0: 0, 1: 0}
    level = {0: 0.0, 1: 0.0}
    batches: list[list[GpuSample]] = [[]]
    for gpu, step, new_level, last_in_batch in events:
        clocks[gpu] += step
        if new_level is not None:
            level[gpu] = new_level
        batches[-1].append(
            GpuSample(
                gpu=gpu, ts=float(clocks[gpu]), utilization=level[gpu],
                memory_used_mib=1, memory_total_mib=2,
            )
        )  # fmt: skip
        if last_in_batch:
            batches.append([])
    return [batch for batch in batches if batch]


@settings(max_examples=200, deadline=None)
@given(
    batches=deliveries(),
    window=st.sampled_from([60, 75]),
    threshold=st.sampled_from([0, 50, 50, 50, 100]),
    max_gap_s=st.sampled_from([5.0, 10.0, 15.0]),
)
def test_verdict_matches_brute_force(
    batches: list[list[GpuSample]], window: int, threshold: int, max_gap_s: float
) -> None:
    policy = UtilizationPolicy(min_gpu_utilization=threshold, time_window=window)
    state = UtilizationState()
    kept: dict[int, list[GpuSample]] = {}
    for batch in batches:
        update(state, 0, batch, policy=policy, max_gap_s=max_gap_s)
        accept(kept, batch)
        got = verdict(state, policy)
        assert (None if got is None else got.gpu) == reference(kept, policy, max_gap_s)


def test_quiet_until_only_while_every_gpu_reads_busy() -> None:
    from gpuflow.utilization import UtilizationState, quiet_until, update

    state = UtilizationState()
    assert quiet_until(state, POLICY) is None  # nothing reported yet
    update(
        state,
        0,
        [
            GpuSample(gpu=0, ts=100.0, utilization=90, memory_used_mib=1, memory_total_mib=2),
            GpuSample(gpu=1, ts=130.0, utilization=95, memory_used_mib=1, memory_total_mib=2),
        ],
        policy=POLICY,
    )
    assert quiet_until(state, POLICY) == 100.0 + POLICY.time_window
    update(
        state,
        0,
        [GpuSample(gpu=1, ts=160.0, utilization=1, memory_used_mib=1, memory_total_mib=2)],
        policy=POLICY,
    )
    assert quiet_until(state, POLICY) is None  # GPU 1 reads idle: check at the normal pace
    assert quiet_until(state, None) is None


def _ticks(state: UtilizationState, readings: list[tuple[float, float]], **kw: float) -> None:
    """One sample a tick apart (a probe's answer each), as (offset from T0, utilization)."""
    for at, util in readings:
        batch = [
            GpuSample(gpu=0, ts=T0 + at, utilization=util, memory_used_mib=1, memory_total_mib=2)
        ]
        update(state, 0, batch, policy=ONE_MINUTE, max_gap_s=150, **kw)


ONE_MINUTE = UtilizationPolicy(min_gpu_utilization=30, time_window="1m")


def test_an_idle_reading_a_tick_after_a_busy_one_is_idle_since_just_before_it() -> None:
    """The monitor read a GPU busy, then (a quiet tick of a minute later) idle: it fell idle
    somewhere in between. Counted idle since the busy reading, a job idle for a few seconds
    was terminated as idle for the whole 1m window (QA: busy until 09:51:47, read busy at
    09:51:02 and idle at 09:52:02, terminated at once); now late, never early."""
    before = UtilizationState()
    _ticks(before, [(0, 96), (60, 0), (70, 0)])
    assert verdict(before, ONE_MINUTE) is not None  # what it did: idle 0..70 s, it says
    state = UtilizationState()
    _ticks(state, [(0, 96), (60, 0), (70, 0), (100, 0)], unseen_busy_s=15)
    assert verdict(state, ONE_MINUTE) is None  # idle since 45 s at the earliest
    _ticks(state, [(106, 0)], unseen_busy_s=15)
    violation = verdict(state, ONE_MINUTE)
    assert violation is not None and violation.idle_since == T0 + 45
    # readings close together say when: nothing is assumed between them
    close = UtilizationState()
    _ticks(close, [(0, 96), (10, 0), (70, 0)], unseen_busy_s=15)
    violation = verdict(close, ONE_MINUTE)
    assert violation is not None and violation.idle_since == T0


def test_a_probe_keeps_the_first_last_and_each_turn_of_its_readings() -> None:
    from gpuflow.utilization import readings_kept

    def reading(gpu: int, at: float, util: float) -> GpuSample:
        return GpuSample(
            gpu=gpu, ts=T0 + at, utilization=util, memory_used_mib=1, memory_total_mib=2
        )

    busy_then_idle = [reading(0, t, 90 if t <= 45 else 0) for t in range(0, 181, 15)]
    steady = [reading(1, t, 80) for t in range(0, 181, 15)]
    kept = readings_kept(busy_then_idle + steady, 30)
    assert [(r.gpu, r.ts - T0) for r in kept] == [
        (0, 0),
        (0, 45),
        (0, 60),
        (0, 180),
        (1, 0),
        (1, 180),
    ]
    # folded in, the GPU reads busy until 45 s: idle for 135 s by 180 s, not 180
    state = UtilizationState()
    update(state, 0, kept, policy=ONE_MINUTE, max_gap_s=150, unseen_busy_s=15)
    assert state.gpus["0/0"].last_busy_at == T0 + 45
    violation = verdict(state, ONE_MINUTE)
    assert violation is not None and violation.idle_since == T0 + 45
