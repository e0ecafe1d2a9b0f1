"""The job throughput benchmark's figures (job_throughput.py): CPU over a phase, each side's
latencies, the headline figures as written with --json, and the table that shows them all.

Temporal's sandbox imports this module afresh for every baseline workflow, as it does
job_throughput.py: keep its top level to stdlib.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

TARGET_OVERHEAD_RATIO = 3.0
TARGET_P50_MS = 300.0
GPUS_PER_HOST = 8
"""Simulated A100s of each sim host the jobs run on."""


@dataclass
class CpuMeter:
    """CPU seconds of this process (every thread, the SDK's Rust core included) and of the dev
    server over one phase."""

    server_pid: int
    process_s: float = 0.0
    server_s: float = 0.0

    def _server_now(self) -> float:
        fields = Path(f"/proc/{self.server_pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def start(self) -> None:
        self._process0, self._server0 = time.process_time(), self._server_now()

    def stop(self) -> None:
        self.process_s = time.process_time() - self._process0
        self.server_s = self._server_now() - self._server0


@dataclass
class Phase:
    """One side of the comparison: N items in a burst, then a few alone."""

    per_s: float
    to_running_ms: list[float]
    """Start to `running` (jobs) or to the activity's result (baseline), in the burst."""
    alone_ms: list[float]
    """The same, for items run one at a time after the burst."""
    paced_ms: list[float]
    """The same, for items started at a steady rate."""
    cpu: CpuMeter
    submit_call_ms: list[float] | None = None
    running_to_done_ms: list[float] | None = None


@dataclass
class Figures:
    n: int
    hosts: int
    concurrency: int
    rate: float
    jobs: Phase
    baseline: Phase

    @property
    def jobs_per_s(self) -> float:
        return self.jobs.per_s

    @property
    def p50_submit_to_running_ms(self) -> float:
        return percentile(self.jobs.paced_ms, 50)

    @property
    def p99_submit_to_running_ms(self) -> float:
        return percentile(self.jobs.paced_ms, 99)

    @property
    def baseline_workflows_per_s(self) -> float:
        return self.baseline.per_s

    @property
    def overhead_ratio(self) -> float:
        return self.baseline_workflows_per_s / self.jobs_per_s

    def as_json(self) -> dict[str, float]:
        return {
            "jobs_per_s": round(self.jobs_per_s, 3),
            "p50_submit_to_running_ms": round(self.p50_submit_to_running_ms, 1),
            "p99_submit_to_running_ms": round(self.p99_submit_to_running_ms, 1),
            "baseline_workflows_per_s": round(self.baseline_workflows_per_s, 3),
            "overhead_ratio": round(self.overhead_ratio, 3),
            "paced_rate_per_s": self.rate,
            "burst_p50_submit_to_running_ms": round(percentile(self.jobs.to_running_ms, 50), 1),
            "burst_p99_submit_to_running_ms": round(percentile(self.jobs.to_running_ms, 99), 1),
            "baseline_paced_p50_ms": round(percentile(self.baseline.paced_ms, 50), 1),
        }


def percentile(values: list[float], q: float) -> float:
    """Nearest rank (q in 0..100): the p99 of 200 values is the 198th smallest."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))
    return ordered[int(rank) - 1]


def render(figures: Figures) -> None:
    from rich.console import Console
    from rich.table import Table

    def verdict(ok: bool) -> str:
        return "[green]met[/green]" if ok else "[red]missed[/red]"

    def ms(values: list[float] | None) -> str:
        if not values:
            return "-"
        return f"{percentile(values, 50):.0f} / {percentile(values, 99):.0f} ms"

    def cpu(meter: CpuMeter) -> str:
        return (
            f"{meter.process_s / figures.n * 1000:.0f} / {meter.server_s / figures.n * 1000:.0f} ms"
        )

    jobs, baseline = figures.jobs, figures.baseline
    table = Table(
        title=f"Job throughput: {figures.n} `true` jobs of 1 GPU on {figures.hosts} "
        f"sim hosts x {GPUS_PER_HOST} GPUs, {figures.concurrency} submits "
        "in flight"
    )
    table.add_column("figure")
    table.add_column("value", justify="right")
    table.add_column("target", justify="right")
    table.add_column("")
    table.add_row("jobs/s (first submit .. last done)", f"{figures.jobs_per_s:.2f}", "", "")
    steady = f"{len(jobs.paced_ms)} at {figures.rate:g}/s"
    table.add_row(
        f"submit → running p50 ({steady})",
        f"{figures.p50_submit_to_running_ms:.0f} ms",
        f"< {TARGET_P50_MS:.0f} ms",
        verdict(figures.p50_submit_to_running_ms < TARGET_P50_MS),
    )
    table.add_row(
        f"submit → running p99 ({steady})", f"{figures.p99_submit_to_running_ms:.0f} ms", "", ""
    )
    table.add_row(
        "baseline workflows/s (1 no-op activity)", f"{figures.baseline_workflows_per_s:.2f}", "", ""
    )
    table.add_row(
        "overhead ratio (baseline/s ÷ jobs/s)",
        f"{figures.overhead_ratio:.2f}x",
        f"≤ {TARGET_OVERHEAD_RATIO:g}x",
        verdict(figures.overhead_ratio <= TARGET_OVERHEAD_RATIO),
    )
    table.add_section()
    table.add_row(
        f"[dim]burst of {figures.n}: submit → running p50 / p99[/dim]",
        ms(jobs.to_running_ms),
        "",
        "",
    )
    table.add_row(
        f"[dim]baseline, {steady}: start → activity result p50 / p99[/dim]",
        ms(baseline.paced_ms),
        "",
        "",
    )
    table.add_row("[dim]Client.submit call p50 / p99[/dim]", ms(jobs.submit_call_ms), "", "")
    table.add_row("[dim]running → done p50 / p99[/dim]", ms(jobs.running_to_done_ms), "", "")
    table.add_row(
        f"[dim]baseline burst of {figures.n}: start → activity result p50 / p99[/dim]",
        ms(baseline.to_running_ms),
        "",
        "",
    )
    table.add_row(
        f"[dim]one at a time ({len(jobs.alone_ms)}): submit → running p50[/dim]",
        f"{percentile(jobs.alone_ms, 50):.0f} ms" if jobs.alone_ms else "-",
        "",
        "",
    )
    table.add_row(
        f"[dim]one at a time ({len(baseline.alone_ms)}): baseline p50[/dim]",
        f"{percentile(baseline.alone_ms, 50):.0f} ms" if baseline.alone_ms else "-",
        "",
        "",
    )
    table.add_row("[dim]CPU per job: this process / dev server[/dim]", cpu(jobs.cpu), "", "")
    table.add_row(
        "[dim]CPU per baseline workflow: this process / dev server[/dim]", cpu(baseline.cpu), "", ""
    )
    Console().print(table)
