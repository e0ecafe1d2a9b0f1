"""The utilization policy's verdict over GPU samples: windowed, per GPU, constant in size.

Pure module (no I/O, no clocks): JobWorkflow imports it through pass-through imports, and
every time it reads comes from the samples themselves, so replay gives the same verdict.

A job breaks its policy when any one GPU has every sample of the last `time_window` strictly
below `min_gpu_utilization` and its samples cover that whole window. The window is measured
back from that GPU's newest sample and is closed: a busy sample exactly `time_window` before
the newest one still saves the job, and coverage must reach back at least that far. Coverage
is a run of samples with no gap longer than `max_gap_s`; a gap (agent unreachable, sampler
restarted) starts a new run, so missing samples never count as idle and a job younger than
its window is never terminated.

Per GPU the state holds three timestamps (newest sample, start of coverage, newest busy
sample) and a short recent history for display, so a 7-day window costs what a 10-minute one
does. `update` mutates the state in place, which is what a workflow wants between ticks and
across continue-as-new (the state is a plain pydantic model with string keys).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from gpuflow.specs.job import UtilizationPolicy
from gpuflow.specs.units import format_duration

SAMPLE_INTERVAL_S = 5.0
"""How often a host agent samples each GPU."""
DEFAULT_MAX_GAP_S = 3 * SAMPLE_INTERVAL_S
"""Longest silence between two samples that still counts as continuous coverage."""
READING_INTERVAL_S = 15.0
"""How often a host agent reads a job's GPUs while a probe waits on it (for its metrics, and
for the readings the probe answers with: `readings_kept`)."""
HISTORY_POINTS = 60
"""Recent samples kept per GPU for display (5 minutes at the default sample interval)."""
MIN_CHECK_INTERVAL_S = 10
MAX_CHECK_INTERVAL_S = 60


class GpuSample(BaseModel):
    """One reading of one GPU, taken on the host."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gpu: int = Field(ge=0)
    """GPU index on its host (the NVML index, not the index inside CUDA_VISIBLE_DEVICES)."""
    ts: float
    """Epoch seconds, host clock."""
    utilization: float = Field(ge=0, le=100)
    """Percent of time a kernel was running over the driver's last sample period."""
    memory_used_mib: int = Field(ge=0)
    memory_total_mib: int = Field(ge=0)
    simulated: bool = False
    """True when the value comes from a simulated host's declared source, not a GPU."""


class GpuSampleError(BaseModel):
    """A GPU that could not be read; it yields no sample, which never counts as idle."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gpu: int
    message: str
    """What happened and what to do, e.g. `GPU 3 is lost (NVML: GPU is lost); ...`."""
    code: int | None = None
    """NVML return code when the error came from NVML."""


class SampleBatch(BaseModel):
    """What one sampling pass over a host's GPUs returns."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    samples: list[GpuSample] = Field(default_factory=list)
    errors: list[GpuSampleError] = Field(default_factory=list)


class GpuWindow(BaseModel):
    """Windowed state of one GPU of one node: constant size however long the window."""

    node: int
    gpu: int
    last_sample_at: float | None = None
    """Time of the newest sample accepted; older or equal ones are ignored as re-deliveries."""
    covered_since: float | None = None
    """First sample of the current gap-free run; None until a sample starts a new run."""
    last_busy_at: float | None = None
    """Newest sample at or above the tracked threshold; None if none (or none tracked)."""
    utilization: float = 0.0
    """Newest utilization, percent."""
    memory_used_mib: int = 0
    memory_total_mib: int = 0
    simulated: bool = False
    recent: list[tuple[float, float, int]] = Field(default_factory=list)
    """Newest samples for display, oldest first: (ts, utilization, memory_used_mib)."""


class UtilizationState(BaseModel):
    """Every GPU of a job, keyed `"<node>/<gpu>"` (string keys survive any JSON converter)."""

    nodes: int = Field(default=1, ge=1)
    """The job's node count; violation messages name the node when it is above 1."""
    min_gpu_utilization: int | None = None
    """Threshold that `last_busy_at` refers to; None while no policy is tracked."""
    history_points: int = Field(default=HISTORY_POINTS, ge=0)
    """Length of each GPU's `recent` history; lower it for jobs with hundreds of GPUs."""
    gpus: dict[str, GpuWindow] = Field(default_factory=dict)


