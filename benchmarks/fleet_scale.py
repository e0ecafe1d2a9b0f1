"""The product's placement path at fleet scale (issue #10), as a job submitted through the API
is placed since queues (#11): the submit's placement transaction (`enter_at_submit` in
gpuflow/control/admission.py: the job's first record and its queue entry, admitted there when
nobody waits), the workflow's first step (`enqueue_job`, which takes the verdict its submit got
in the same control worker, or reads what became of the entry), the admission loop's pass
(`admission_pass`) for a job that waits, and `release_job` for the releases, on a sim fleet of
openb's 1,213 GPU nodes (`--fleet`: a shape of the same GPUs, as placement.py's) in a fresh
database. Only Temporal is left out: each call is timed as
the activity runs it. The job rows it writes feed the fleet's learned request mix, as in the
product.

Protocol, per database (`--db sqlite,postgresql`; PostgreSQL gets a database of its own on the
server of `--postgresql URL`, dropped at the end):

- Arrivals are the openb `default` pods (`--trace`: another of placement.py's traces) in
  placement.py's seeded order (`arrivals`, seed 42),
  as gpuflow jobs (`job_of`), until the arrived demand (GPUs asked by jobs that arrived and were
  not released) reaches 100% of the fleet's GPUs. They are submitted `--in-flight` at a time
  (default 32, what one client keeps in flight: LANES x IN_FLIGHT in gpuflow/client/api.py),
  through the API's group commit (`GroupCommit`), so the submits of a group share placement
  transactions as concurrent submits do in the product; `--in-flight 1` submits one at a time.
- Every tenth job is released at a random moment, if it was placed: before an arrival drawn
  uniformly (seeded) between its own and the last of the sequence (if the run goes that far),
  moved to the start of the group that arrival is in (`grouped_releases`). The releases at the
  start of a group are called at once, as jobs that end together are released by their
  workflows (a control worker serves those that arrive together in one placement transaction,
  gpuflow/control/releases.py); `releases_per_s`: releases over the time their sets took,
  `release_p50_ms`/`release_p99_ms` per call.
- `unallocated_pct_at_100`: the fleet's GPUs not held when the arrived demand reaches 100%;
  `pure_unallocated_pct_at_100`: the same for the pure function (`gpuflow.scheduler.place` on
  an in-memory snapshot, the mix learned as benchmarks/placement.py learns it) on the same
  arrivals and releases.
- `placements_per_s`: placements over the time spent placing (groups of submits, each with its
  workflow's first step, and passes); p50/p99 are per submit, from its call to its
  workflow's verdict (a submit waits for the group it is in).
- `cold`: `--cold` more arrivals through the cold path (`warm=False`: the whole fleet read in
  each placement transaction, as before #10), on the final state.
- The process takes a control worker's garbage collector settings (gpuflow/control/
  collector.py), as `gpuflow up` and `python -m gpuflow.control.main` do.
- `--analyze-every S` (PostgreSQL): the single run with ANALYZE every S seconds from another
  connection, as autovacuum keeps the planner's statistics on a server in use; a fresh database
  has none for its first minute, and the planner then reads and sorts the whole jobs table for
  the fleets' newest jobs (benchmarks/README.md, "Seventh pass").
- `two_workers`: two processes, each a control worker with its own engine, place the same
  arrivals at once (alternate arrivals each, with their releases) on a fresh database of the
  first kind in `--db` that is PostgreSQL (else SQLite); `over_allocations` counts GPUs (and
  hosts' CPUs or memory) held beyond capacity in the database afterwards.

    python benchmarks/fleet_scale.py --json out.json
    python benchmarks/fleet_scale.py --in-flight 1 --json one-at-a-time.json
    python benchmarks/fleet_scale.py --db sqlite --hosts 300 --no-two-workers
    python benchmarks/fleet_scale.py --db sqlite --no-two-workers --fleet 2gpu --trace gpushare100
    python benchmarks/fleet_scale.py --db postgresql --no-two-workers --analyze-every 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import sys
import time
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for path in (ROOT, ROOT / "benchmarks"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from fleet_db import (  # noqa: E402
    _TRACE_DIRS,
    POSTGRESQL,
    analyzed,
    fleet_spec,
    fresh_database,
    over_allocations,
    record_of,
)
from fleet_plan import grouped_releases, pure_run, release_plan  # noqa: E402
from fleet_report import ms_of, print_result  # noqa: E402
from openb import FLEETS, LOW_CPUS_PER_GPU, fleet_of, unknown_traces  # noqa: E402
from placement import (  # noqa: E402
    Pod,
    arrivals,
    job_of,
    load_nodes,
    load_pods,
)

from gpuflow.client.api import IN_FLIGHT, LANES  # noqa: E402
from gpuflow.control import collector  # noqa: E402
from gpuflow.control.activities import ControlActivities  # noqa: E402
from gpuflow.control.admission import (  # noqa: E402
    AdmissionActivities,
    GroupCommit,
)
from gpuflow.services.fleets import apply_fleet  # noqa: E402
from gpuflow.services.group_entry import Submitted  # noqa: E402
from gpuflow.specs import FleetSpec  # noqa: E402
from gpuflow.specs.fleet import MAX_HOSTS  # noqa: E402
from gpuflow.status import JobStatus, TerminationReason  # noqa: E402
from gpuflow.store.db import Store  # noqa: E402
from gpuflow.workflows.models import ReleaseInput  # noqa: E402
from gpuflow.workflows.queue_models import (  # noqa: E402
    AdmissionState,
    EnqueueInput,
    PassInput,
    QueueVerdict,
)


async def product_run(
    store: Store,
    sequence: list[Pod],
    releases: dict[int, int],
    capacity: int,
    *,
    tag: str,
    in_flight: int = 1,
    mine: range | None = None,
    warm: bool = True,
) -> dict[str, Any]:
    """Place `sequence` (only the arrivals in `mine`, when given) as the product does, releasing
    as `releases` says, until the arrived demand reaches `capacity`. Arrivals come in groups of
    `in_flight` submits at once (releases fall between groups: `grouped_releases`). Per arrival:
    the submit's entry into the queue through the API's group commit (`GroupCommit`: one
    placement transaction for the submits that arrive together, which admits a job at once when
    nobody waits), then the workflow's first step (`enqueue_job`, which takes the verdict of a
    submit that decided the job in this worker and reads what became of any other entry; with
    several control workers a step may run on another worker than its submit and read there).
    A job that waits is decided by the admission loop's next pass (`admission_pass`), run
    here when the loop would be woken: after a group and after each release. Only Temporal is
    left out."""
    control = ControlActivities(store, warm=warm)
    admission = AdmissionActivities(store, warm=warm)
    entries = GroupCommit(store, warm=warm)
    admission.entries = entries  # as a control worker wires its API's submits to its steps
    state = AdmissionState()
    busy: list[float] = []  # placement work: each group of submits, each pass
    latencies: list[float] = []  # each submit, from its call to its workflow's verdict
    gives: list[float] = []  # each release, from its call to its answer
    giving: list[float] = []  # each set of releases that come together, all of it
    due: dict[int, list[tuple[str, Pod]]] = defaultdict(list)
    pods: dict[str, tuple[int, Pod]] = {}
    waiting: set[str] = set()
    arrived = held = unschedulable = placements = passes = 0

    def placed(job_id: str) -> None:
        nonlocal held, placements
        i, pod = pods[job_id]
        held += pod.gpu_milli_total
        placements += 1
        if i in releases:
            due[releases[i]].append((job_id, pod))

    async def admission_pass() -> None:
        nonlocal unschedulable, passes
        begun = time.perf_counter()
        result = await admission.admission_pass(PassInput(reservation=state.reservation))
        busy.append(time.perf_counter() - begun)
        passes += 1
        state.reservation = result.reservation
        for job in result.admitted:
            waiting.discard(job.job_id)
            placed(job.job_id)
        for refused in result.refused:
            waiting.discard(refused.job_id)
            unschedulable += 1

    async def submit(i: int, pod: Pod) -> QueueVerdict:
        job, job_id = job_of(pod), f"job-{tag}-{i}"
        pods[job_id] = (i, pod)
        begun = time.perf_counter()
        verdict = await entries.enter(Submitted(job_id, tag, job))
        ask = EnqueueInput(
            job_id=job_id, attempt=1, spec=job, submitted_at=datetime.now(UTC), may_wait=False
        )
        await admission.enqueue_job(ask)
        latencies.append(time.perf_counter() - begun)
        return verdict

    async def give(job_id: str, gone: Pod) -> None:
        nonlocal arrived, held
        ended = record_of(job_id, job_of(gone), JobStatus.DONE, reason=TerminationReason.DONE)
        begun = time.perf_counter()
        await control.release_job(ReleaseInput(job_id=job_id, record=ended))
        gives.append(time.perf_counter() - begun)
        arrived -= gone.gpu_milli_total
        held -= gone.gpu_milli_total

    started = time.perf_counter()
    for first in range(0, len(sequence), in_flight):
        ending = due.pop(first, [])
        if ending:  # jobs that end together release together, as their workflows do
            begun = time.perf_counter()
            await asyncio.gather(*(give(job_id, gone) for job_id, gone in ending))
            giving.append(time.perf_counter() - begun)
        if ending and waiting:
            await admission_pass()
        group = range(first, min(first + in_flight, len(sequence)))
        arrived += sum(sequence[i].gpu_milli_total for i in group)
        ours = [i for i in group if mine is None or i in mine]
        begun = time.perf_counter()
        verdicts = await asyncio.gather(*(submit(i, sequence[i]) for i in ours))
        busy.append(time.perf_counter() - begun)
        for i, verdict in zip(ours, verdicts, strict=True):
            if verdict.placement is not None:
                placed(f"job-{tag}-{i}")
            elif verdict.refused is not None:
                unschedulable += 1
            else:
                waiting.add(f"job-{tag}-{i}")
        if waiting:
            await admission_pass()
    return {
        "placements": placements,
        "placements_per_s": placements / sum(busy),
        "in_flight": in_flight,
        "transactions": entries.groups + passes,
        "wall_s": time.perf_counter() - started,
        **ms_of("", latencies),
        **ms_of("release_", gives),
        "releases": len(gives),
        "releases_per_s": len(gives) / sum(giving) if giving else 0.0,
        "release_transactions": getattr(getattr(control, "releases", None), "groups", None),
        "unschedulable": unschedulable,
        # the sequence ends where the arrived demand reaches 100% (or where --arrivals cut it)
        "unallocated_pct_at_100": 100 - held / capacity * 100,
        "reached_100": arrived >= capacity,
        "held_job_ids": [job_id for jobs in due.values() for job_id, _ in jobs],
    }


def _worker(
    url: str,
    k: int,
    sequence: list[Pod],
    releases: dict[int, int],
    capacity: int,
    in_flight: int,
    start: Any,
    out: Any,
) -> None:
    collector.settle()  # as a control worker's process does
    store = Store(url)
    start.wait()
    mine = range(k, len(sequence), 2)
    run = product_run(
        store, sequence, releases, capacity, tag=f"w{k}", in_flight=in_flight, mine=mine
    )
    result = asyncio.run(run)
    out.put(result)
    store.dispose()


def two_workers(
    url: str,
    spec: FleetSpec,
    sequence: list[Pod],
    releases: dict[int, int],
    capacity: int,
    in_flight: int,
) -> dict[str, Any]:
    store = Store(url).init()
    apply_fleet(store, spec)
    context = multiprocessing.get_context("spawn")
    start, out = context.Barrier(3), context.Queue()
    workers = [
        context.Process(
            target=_worker, args=(url, k, sequence, releases, capacity, in_flight, start, out)
        )
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
        run = product_run(store, sequence, releases, capacity, tag="one", in_flight=args.in_flight)
        with analyzed(url, args.analyze_every):
            result = asyncio.run(run)
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
    parser.add_argument("--hosts", type=int, default=None, help="the first N nodes")
    parser.add_argument(
        "--trace", default="default", help="openb's pods: openb_pod_list_NAME.csv in --trace-dir"
    )
    parser.add_argument("--fleet", default="openb", choices=FLEETS, help="openb's nodes or a shape")
    parser.add_argument("--cpus-per-gpu", type=int, default=LOW_CPUS_PER_GPU, help="--fleet lowcpu")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--arrivals", type=int, default=None, help="stop after N (quick runs)")
    parser.add_argument("--only-two-workers", action="store_true", help="skip the single runs")
    parser.add_argument(
        "--in-flight",
        type=int,
        default=LANES * IN_FLIGHT,
        help="submits at once (default: what one client keeps in flight; 1: one at a time)",
    )
    parser.add_argument("--cold", type=int, default=20, help="cold-path placements at the end")
    parser.add_argument("--no-two-workers", dest="two_workers", action="store_false")
    parser.add_argument(
        "--analyze-every",
        type=float,
        default=None,
        metavar="S",
        help="PostgreSQL: ANALYZE every S seconds during the single run (a server in use)",
    )
    parser.add_argument("--trace-dir", type=Path, default=None)
    parser.add_argument("--json", type=Path, help="write the results here as JSON")
    args = parser.parse_args(argv)
    kinds = [kind.strip() for kind in args.db.split(",") if kind.strip()]
    if not kinds or set(kinds) - {"sqlite", "postgresql"}:
        parser.error(f"--db: sqlite and/or postgresql, got {args.db!r}")
    if args.in_flight < 1:
        parser.error(f"--in-flight: at least 1, got {args.in_flight}")
    if args.hosts is not None and args.hosts < 1:
        parser.error(f"--hosts: at least 1, got {args.hosts}")
    trace_dir = args.trace_dir or next((d for d in _TRACE_DIRS if d.exists()), _TRACE_DIRS[0])
    missing = unknown_traces(trace_dir, [args.trace])
    if missing:
        parser.error(missing)
    openb = load_nodes(trace_dir / "openb_node_list_gpu_node.csv")
    nodes = fleet_of(openb, args.fleet, args.cpus_per_gpu)[: args.hosts]
    if len(nodes) > MAX_HOSTS:
        parser.error(f"{len(nodes)} hosts; a fleet holds at most {MAX_HOSTS}: add --hosts")
    spec = fleet_spec(nodes)
    args.capacity = capacity = sum(node.gpus for node in nodes) * 1000
    pods = load_pods(trace_dir / f"openb_pod_list_{args.trace}.csv")
    sequence = arrivals(pods, capacity, args.seed)
    releases = grouped_releases(release_plan(sequence, args.seed), args.in_flight)
    collector.settle()  # the collector's settings of a control worker's process
    pure, taken = pure_run(nodes, sequence[: args.arrivals], releases, capacity)
    taken = min(taken, args.arrivals or taken)
    sequence, args.after = sequence[:taken], sequence[taken:] or sequence
    results: dict[str, Any] = {
        "fleet": args.fleet,
        "trace": args.trace,
        "hosts": len(nodes),
        "arrivals": taken,
    }
    for kind in [] if args.only_two_workers else kinds:
        with fresh_database(kind, args.postgresql) as url:
            results[kind] = one_database(url, spec, sequence, releases, args)
        results[kind]["pure_unallocated_pct_at_100"] = pure
        print_result(kind, results[kind])
    if args.two_workers:
        kind = "postgresql" if "postgresql" in kinds else kinds[0]
        with fresh_database(kind, args.postgresql) as url:
            results["two_workers"] = {
                "database": kind,
                **two_workers(url, spec, sequence, releases, capacity, args.in_flight),
            }
        r = results["two_workers"]
        print(
            f"two workers on {kind}: {r['placements_per_s']:.1f} placements/s together, "
            f"{r['over_allocations']} over-allocations"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
