"""What one admission pass costs at fleet scale with a long queue: openb's 1,213 GPU nodes
nearly full, W jobs waiting, a pass after each release, as the admission loop runs it
(gpuflow/workflows/admission.py -> `AdmissionActivities.admission_pass`). Only Temporal is left
out: each activity is called as the control worker calls it.

Protocol, per database (`--db sqlite,postgresql`; PostgreSQL gets a database of its own on the
server of `--postgresql URL`, dropped at the end):

- Fleet: openb's GPU nodes as one sim fleet (fleet_scale.py's `fleet_spec`) in a fresh database.
- Fill: the openb `default` pods in placement.py's seeded order (`arrivals`, `--seed`) enter
  through the submit's placement transaction (`enter_at_submit`, as fleet_scale.py does) until
  `--fill` (95%) of the fleet's GPUs are held or the arrivals run out. They may not wait (no
  `retry`), so one that does not fit is refused at once. No job declares a `max_duration` (the
  trace has none), so a reservation's start is unknown and it drains the most recent jobs.
- Queue: for each W of `--waiting` in increasing order, jobs drawn at random (seeded) from the
  same pods, so small and large as the trace mixes them (GPU shares, 1, 2, 4 and 8 GPUs), with
  `retry: {on_events: [no-capacity], duration: 1h}`, are submitted the same way until W wait
  (while none waits, one that fits is admitted at its submit and runs).
- Passes: `--passes` cycles of `release_job` (the control worker's activity, with the job's
  `done` record) of a running job drawn at random, then one timed `admission_pass` carrying
  the reservation from pass to pass as the loop does; then the queue is topped up to W again
  (submissions, not timed: the loop coalesces their wakes into the next pass). One untimed
  pass first, so every W starts from a queue that a pass has seen.
- `--reclaim`: the fleet's GPUs split between two queues of one cohort, `lender` and
  `borrower`, half each (`gpus: N`, a total). The fill goes to `borrower` as preemptible jobs of
  priority 0, so it borrows all it holds beyond its half; the waiting jobs go to `lender`,
  within its own quota, so each blocked one may preempt the borrower's jobs to take its quota
  back (scheduler/preemption.py: the fewest victims of what the borrower borrows, then, when
  those make no room where the job fits, the same among one host's jobs at a time). Passes
  then preempt, and the figures are the cost of deciding whom; the victims stop (their
  `release_job`, untimed) before the next pass, which admits the jobs they were stopped for.
- Stages, timed by wrapping the functions the pass calls (in this process, during timed passes
  only): `entries` (the queue entries, the queues, the waiting jobs' specs), `placements` (the
  running jobs with what each holds), `snapshot` (the warm fleet state caught up), `decide`
  (the scheduler's `admit`; `reservation` is its `earliest_start` part), `commit` (admissions,
  waiting reasons, the warm state's resync), `transaction` (the rest of the activity: the
  placement lock, the database commit, metrics, the thread hop).
- Reported per W: pass p50 / p99 ms, passes/s (passes over the time spent in them), mean ms
  per stage, jobs admitted per pass, running and waiting jobs, the largest pass result (the
  payload Temporal carries, 2 MiB at most; the untimed passes after the top-up included, which
  word the newly waiting jobs, each followed at once by another while it left some, as the loop
  does); per database, GPUs over-allocated at the end (fleet_scale.py's `over_allocations`).

    python benchmarks/admission_scale.py --json out.json
    python benchmarks/admission_scale.py --db sqlite --waiting 10,100 --hosts 300 --passes 10
    python benchmarks/admission_scale.py --db sqlite --waiting 10,100 --reclaim
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for path in (ROOT, ROOT / "benchmarks"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from fleet_db import (  # noqa: E402
    _TRACE_DIRS,
    POSTGRESQL,
    fleet_spec,
    fresh_database,
    over_allocations,
    record_of,
)
from placement import Pod, arrivals, job_of, load_nodes, load_pods  # noqa: E402

import gpuflow.control.admission as control_admission  # noqa: E402
import gpuflow.scheduler.admission as scheduler_admission  # noqa: E402
import gpuflow.services.admission as service_admission  # noqa: E402
from gpuflow.control.activities import ControlActivities  # noqa: E402
from gpuflow.control.admission import AdmissionActivities, enter_at_submit  # noqa: E402
from gpuflow.payloads import DATA_CONVERTER  # noqa: E402
from gpuflow.services.fleets import apply_fleet  # noqa: E402
from gpuflow.services.queues import apply_queue  # noqa: E402
from gpuflow.specs import JobSpec  # noqa: E402
from gpuflow.specs.queue import QueueSpec  # noqa: E402
from gpuflow.status import JobStatus, TerminationReason  # noqa: E402
from gpuflow.store.db import Store  # noqa: E402
from gpuflow.workflows.models import ReleaseInput  # noqa: E402
from gpuflow.workflows.queue_models import PassInput, ReservationState  # noqa: E402

STAGES: dict[str, list[tuple[Any, str]]] = {
    "entries": [(service_admission, "_read_entries"), (service_admission, "queues_in")],
    "specs": [(service_admission, "_parse_specs"), (service_admission, "_waiting")],
    "placements": [(service_admission, "_running_jobs")],
    "snapshot": [(service_admission, "_snapshot")],
    "decide": [(service_admission, "admit")],
    "reservation": [(scheduler_admission, "earliest_start")],
    "commit": [
        (service_admission, "_commit"),
        (service_admission, "_hold"),
        (service_admission, "_resync"),
    ],
    "pass": [(control_admission, "run_pass_in")],
}
"""Stage -> the functions whose time it is (those the code at hand has). `reservation` is part
of `decide`; `pass` is all of `run_pass_in` (the activity's time beyond it is `transaction`)."""
WAITING_RETRY = {"on_events": ["no-capacity"], "duration": "1h"}
RECLAIMABLE = {"queue": "borrower", "preemptible": True, "priority": 0}


class Stages:
    """Time spent in each stage while `on`, by wrapping the module functions in STAGES."""

    def __init__(self) -> None:
        self.on = False
        self.spent: dict[str, float] = defaultdict(float)
        for stage, targets in STAGES.items():
            for module, name in targets:
                if hasattr(module, name):
                    setattr(module, name, self._timed(stage, getattr(module, name)))

    def _timed(self, stage: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            if not self.on:
                return function(*args, **kwargs)
            begun = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.spent[stage] += time.perf_counter() - begun

        return timed

    @contextmanager
    def measuring(self) -> Iterator[dict[str, float]]:
        self.spent, self.on = defaultdict(float), True
        try:
            yield self.spent
        finally:
            self.on = False


class Bench:
    """One database: the fleet, its running jobs and its queue, driven as the product is."""

    def __init__(
        self, store: Store, pods: list[Pod], capacity: int, seed: int, *, reclaim: bool
    ) -> None:
        self.store, self.pods, self.capacity, self.reclaim = store, pods, capacity, reclaim
        self.more = False
        """The last pass left admissions or words for the next."""
        self.largest = 0
        """The largest pass result since the queue was last topped up to a new W, in bytes as
        Temporal carries it (one payload: 2 MiB at most)."""
        self.rng = random.Random(seed)
        self.control = ControlActivities(store)
        self.admission = AdmissionActivities(store)
        self.reservation: ReservationState | None = None
        self.running: dict[str, int] = {}
        """Job id -> the milli-GPUs it holds."""
        self.asks: dict[str, tuple[int, JobSpec]] = {}
        self.waiting: set[str] = set()
        self.submitted = 0
        self.preempted = 0
        self.stopping: set[str] = set()
        """Jobs preempted and not yet stopped."""

    @property
    def held_pct(self) -> float:
        return sum(self.running.values()) / self.capacity * 100

    def submit(self, pod: Pod, *, may_wait: bool) -> None:
        job = job_of(pod)
        extra: dict[str, Any] = {"retry": WAITING_RETRY} if may_wait else {}
        if self.reclaim:
            extra |= {"queue": "lender"} if may_wait else RECLAIMABLE
        if extra:
            job = JobSpec.model_validate({**job.model_dump(mode="json"), **extra})
        job_id = f"job-{self.submitted}"
        self.submitted += 1
        self.asks[job_id] = (pod.gpu_milli_total, job)
        verdict = enter_at_submit(self.store, job_id=job_id, run_id="bench", spec=job)
        if verdict.placement is not None:
            self.running[job_id] = pod.gpu_milli_total
        elif verdict.refused is None:
            self.waiting.add(job_id)

    def fill(self, sequence: list[Pod], target_pct: float) -> None:
        for pod in sequence:
            if self.held_pct >= target_pct:
                return
            self.submit(pod, may_wait=False)

    def top_up(self, waiting: int) -> None:
        while len(self.waiting) < waiting:
            self.submit(self.pods[self.rng.randrange(len(self.pods))], may_wait=True)

    async def release_one(self) -> None:
        job_id = self.rng.choice(sorted(set(self.running) - self.stopping))
        record = record_of(
            job_id, self.asks[job_id][1], JobStatus.DONE, reason=TerminationReason.DONE
        )
        await self.control.release_job(ReleaseInput(job_id=job_id, record=record))
        del self.running[job_id]

    async def admission_pass(self) -> int:
        result = await self.admission.admission_pass(PassInput(reservation=self.reservation))
        self.reservation = result.reservation
        self.more = result.more
        payload = DATA_CONVERTER.payload_converter.to_payloads([result])[0]
        self.largest = max(self.largest, len(payload.SerializeToString()))
        for job in result.admitted:
            self.waiting.discard(job.job_id)
            self.running[job.job_id] = self.asks[job.job_id][0]
        for refused in result.refused:
            self.waiting.discard(refused.job_id)
        for victim in result.preempted:
            if victim.job_id in self.running:
                self.stopping.add(victim.job_id)
            self.preempted += 1
        return len(result.admitted)

    async def stop_victims(self) -> None:
        """The preempted jobs stop, as their workflows would, and release what they held."""
        for job_id in sorted(self.stopping):
            record = record_of(
                job_id,
                self.asks[job_id][1],
                JobStatus.TERMINATED,
                reason=TerminationReason.PREEMPTED,
            )
            await self.control.release_job(ReleaseInput(job_id=job_id, record=record))
            del self.running[job_id]
        self.stopping.clear()

    async def passes(self, waiting: int, count: int, stages: Stages) -> dict[str, Any]:
        self.top_up(waiting)
        self.largest = 0
        await self.admission_pass()
        while self.more:  # as the loop does: a pass that left some is followed at once
            await self.admission_pass()
        await self.stop_victims()
        self.top_up(waiting)
        at_start = {"running": len(self.running), "held_pct": round(self.held_pct, 2)}
        took: list[float] = []
        spent: list[dict[str, float]] = []
        admitted = 0
        preempted = self.preempted
        for _ in range(count):
            await self.release_one()
            with stages.measuring() as stage_s:
                begun = time.perf_counter()
                admitted += await self.admission_pass()
                took.append(time.perf_counter() - begun)
            spent.append({**stage_s, "transaction": took[-1] - stage_s["pass"]})
            await self.stop_victims()  # before the next pass, which admits their preemptors
            self.top_up(waiting)
        ordered = sorted(took)
        names = [stage for stage in STAGES if stage != "pass"] + ["transaction"]
        return {
            "waiting": waiting,
            **at_start,
            "passes": count,
            "p50_ms": statistics.median(ordered) * 1000,
            "p99_ms": ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))] * 1000,
            "passes_per_s": count / sum(took),
            "admitted_per_pass": admitted / count,
            "preempted_per_pass": (self.preempted - preempted) / count,
            "largest_result_kb": self.largest / 1024,
            "stages_ms": {
                name: statistics.fmean(s.get(name, 0.0) for s in spent) * 1000 for name in names
            },
        }


