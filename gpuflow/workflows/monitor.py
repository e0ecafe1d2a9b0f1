"""The monitor's per-tick decisions, pure: how long the next look may wait, and what a round of
probes means for the job (its verdict). No Temporal and no I/O, so every verdict is testable on
its own and the workflow only carries them out."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from gpuflow import utilization
from gpuflow.scheduler.model import NodePlacement
from gpuflow.specs.job import UtilizationPolicy
from gpuflow.specs.units import format_duration
from gpuflow.status import TerminationReason
from gpuflow.workflows.models import ProbeResult

IDLE_TICK_MAX = timedelta(seconds=60)
"""Tick of a job without a utilization policy (timer shape: how late its exit may be noticed)."""
QUIET_TICK_MAX = timedelta(minutes=3)
"""Longest tick while every GPU of the job reads busy (no verdict can fire sooner): bounds how
late a lost host is noticed, and keeps a busy job's history small."""
POLL_TICK = timedelta(minutes=2)
"""Tick of a job without a utilization policy when probes are long polls: its exit is answered
at once, so the tick only paces fresh samples and the check that its hosts answer."""
PATCH_QUICK_LOSS = "probe-untaken-quick-loss"
"""A probe its host's agent does not take up within steps.PROBE_UNTAKEN fails, and the next
is sent at once: a lost host is noticed in minutes, not after three whole ticks (10 min)."""
PATCH_UNSEEN_BUSY = "idle-after-unseen-busy"
"""A GPU read idle a tick after it read busy counts as idle only since one reading interval
before (utilization.update `unseen_busy_s`); it counted as idle since the busy reading."""
PROBE_FAILURES_BEFORE_LOST = 3
MAX_SPAN = timedelta(days=365 * 100)
"""Longest duration a user's spec can make a deadline or timer of (beyond it, datetime
arithmetic overflows): longer durations are clamped, they mean 'never' in practice."""


def span(seconds: float) -> timedelta:
    """A user's duration as a timedelta that no deadline arithmetic can overflow."""
    return min(timedelta(seconds=min(max(seconds, 0.0), MAX_SPAN.total_seconds())), MAX_SPAN)


@dataclass(frozen=True)
class Verdict:
    """How a job ends: its termination reason and what the user reads."""

    reason: TerminationReason
    message: str


def max_duration_verdict(max_duration: float) -> Verdict:
    return Verdict(
        TerminationReason.MAX_DURATION_EXCEEDED,
        f"ran longer than max_duration {format_duration(max_duration)}",
    )


def check_interval(policy: UtilizationPolicy | None, *, long_poll: bool) -> timedelta:
    if policy is not None:
        return timedelta(seconds=utilization.check_interval_s(policy))
    return POLL_TICK if long_poll else IDLE_TICK_MAX


def next_tick(
    *,
    ticks: int,
    check: timedelta,
    policy: UtilizationPolicy | None,
    state: utilization.UtilizationState,
    failing: bool,
    now: datetime,
    long_poll: bool,
) -> timedelta:
    """How long the next look may take. In the timer shape the first ticks are short (a quick
    job's exit is noticed quickly); a long poll answers an exit at once, so it needs no ramp."""
    tick = check if long_poll else min(timedelta(seconds=2 ** min(ticks, 6)), check)
    if policy is not None and tick >= check and not failing:
        # While every GPU reads busy, no verdict can fire before the oldest newest sample plus
        # the window: look less often (bounded, so a lost host is still noticed).
        until = utilization.quiet_until(state, policy)
        if until is not None:
            quiet = span(until - now.timestamp())
            tick = max(check, min(QUIET_TICK_MAX, quiet))
    return tick


@dataclass
class Watch:
    """What the monitor knows between ticks (carried across continue-as-new in JobResume,
    except the exits, which the next run's first probes report again)."""

    failures: dict[int, int] = field(default_factory=dict)
    exit_codes: dict[int, int | None] = field(default_factory=dict)
    gone: set[int] = field(default_factory=set)
    """Ranks whose script exited and whose process group the agent saw empty."""


def judge(
    watch: Watch,
    state: utilization.UtilizationState,
    policy: UtilizationPolicy | None,
    nodes: list[NodePlacement],
    probes: Sequence[ProbeResult | BaseException | None],
    *,
    node_count: int,
    max_gap_s: float,
    unseen_busy_s: float | None = None,
    describe: Callable[[BaseException], str] = str,
) -> Verdict | None:
    """What one round of probes (one per node in `nodes`, None where unanswered) means: the
    job's ending, or None while it runs on. Updates `watch` and the utilization `state`."""
    exited: dict[int, int | None] = {}
    for node, probe in zip(nodes, probes, strict=True):
        if probe is None:  # not answered: another node's answer ends the job
            continue
        if isinstance(probe, BaseException):
            watch.failures[node.rank] = watch.failures.get(node.rank, 0) + 1
            if watch.failures[node.rank] >= PROBE_FAILURES_BEFORE_LOST:
                return Verdict(
                    TerminationReason.HOST_LOST,
                    f"host {node.host_name} stopped answering: {describe(probe)}",
                )
            continue
        watch.failures[node.rank] = 0
        if probe.samples:
            # Samples a tick apart are continuous coverage; a missed tick is a gap.
            utilization.update(
                state,
                node.rank,
                probe.samples,
                policy=policy,
                max_gap_s=max_gap_s,
                unseen_busy_s=unseen_busy_s,
            )
        if probe.state == "missing":
            return Verdict(
                TerminationReason.HOST_LOST,
                f"the process of node {node.rank} on {node.host_name} is gone "
                "without an exit code (host restarted?)",
            )
        if probe.state in ("exited", "stopped"):
            exited[node.rank] = probe.exit_code
            if not probe.leftovers:
                watch.gone.add(node.rank)
    if exited:
        watch.exit_codes.update(exited)
        failed = {r: c for r, c in exited.items() if c != 0}
        if failed:
            rank, code = sorted(failed.items())[0]
            what = "vanished" if code is None else f"exited with code {code}"
            return Verdict(TerminationReason.PROCESS_FAILED, f"node {rank} {what}")
        if len(watch.exit_codes) >= node_count and all(c == 0 for c in watch.exit_codes.values()):
            return Verdict(TerminationReason.DONE, "all processes exited with code 0")
    if policy is not None:
        violation = utilization.verdict(state, policy)
        if violation is not None:
            return Verdict(TerminationReason.GPU_UNDERUTILIZED, violation.message)
    return None


__all__ = [
    "IDLE_TICK_MAX",
    "MAX_SPAN",
    "POLL_TICK",
    "QUIET_TICK_MAX",
    "Verdict",
    "Watch",
    "check_interval",
    "judge",
    "max_duration_verdict",
    "next_tick",
    "span",
]
