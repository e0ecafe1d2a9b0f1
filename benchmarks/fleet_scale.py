"""The product's placement path at fleet scale (issue #10), as a job submitted through the API
is placed since queues (#11): the submit's placement transaction (`enter_at_submit` in
gpuflow/control/admission.py: the job's first record and its queue entry, admitted there when
nobody waits), the workflow's first step (`enqueue_job`, which reads what became of the entry),
the admission loop's pass (`admission_pass`) for a job that waits, and `release_job` for the
releases, on a sim fleet of openb's 1,213 GPU nodes in a fresh database. Only Temporal is left
out: each call is timed as the activity runs it. The job rows it writes feed the fleet's
learned request mix, as in the product.

Protocol, per database (`--db sqlite,postgresql`; PostgreSQL gets a database of its own on the
server of `--postgresql URL`, dropped at the end):

- Arrivals are the openb `default` pods in placement.py's seeded order (`arrivals`, seed 42),
  as gpuflow jobs (`job_of`), placed one at a time until the arrived demand (GPUs asked by jobs
  that arrived and were not released) reaches 100% of the fleet's GPUs.
- Every tenth job is released at a random moment, if it was placed: before an arrival drawn
  uniformly (seeded) between its own and the last of the sequence (if the run goes that far).
- `unallocated_pct_at_100`: the fleet's GPUs not held when the arrived demand reaches 100%;
  `pure_unallocated_pct_at_100`: the same for the pure function (`gpuflow.scheduler.place` on
  an in-memory snapshot, the mix learned as benchmarks/placement.py learns it) on the same
  arrivals and releases.
- `placements_per_s`: placements over the time spent in placement transactions (submits'
  entries with the workflow's read, and passes); p50/p99 are per transaction.
- `cold`: `--cold` more arrivals through the cold path (`warm=False`: the whole fleet read in
  each placement transaction, as before #10), on the final state.
- `two_workers`: two processes, each a control worker with its own engine, place the same
  arrivals at once (alternate arrivals each, with their releases) on a fresh database of the
  first kind in `--db` that is PostgreSQL (else SQLite); `over_allocations` counts GPUs (and
  hosts' CPUs or memory) held beyond capacity in the database afterwards.

    python benchmarks/fleet_scale.py --json out.json
    python benchmarks/fleet_scale.py --db sqlite --hosts 300 --no-two-workers
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for path in (ROOT, ROOT / "benchmarks"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from placement import (  # noqa: E402
    GPU_MEMORY_MIB,
    Node,
    Pod,
    arrivals,
    job_of,
    load_nodes,
    load_pods,
    snapshot_of,
)

from gpuflow.control.activities import ControlActivities  # noqa: E402
from gpuflow.control.admission import AdmissionActivities, enter_at_submit  # noqa: E402
from gpuflow.scheduler import apply_placement, place, release_placement  # noqa: E402
from gpuflow.scheduler.mix import LearnedMix, MixLearner, half_life, kind_of  # noqa: E402
from gpuflow.scheduler.model import Placement  # noqa: E402
from gpuflow.services.fleets import apply_fleet  # noqa: E402
from gpuflow.specs import FleetSpec  # noqa: E402
from gpuflow.status import JobStatus, TerminationReason  # noqa: E402
from gpuflow.store.db import Store  # noqa: E402
from gpuflow.store.tables import AllocationRow, HostRow  # noqa: E402
from gpuflow.workflows.models import JobStatusInput, ReleaseInput  # noqa: E402
from gpuflow.workflows.queue_models import AdmissionState, EnqueueInput, PassInput  # noqa: E402

_TRACE_DIRS = (ROOT.parent / "shared/data/openb", Path("/work/shared/data/openb"))
POSTGRESQL = "postgresql://postgres@127.0.0.1:5432/test"
RELEASE_EVERY = 10
EPSILON = 1e-6


def fleet_spec(nodes: list[Node]) -> FleetSpec:
    return FleetSpec.model_validate(
        {
            "type": "fleet",
            "name": "openb",
            "kind": "sim",
            "hosts": [
                {
                    "name": node.name,
                    "cpus": node.cpu_milli // 1000,
                    "memory": f"{node.memory_mib}MB",
                    "gpus": [
                        {
                            "name": node.model,
                            "memory": f"{GPU_MEMORY_MIB.get(node.model, 32768)}MB",
                            "count": node.gpus,
                        }
                    ],
                }
                for node in nodes
            ],
        }
    )


def release_plan(sequence: list[Pod], seed: int) -> dict[int, int]:
    """Every tenth arrival, if placed, is released before a later arrival drawn at random:
    arrival index -> the arrival index it is released before. The pure function and the
    product follow the same plan."""
    rng = random.Random(seed)
    return {
        i: rng.randint(i + 1, len(sequence))
        for i in range(RELEASE_EVERY - 1, len(sequence), RELEASE_EVERY)
    }


def pure_run(
    nodes: list[Node], sequence: list[Pod], releases: dict[int, int], capacity: int
) -> tuple[float, int]:
    """Unallocated % at 100% arrived demand for the pure function, and arrivals it took."""
    snapshot = snapshot_of(nodes, "fragmentation", [])
    fleet = snapshot.fleets[0]
    learner = MixLearner(half_life(capacity // 1000))
    in_use: LearnedMix | None = None
    due: dict[int, list[tuple[Pod, Placement]]] = defaultdict(list)
    arrived = held = 0
    for i, pod in enumerate(sequence):
        for gone, placement in due.pop(i, []):
            release_placement(snapshot, placement)
            arrived -= gone.gpu_milli_total
            held -= gone.gpu_milli_total
        job = job_of(pod)
        learner.observe(*kind_of(job))
        fresh = learner.refreshed(in_use)
        if fresh is not None:
            in_use, fleet.workload = fresh, list(fresh.requests)
        result = place(job, snapshot)
        arrived += pod.gpu_milli_total
        if isinstance(result, Placement):
            apply_placement(snapshot, result)
            held += pod.gpu_milli_total
            if i in releases:
                due[releases[i]].append((pod, result))
        if arrived >= capacity:
            return 100 - held / capacity * 100, i + 1
    return 100 - held / capacity * 100, len(sequence)


def _record(job_id: str, job: Any, status: JobStatus, **fields: Any) -> JobStatusInput:
    return JobStatusInput(
        job_id=job_id,
        name=job.name,
        status=status,
        attempt=1,
        event_key=f"1:{status.value}:{fields.get('reason') or ''}",
        at=datetime.now(UTC),
        **fields,
    )


async def product_run(
    store: Store,
    sequence: list[Pod],
    releases: dict[int, int],
    capacity: int,
    *,
    tag: str,
    mine: range | None = None,
    warm: bool = True,
) -> dict[str, Any]:
    """Place `sequence` (only the arrivals in `mine`, when given) as the product does, releasing
    as `releases` says, until the arrived demand reaches `capacity`. Per arrival: the submit's
    entry into the queue (`enter_at_submit`, the API's placement transaction, which admits a job
    at once when nobody waits), then the workflow's first step (`enqueue_job`, which reads what
    became of the entry). A job that waits is decided by the admission loop's next pass
    (`admission_pass`), run here when the loop would be woken: after the entry and after each
    release. Only Temporal is left out."""
    control = ControlActivities(store, warm=warm)
    admission = AdmissionActivities(store, warm=warm)
    state = AdmissionState()
    takes: list[float] = []  # each placement transaction: a submit's entry, or a pass
    gives: list[float] = []
    due: dict[int, list[tuple[str, Pod]]] = defaultdict(list)
    pods: dict[str, tuple[int, Pod]] = {}
    waiting: set[str] = set()
    arrived = held = unschedulable = placements = 0
    unallocated = None

    def placed(job_id: str) -> None:
        nonlocal held, placements
        i, pod = pods[job_id]
        held += pod.gpu_milli_total
        placements += 1
        if i in releases:
            due[releases[i]].append((job_id, pod))

    async def admission_pass() -> None:
        nonlocal unschedulable
        begun = time.perf_counter()
        result = await admission.admission_pass(PassInput(reservation=state.reservation))
        takes.append(time.perf_counter() - begun)
        state.reservation = result.reservation
        for job in result.admitted:
            waiting.discard(job.job_id)
            placed(job.job_id)
        for job in result.refused:
            waiting.discard(job.job_id)
            unschedulable += 1

    started = time.perf_counter()
    for i, pod in enumerate(sequence):
        released = False
        for job_id, gone in due.pop(i, []):
            ended = _record(job_id, job_of(gone), JobStatus.DONE, reason=TerminationReason.DONE)
            begun = time.perf_counter()
            await control.release_job(ReleaseInput(job_id=job_id, record=ended))
            gives.append(time.perf_counter() - begun)
            arrived -= gone.gpu_milli_total
            held -= gone.gpu_milli_total
            released = True
        if released and waiting:
            await admission_pass()
        arrived += pod.gpu_milli_total
        if mine is not None and i not in mine:
            continue
        job, job_id = job_of(pod), f"job-{tag}-{i}"
        pods[job_id] = (i, pod)
        begun = time.perf_counter()
        verdict = enter_at_submit(store, job_id=job_id, run_id=tag, spec=job, warm=warm)
        ask = EnqueueInput(
            job_id=job_id, attempt=1, spec=job, submitted_at=datetime.now(UTC), may_wait=False
        )
        await admission.enqueue_job(ask)
        takes.append(time.perf_counter() - begun)
        if verdict.placement is not None:
            placed(job_id)
        elif verdict.refused is not None:
            unschedulable += 1
        else:
            waiting.add(job_id)
            await admission_pass()
        if arrived >= capacity and unallocated is None:
            unallocated = 100 - held / capacity * 100
            if mine is None:
                break
    return {
        "placements": placements,
        "placements_per_s": placements / sum(takes),
        "transactions": len(takes),
        "wall_s": time.perf_counter() - started,
        **_ms("", takes),
        **_ms("release_", gives),
        "unschedulable": unschedulable,
        # A run cut short (--arrivals) reports where it stopped.
        "unallocated_pct_at_100": 100 - held / capacity * 100
        if unallocated is None
        else unallocated,
        "reached_100": unallocated is not None,
        "held_job_ids": [job_id for jobs in due.values() for job_id, _ in jobs],
    }


def _ms(prefix: str, values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {f"{prefix}p50_ms": statistics.median(ordered) * 1000, f"{prefix}p99_ms": p99 * 1000}


@contextmanager
def fresh_database(kind: str, postgresql: str) -> Iterator[str]:
    """The URL of an empty database of this kind, removed afterwards."""
    if kind == "sqlite":
        with tempfile.TemporaryDirectory() as home:
            yield f"sqlite:///{Path(home) / 'gpuflow.db'}"
        return
    import psycopg

    name = f"fleet_scale_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgresql, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"{postgresql.rsplit('/', 1)[0]}/{name}"
    finally:
        with psycopg.connect(postgresql, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def over_allocations(store: Store) -> int:
    """GPUs held beyond one whole GPU, and hosts whose CPUs or memory are held beyond theirs."""
    with store.read() as session:
        rows = session.connection().execute(
            AllocationRow.__table__.select()  # type: ignore[attr-defined]
        )
        gpus: dict[tuple[str, int], float] = defaultdict(float)
        cpus: dict[str, float] = defaultdict(float)
        memory: dict[str, int] = defaultdict(int)
        for row in rows.mappings():
            for index in row["gpu_indices"]:
                gpus[row["host_id"], index] += row["gpu_fraction"] or 1.0
            cpus[row["host_id"]] += row["cpus"]
            memory[row["host_id"]] += row["memory_mib"]
        hosts = {
            host.id: host
            for host in session.connection().execute(
                HostRow.__table__.select()  # type: ignore[attr-defined]
            )
        }
    over = sum(used > 1 + EPSILON for used in gpus.values())
    over += sum(cpus[h] > hosts[h].cpus + EPSILON for h in cpus)
    return over + sum(memory[h] > hosts[h].memory_mib for h in memory)


def _worker(
    url: str,
    k: int,
    sequence: list[Pod],
    releases: dict[int, int],
    capacity: int,
    start: Any,
    out: Any,
) -> None:
    store = Store(url)
    start.wait()
    mine = range(k, len(sequence), 2)
    result = asyncio.run(product_run(store, sequence, releases, capacity, tag=f"w{k}", mine=mine))
    out.put(result)
    store.dispose()


def two_workers(
    url: str, spec: FleetSpec, sequence: list[Pod], releases: dict[int, int], capacity: int
) -> dict[str, Any]:
    store = Store(url).init()
    apply_fleet(store, spec)
    context = multiprocessing.get_context("spawn")
    start, out = context.Barrier(3), context.Queue()
    workers = [
        context.Process(target=_worker, args=(url, k, sequence, releases, capacity, start, out))
        for k in range(2)
    ]
    for worker in workers:
        worker.start()
    start.wait()
    begun = time.perf_counter()
    results = [out.get() for _ in workers]
    wall = time.perf_counter() - begun
    for worker in workers:
        worker.join()
    over = over_allocations(store)
    store.dispose()
    placements = sum(r["placements"] for r in results)
    return {
        "placements_per_s": placements / wall,
        "over_allocations": over,
        "placements": placements,
        "per_worker_p50_ms": [r["p50_ms"] for r in results],
        "per_worker_p99_ms": [r["p99_ms"] for r in results],
        "unschedulable": sum(r["unschedulable"] for r in results),
    }


def one_database(
    url: str, spec: FleetSpec, sequence: list[Pod], releases: dict[int, int], args: Any
) -> dict[str, Any]:
    capacity = args.capacity
    store = Store(url).init()
    try:
        apply_fleet(store, spec)
        result = asyncio.run(product_run(store, sequence, releases, capacity, tag="one"))
        result["over_allocations"] = over_allocations(store)
        if args.cold:
            tail = args.after[: args.cold]  # arrivals past the run's
            cold = asyncio.run(product_run(store, tail, {}, 1 << 62, tag="cold", warm=False))
            result["cold"] = {
                k: cold[k] for k in ("placements", "transactions", "p50_ms", "p99_ms")
            }
    finally:
        store.dispose()
    del result["held_job_ids"]
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", default="sqlite,postgresql", help="sqlite, postgresql or both")
    parser.add_argument("--postgresql", default=POSTGRESQL, help="a server to make databases on")
    parser.add_argument("--hosts", type=int, default=None, help="the first N openb nodes")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--arrivals", type=int, default=None, help="stop after N (quick runs)")
    parser.add_argument("--only-two-workers", action="store_true", help="skip the single runs")
    parser.add_argument("--cold", type=int, default=20, help="cold-path placements at the end")
    parser.add_argument("--no-two-workers", dest="two_workers", action="store_false")
    parser.add_argument("--trace-dir", type=Path, default=None)
    parser.add_argument("--json", type=Path, help="write the results here as JSON")
    args = parser.parse_args(argv)
    kinds = [kind.strip() for kind in args.db.split(",") if kind.strip()]
    if not kinds or set(kinds) - {"sqlite", "postgresql"}:
        parser.error(f"--db: sqlite and/or postgresql, got {args.db!r}")
    trace_dir = args.trace_dir or next((d for d in _TRACE_DIRS if d.exists()), _TRACE_DIRS[0])
    nodes = load_nodes(trace_dir / "openb_node_list_gpu_node.csv")[: args.hosts]
    spec = fleet_spec(nodes)
    args.capacity = capacity = sum(node.gpus for node in nodes) * 1000
    pods = load_pods(trace_dir / "openb_pod_list_default.csv")
    sequence = arrivals(pods, capacity, args.seed)
    releases = release_plan(sequence, args.seed)
    pure, taken = pure_run(nodes, sequence[: args.arrivals], releases, capacity)
    taken = min(taken, args.arrivals or taken)
    sequence, args.after = sequence[:taken], sequence[taken:] or sequence
    results: dict[str, Any] = {"hosts": len(nodes), "arrivals": taken}
    for kind in [] if args.only_two_workers else kinds:
        with fresh_database(kind, args.postgresql) as url:
            results[kind] = one_database(url, spec, sequence, releases, args)
        results[kind]["pure_unallocated_pct_at_100"] = pure
        _print(kind, results[kind])
    if args.two_workers:
        kind = "postgresql" if "postgresql" in kinds else kinds[0]
        with fresh_database(kind, args.postgresql) as url:
            results["two_workers"] = {
                "database": kind,
                **two_workers(url, spec, sequence, releases, capacity),
            }
        r = results["two_workers"]
        print(
            f"two workers on {kind}: {r['placements_per_s']:.1f} placements/s together, "
            f"{r['over_allocations']} over-allocations"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


def _print(kind: str, r: dict[str, Any]) -> None:
    print(
        f"{kind}: {r['placements']} placements, {r['placements_per_s']:.1f}/s, "
        f"p50 {r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms; releases p50 "
        f"{r.get('release_p50_ms', 0):.1f} / p99 {r.get('release_p99_ms', 0):.1f} ms; "
        f"unallocated at 100% {r['unallocated_pct_at_100']:.2f}% "
        f"(pure function {r['pure_unallocated_pct_at_100']:.2f}%), "
        f"{r['unschedulable']} unschedulable, {r['over_allocations']} over-allocations"
    )
    if "cold" in r:
        print(f"  cold path: p50 {r['cold']['p50_ms']:.1f} ms, p99 {r['cold']['p99_ms']:.1f} ms")


if __name__ == "__main__":
    raise SystemExit(main())