def one_database(url: str, args: Any, stages: Stages) -> dict[str, Any]:
    store = Store(url).init()
    try:
        apply_fleet(store, args.spec)
        if args.reclaim:
            half = args.capacity // 2000
            for name in ("lender", "borrower"):
                apply_queue(store, QueueSpec(name=name, gpus=half, cohort="bench"))
        bench = Bench(store, args.pods, args.capacity, args.seed, reclaim=args.reclaim)
        begun = time.perf_counter()
        bench.fill(args.sequence, args.fill * 100)
        result: dict[str, Any] = {
            "fill": {
                "running": len(bench.running),
                "held_pct": round(bench.held_pct, 2),
                "seconds": round(time.perf_counter() - begun, 1),
            },
            "by_waiting": {},
        }
        print(f"  filled: {result['fill']}", flush=True)
        for waiting in args.waiting:
            row = asyncio.run(bench.passes(waiting, args.passes, stages))
            result["by_waiting"][str(waiting)] = row
            _print(row)
        result["over_allocations"] = over_allocations(store)
    finally:
        store.dispose()
    return result


def _print(r: dict[str, Any]) -> None:
    stages = ", ".join(f"{name} {ms:.1f}" for name, ms in r["stages_ms"].items())
    print(
        f"  W={r['waiting']}: {r['running']} running ({r['held_pct']:.1f}% GPUs), pass p50 "
        f"{r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms, {r['passes_per_s']:.1f} passes/s, "
        f"{r['admitted_per_pass']:.2f} admitted/pass, {r['preempted_per_pass']:.2f} "
        f"preempted/pass, largest result "
        f"{r['largest_result_kb']:,.0f} KB; ms: {stages}",
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", default="sqlite,postgresql", help="sqlite, postgresql or both")
    parser.add_argument("--postgresql", default=POSTGRESQL, help="a server to make databases on")
    parser.add_argument("--waiting", default="10,100,1000", help="queue lengths, increasing")
    parser.add_argument("--passes", type=int, default=30, help="timed passes per queue length")
    parser.add_argument("--fill", type=float, default=0.95, help="share of GPUs held first")
    parser.add_argument("--hosts", type=int, default=None, help="the first N openb nodes")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument(
        "--reclaim", action="store_true", help="the waiting jobs take quota back by preemption"
    )
    parser.add_argument("--trace-dir", type=Path, default=None)
    parser.add_argument("--json", type=Path, help="write the results here as JSON")
    args = parser.parse_args(argv)
    kinds = [kind.strip() for kind in args.db.split(",") if kind.strip()]
    if not kinds or set(kinds) - {"sqlite", "postgresql"}:
        parser.error(f"--db: sqlite and/or postgresql, got {args.db!r}")
    args.waiting = sorted(int(w) for w in args.waiting.split(","))
    trace_dir = args.trace_dir or next((d for d in _TRACE_DIRS if d.exists()), _TRACE_DIRS[0])
    nodes = load_nodes(trace_dir / "openb_node_list_gpu_node.csv")[: args.hosts]
    args.spec = fleet_spec(nodes)
    args.capacity = sum(node.gpus for node in nodes) * 1000
    pods = load_pods(trace_dir / "openb_pod_list_default.csv")
    args.sequence = arrivals(pods, args.capacity, args.seed)
    args.pods = [pod for pod in pods if pod.num_gpu]  # what the waiting jobs are drawn from
    stages = Stages()
    results: dict[str, Any] = {"hosts": len(nodes), "gpus": args.capacity // 1000}
    for kind in kinds:
        print(f"{kind}:", flush=True)
        with fresh_database(kind, args.postgresql) as url:
            results[kind] = one_database(url, args, stages)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