class Violation(BaseModel):
    """The GPU that broke the utilization policy, and what the user reads about it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    node: int
    gpu: int
    min_gpu_utilization: int
    time_window: int
    idle_since: float
    """Start of the idle stretch: after the last busy sample, or the start of coverage."""
    message: str
    """E.g. `GPU 1 utilization stayed below 50% for 10m` (`node 1 GPU 1 ...` if nodes > 1)."""


class GpuUtilization(BaseModel):
    """The newest reading of one GPU, for `gpuflow metrics`, queries and the Temporal UI."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    node: int
    gpu: int
    at: float
    utilization: float
    memory_used_mib: int
    memory_total_mib: int
    simulated: bool
    idle_for_s: float | None
    """Seconds of continuous coverage below the tracked threshold; None when none is tracked."""


def gpu_key(node: int, gpu: int) -> str:
    return f"{node}/{gpu}"


def update(
    state: UtilizationState,
    node: int,
    samples: list[GpuSample],
    *,
    policy: UtilizationPolicy | None,
    max_gap_s: float = DEFAULT_MAX_GAP_S,
    unseen_busy_s: float | None = None,
) -> None:
    """Fold one node's new samples into `state`, in place.

    Samples may arrive in any order within a batch and may be delivered again (an activity
    retried): a sample not newer than the GPU's newest accepted one is ignored. A gap longer
    than `max_gap_s` between accepted samples restarts coverage.

    `unseen_busy_s`: an idle sample that follows a busy one by more than this says nothing of
    when the GPU fell idle in between: it counts as busy until this long before the idle
    sample (late, never early). Without it the GPU counted as idle from the busy sample on, so
    a job read a tick apart was terminated as idle for the whole window after far less.
    """
    _track_threshold(state, policy)
    threshold = state.min_gpu_utilization
    for sample in sorted(samples, key=lambda s: (s.gpu, s.ts)):
        key = gpu_key(node, sample.gpu)
        window = state.gpus.get(key)
        if window is None:
            window = state.gpus[key] = GpuWindow(node=node, gpu=sample.gpu)
        last = window.last_sample_at
        if last is not None and sample.ts <= last:
            continue
        busy_before = last is not None and window.last_busy_at == last
        if window.covered_since is None or last is None or sample.ts - last > max_gap_s:
            window.covered_since = sample.ts
        window.last_sample_at = sample.ts
        if threshold is not None and sample.utilization >= threshold:
            window.last_busy_at = sample.ts
        elif (
            threshold is not None
            and unseen_busy_s is not None
            and busy_before
            and last is not None
            and sample.ts - last > unseen_busy_s
        ):
            window.last_busy_at = sample.ts - unseen_busy_s
        window.utilization = sample.utilization
        window.memory_used_mib = sample.memory_used_mib
        window.memory_total_mib = sample.memory_total_mib
        window.simulated = sample.simulated
        if state.history_points:
            window.recent.append((sample.ts, sample.utilization, sample.memory_used_mib))
            if len(window.recent) > state.history_points:
                del window.recent[: len(window.recent) - state.history_points]


def readings_kept(readings: list[GpuSample], threshold: float) -> list[GpuSample]:
    """What a probe answers with of the readings it took while it waited (oldest first): per
    GPU the first and the last, and both sides of every turn between busy (at or above
    `threshold`) and idle, so the monitor learns when the GPU last read busy and since when it
    reads idle without every reading of a long wait."""
    kept: list[GpuSample] = []
    by_gpu: dict[int, list[GpuSample]] = {}
    for reading in sorted(readings, key=lambda r: (r.gpu, r.ts)):
        by_gpu.setdefault(reading.gpu, []).append(reading)
    for run in by_gpu.values():
        busy = [r.utilization >= threshold for r in run]
        for i, reading in enumerate(run):
            turns = (i > 0 and busy[i] != busy[i - 1]) or (
                i + 1 < len(run) and busy[i] != busy[i + 1]
            )
            if i == 0 or i == len(run) - 1 or turns:
                kept.append(reading)
    return kept


def break_coverage(state: UtilizationState, *, node: int, gpus: list[int] | None = None) -> None:
    """Restart coverage of a node's GPUs (all when `gpus` is None) at their next sample.

    For a caller that knows samples were lost even though no gap shows, e.g. the host agent
    reports that its sampler restarted.
    """
    for window in state.gpus.values():
        if window.node == node and (gpus is None or window.gpu in gpus):
            window.covered_since = None


