"""What monitoring a job costs: idle detection latency, workflow history growth, sampler CPU.

Protocol: the real JobWorkflow (in gpuflow's workflow sandbox) and the real control activities on
a temporary SQLite store run against the time-skipping Temporal test server from the
temporal-test-server wheel; the host agent is replaced by scripted activities registered under
its names (start_process, probe_process, stop_process, read_logs) on the host's task queue. The
scripted probe is a long poll like the agent's: it waits up to the tick it is asked for by
skipping the server's clock, answers at once when the process exits, else at the tick with one
sample per GPU stamped with the server time; so every timestamp in the run is the server's
simulated clock.

- detection latency: a 1-GPU job with `min_gpu_utilization: 50` is busy (90%) for
  IDLE_AFTER after its first probe, then idle (0%), switching right after a busy sample (the
  worst phase: nothing of the idle stretch has been seen yet). Latency is the workflow's close
  time (processes stopped, GPUs released, final status recorded) minus the moment the GPU went
  idle. Target: at most time_window + check_interval_s(policy).
- events per job-hour: a busy job with a 24h window (check interval 60 s) runs `--hours`, then
  its process exits 0; every event of every run of the continue-as-new chain is counted and
  divided by the job's duration (first start to last close). Target: under 300.
- largest history: the same busy job for `--days`; the largest single run. Target: none above
  10,000 events (Temporal warns at 10,240).
- sampler CPU: benchmarks/sampler_cost.measure_sampler_cpu() (8 GPUs, one pass every 5 s,
  against the stub NVML). Target: under 1% of one core.

Also written under "details" (no targets): each run's events, continue-as-new runs, probes and
wall time; `exit_noticed_after_s`, how long after the process exited (in the middle of a probe's
wait) the job closed; and a job without a utilization policy, busy for an hour.

    python benchmarks/monitoring.py                   # everything (~ a minute on 2 cores)
    python benchmarks/monitoring.py --json out.json --days 7 --hours 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402
from temporalio.testing import WorkflowEnvironment  # noqa: E402

from benchmarks.monitoring_job import THRESHOLD, GpuScript, Run, run_job  # noqa: E402
from benchmarks.sampler_cost import measure_sampler_cpu  # noqa: E402
from gpuflow.payloads import DATA_CONVERTER  # noqa: E402
from gpuflow.specs.job import UtilizationPolicy  # noqa: E402
from gpuflow.utilization import check_interval_s  # noqa: E402

TEST_SERVER = Path(sys.executable).parent / "temporal-test-server"
IDLE_AFTER = 30 * 60
"""Seconds the GPU is busy, from the first probe, before it goes idle (latency runs)."""
WINDOWS = {"1m": 60, "10m": 600, "24h": 86400}
EVENTS_WINDOW = "24h"
EVENTS_PER_HOUR_TARGET = 300
MAX_HISTORY_TARGET = 10_000
SAMPLER_CPU_TARGET = 1.0


async def measure(
    *, hours: float, days: float, windows: list[str], log: Callable[[str], None]
) -> dict[str, Any]:
    env = await WorkflowEnvironment.start_time_skipping(
        data_converter=DATA_CONVERTER,
        test_server_existing_path=str(TEST_SERVER),
    )
    figures: dict[str, Any] = {"detection_latency_s": {}, "details": {}}
    details = figures["details"]
    try:
        for window in windows:
            script = GpuScript(idle_after=IDLE_AFTER)
            run = await run_job(env, script, window)
            assert script.idle_at is not None
            if run.result.reason.value != "gpu_underutilized":
                raise RuntimeError(
                    f"{window} window: the idle job ended with "
                    f"{run.result.reason.value}: {run.result.message}"
                )
            latency = run.closed_at.timestamp() - script.idle_at
            figures["detection_latency_s"][window] = round(latency, 3)
            details[f"latency_{window}"] = {
                "check_interval_s": _interval(window),
                "status_recorded_after_s": None
                if run.finished_at is None
                else round(_epoch(run.finished_at) - script.idle_at, 3),
                "message": run.result.message,
                "history_events": sum(run.history_sizes),
                "runs": len(run.history_sizes),
                "wall_s": round(run.wall_s, 1),
            }
            log(f"latency {window}: {latency:.1f} s ({run.wall_s:.1f} s wall)")

        script = GpuScript(exit_after=hours * 3600)
        busy = await run_job(env, script, EVENTS_WINDOW)
        _expect_done(busy, script)
        figures["events_per_job_hour"] = round(sum(busy.history_sizes) / busy.hours, 1)
        details["events"] = _chain(busy, script)
        log(
            f"events: {figures['events_per_job_hour']}/job-hour over {busy.hours:.2f} h "
            f"({busy.wall_s:.1f} s wall)"
        )

        # Not a target: a job without a utilization policy, watched only for its exit.
        script = GpuScript(exit_after=3600)
        plain = await run_job(env, script, None)
        _expect_done(plain, script)
        details["no_policy"] = {
            **_chain(plain, script),
            "events_per_job_hour": round(sum(plain.history_sizes) / plain.hours, 1),
        }
        log(f"no policy: {details['no_policy']['events_per_job_hour']}/job-hour")

        script = GpuScript(exit_after=days * 86400)
        long = await run_job(env, script, EVENTS_WINDOW)
        _expect_done(long, script)
        figures["max_history_events_7d"] = max(long.history_sizes)
        details["long_run"] = {
            **_chain(long, script),
            "days": days,
            "events_per_job_hour": round(sum(long.history_sizes) / long.hours, 1),
        }
        log(
            f"{days:g} days: largest run {max(long.history_sizes)} events, "
            f"{len(long.history_sizes)} runs ({long.wall_s:.1f} s wall)"
        )
    finally:
        await env.shutdown()

    cpu_start = time.perf_counter()
    figures["sampler_cpu_pct"] = round(measure_sampler_cpu(), 4)
    details["sampler_wall_s"] = round(time.perf_counter() - cpu_start, 1)
    return figures


def _chain(run: Run, script: GpuScript) -> dict[str, Any]:
    assert script.exit_at is not None
    return {
        "job_hours": round(run.hours, 3),
        "runs": len(run.history_sizes),
        "total_events": sum(run.history_sizes),
        "largest_run": max(run.history_sizes),
        "probes": run.probes,
        "exit_noticed_after_s": round(run.closed_at.timestamp() - script.exit_at, 3),
        "wall_s": round(run.wall_s, 1),
    }


def _expect_done(run: Run, script: GpuScript) -> None:
    if run.result.reason.value != "done" or script.exit_at is None:
        raise RuntimeError(
            f"the busy job ended with {run.result.reason.value}: {run.result.message}"
        )


def _interval(window: str) -> int:
    return check_interval_s(UtilizationPolicy(min_gpu_utilization=THRESHOLD, time_window=window))


def _epoch(moment: datetime) -> float:
    if moment.tzinfo is None:  # SQLite hands datetimes back naive; they were stored in UTC
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def report(figures: dict[str, Any], console: Console) -> bool:
    table = Table(title="Monitoring cost (time-skipping server, real JobWorkflow)")
    table.add_column("figure")
    table.add_column("measured", justify="right")
    table.add_column("target", justify="right")
    table.add_column("")
    ok = True

    def row(name: str, value: float, passed: bool, text: str, unit: str = "") -> None:
        nonlocal ok
        ok = ok and passed
        table.add_row(
            name, f"{value:,.1f}{unit}", text, "[green]PASS[/]" if passed else "[red]MISS[/]"
        )

    for window, latency in figures["detection_latency_s"].items():
        seconds = WINDOWS[window]
        interval = _interval(window)
        row(
            f"detection latency {window}",
            latency,
            latency <= seconds + interval,
            f"at most {seconds + interval:,} s ({window} + {interval} s)",
            " s",
        )
    events = figures["events_per_job_hour"]
    row(
        "history events per job-hour",
        events,
        events < EVENTS_PER_HOUR_TARGET,
        f"under {EVENTS_PER_HOUR_TARGET}",
    )
    largest = figures["max_history_events_7d"]
    days = figures["details"]["long_run"]["days"]
    row(
        f"largest history, {days:g}-day job",
        largest,
        largest <= MAX_HISTORY_TARGET,
        f"at most {MAX_HISTORY_TARGET:,}",
    )
    cpu = figures["sampler_cpu_pct"]
    row(
        "sampler CPU, 8 GPUs",
        cpu,
        cpu < SAMPLER_CPU_TARGET,
        f"under {SAMPLER_CPU_TARGET:g}% of a core",
        "%",
    )
    console.print(table)
    return ok


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument(
        "--hours",
        type=float,
        default=3.0,
        help="simulated hours of the busy job for events per job-hour",
    )
    parser.add_argument(
        "--days", type=float, default=7.0, help="simulated days of the long busy job"
    )
    parser.add_argument(
        "--windows",
        default=",".join(WINDOWS),
        help="time windows for detection latency, of " + ", ".join(WINDOWS),
    )
    args = parser.parse_args(argv)
    windows = [w for w in args.windows.split(",") if w]
    unknown = sorted(set(windows) - set(WINDOWS))
    if unknown:
        parser.error(f"--windows: {', '.join(unknown)} unknown; use some of " + ", ".join(WINDOWS))
    console = Console()
    started = time.perf_counter()
    figures = asyncio.run(
        measure(
            hours=args.hours, days=args.days, windows=windows, log=lambda line: console.log(line)
        )
    )
    figures["details"]["total_wall_s"] = round(time.perf_counter() - started, 1)
    report(figures, console)
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return figures


if __name__ == "__main__":
    main()