def verdict(state: UtilizationState, policy: UtilizationPolicy | None) -> Violation | None:
    """The first GPU (by node, then index) that broke `policy`, or None."""
    if policy is None or state.min_gpu_utilization != policy.min_gpu_utilization:
        # Nothing tracked against this threshold yet; `update` starts tracking it.
        return None
    nodes = max([state.nodes, *(w.node + 1 for w in state.gpus.values())])
    for window in sorted(state.gpus.values(), key=lambda w: (w.node, w.gpu)):
        if window.last_sample_at is None or window.covered_since is None:
            continue
        edge = window.last_sample_at - policy.time_window
        if window.covered_since > edge:
            continue  # the samples do not reach back over the whole window
        if window.last_busy_at is not None and window.last_busy_at >= edge:
            continue  # a sample in the window, its edge included, was at the threshold
        idle_since = window.covered_since
        if window.last_busy_at is not None and window.last_busy_at > idle_since:
            idle_since = window.last_busy_at
        where = f"node {window.node} GPU {window.gpu}" if nodes > 1 else f"GPU {window.gpu}"
        return Violation(
            node=window.node,
            gpu=window.gpu,
            min_gpu_utilization=policy.min_gpu_utilization,
            time_window=policy.time_window,
            idle_since=idle_since,
            message=(
                f"{where} utilization stayed below {policy.min_gpu_utilization}% "
                f"for {format_duration(policy.time_window)}"
            ),
        )
    return None


def quiet_until(state: UtilizationState, policy: UtilizationPolicy | None) -> float | None:
    """The earliest time a verdict could fire when every GPU's newest sample is busy: the
    oldest of those samples plus the window (a busy sample on the window's edge still saves
    the job). None when a GPU reads idle, nothing has reported, or no policy is tracked."""
    if policy is None or state.min_gpu_utilization != policy.min_gpu_utilization:
        return None
    newest = []
    for window in state.gpus.values():
        if window.last_sample_at is None or window.last_busy_at != window.last_sample_at:
            return None
        newest.append(window.last_sample_at)
    if not newest:
        return None
    return min(newest) + policy.time_window


def check_interval_s(policy: UtilizationPolicy | None) -> int:
    """Seconds between monitor ticks: a sixth of the window, between 10 s and 1 minute."""
    if policy is None:
        return MAX_CHECK_INTERVAL_S
    return max(MIN_CHECK_INTERVAL_S, min(MAX_CHECK_INTERVAL_S, policy.time_window // 6))


def summarize(state: UtilizationState) -> list[GpuUtilization]:
    """The newest reading of every GPU that has reported, ordered by node and index."""
    rows = []
    for window in sorted(state.gpus.values(), key=lambda w: (w.node, w.gpu)):
        if window.last_sample_at is None:
            continue
        idle_since = _idle_since(window)
        idle_for = None
        if state.min_gpu_utilization is not None:
            idle_for = 0.0 if idle_since is None else window.last_sample_at - idle_since
        rows.append(
            GpuUtilization(
                node=window.node,
                gpu=window.gpu,
                at=window.last_sample_at,
                utilization=window.utilization,
                memory_used_mib=window.memory_used_mib,
                memory_total_mib=window.memory_total_mib,
                simulated=window.simulated,
                idle_for_s=idle_for,
            )
        )
    return rows


def _idle_since(window: GpuWindow) -> float | None:
    """Start of the covered stretch whose samples after it are all idle; None if the newest
    sample is busy or coverage is broken."""
    if window.covered_since is None or window.last_sample_at is None:
        return None
    if window.last_busy_at is None or window.last_busy_at < window.covered_since:
        return window.covered_since
    if window.last_busy_at >= window.last_sample_at:
        return None
    return window.last_busy_at


def _track_threshold(state: UtilizationState, policy: UtilizationPolicy | None) -> None:
    threshold = None if policy is None else policy.min_gpu_utilization
    if threshold == state.min_gpu_utilization:
        return
    # The busy marks refer to the old threshold. Counting every GPU as busy at its newest
    # sample restarts each idle clock: late, never early.
    for window in state.gpus.values():
        window.last_busy_at = window.last_sample_at
    state.min_gpu_utilization = threshold
