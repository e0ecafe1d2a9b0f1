"""Queue benchmark: the openb default trace online through admission, in simulated time.

    python benchmarks/queueing.py trace [--json PATH] [--every 100] [--offset 0] [--limit N]
                                        [--fleet openb|2gpu|1gpu|lowcpu]
    python benchmarks/queueing.py e2e [--json PATH] [-n 200]   (benchmarks/queue_e2e.py)

Pods arrive at `creation_time` and, once started, hold their resources for their trace
lifetime: `deletion_time - scheduled_time`, or `deletion_time - creation_time` for the pods the
trace never scheduled (`Pending`: the time their owner wanted them). Priority from `qos`: LS and
Guaranteed 100, Burstable 50, BE 0 and preemptible (a preempted pod waits again and restarts
from the beginning). Two queues split the fleet's GPUs 50/50 in one cohort; a pod goes to the
queue picked by the CRC-32 of its name. At its real rate the trace never uses more than 66 GPUs
at once, so the fleet is every `--every`-th node of the 1,213 openb GPU nodes by name from the
`--offset`-th (100 from 0: 13 nodes, 56 GPUs), or those nodes cut into nodes of 2 or 1 GPUs
(`--fleet`, as in placement.py); pods that fit nowhere even on the empty fleet are left out (and
counted).

Policies, on the same arrivals: `today` (what the job workflow's place step does: each pod
retries alone, 5 s doubling to 5 min between tries, and every release wakes every waiting pod,
which then race for the freed capacity in an order nobody controls: a seeded shuffle here),
`fifo` (submission order; the first pod that does not fit blocks the rest), `queue`
(gpuflow.scheduler.admission, one pass at every instant when a pod arrives or ends; the trace
declares no durations, so backfill uses reserved hosts only beside the room the reserved pod
needs) and `queue+limits` (the same, each pod declaring its trace lifetime as max_duration: an
oracle).
Figures per policy: see README.md ("Queue").
"""

from __future__ import annotations

import argparse
import csv
import heapq
import json
import random
import sys
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.placement import FLEETS, Pod, fleet_of, job_of, load_nodes, snapshot_of  # noqa: E402
from gpuflow.scheduler import Placement, Snapshot, apply_placement, place, release_placement  # noqa: E402
from gpuflow.scheduler.admission import Reservation, Running, Waiting, admit  # noqa: E402
from gpuflow.scheduler.quota import gpu_count  # noqa: E402
from gpuflow.specs import JobSpec, QueueSpec  # noqa: E402


def _data_dir() -> Path:
    """`shared/data/openb` beside the checkout, or beside a folder above it (a git worktree)."""
    for folder in ROOT.parents:
        if (folder / "shared" / "data" / "openb").is_dir():
            return folder / "shared" / "data" / "openb"
    return ROOT.parent / "shared" / "data" / "openb"


POLICIES = ("today", "fifo", "queue", "queue+limits")
PRIORITY = {"LS": 100, "Guaranteed": 100, "Burstable": 50, "BE": 0}
QUEUES = ("a", "b")
FIRST_RETRY_S, MAX_RETRY_S = 5, 300


@dataclass(frozen=True)
class TracePod:
    name: str
    pod: Pod
    job: JobSpec
    arrival: int
    lifetime: int
    priority: int
    queue: str

    @property
    def preemptible(self) -> bool:
        return self.priority == 0


def load_trace(path: Path) -> list[TracePod]:
    jobs: dict[tuple[int, int, int, int, str], JobSpec] = {}
    pods: list[TracePod] = []
    with path.open() as handle:
        for row in csv.DictReader(handle):
            pod = Pod(
                row["name"],
                int(row["cpu_milli"]),
                int(row["memory_mib"]),
                int(row["num_gpu"]),
                int(row["gpu_milli"]),
                row.get("gpu_spec") or "",
            )
            shape = (pod.cpu_milli, pod.memory_mib, pod.num_gpu, pod.gpu_milli, pod.gpu_spec)
            job = jobs.get(shape) or jobs.setdefault(shape, job_of(pod))
            created = int(row["creation_time"])
            began = int(row["scheduled_time"] or created)
            queue = QUEUES[zlib.crc32(pod.name.encode()) % len(QUEUES)]
            lifetime = max(1, int(row["deletion_time"]) - began)
            pods.append(
                TracePod(pod.name, pod, job, created, lifetime, PRIORITY[row["qos"]], queue)
            )
    return sorted(pods, key=lambda p: (p.arrival, p.name))


def percentile(values: list[float], share: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


class Simulation:
    """Events in simulated time; the policy decides at every instant something happens."""

    def __init__(self, snapshot: Snapshot, pods: list[TracePod], policy: str) -> None:
        self.snapshot, self.policy = snapshot, policy
        self.fleet_gpus = sum(len(h.gpus) for h in snapshot.hosts())
        self.pods = {p.name: p for p in pods}
        self.submitted = {p.name: i for i, p in enumerate(pods)}
        """Arrival order; a preempted pod keeps its place."""
        self.events: list[tuple[int, int, int, str]] = []  # (time, kind, seq, pod); ends first
        self.seq = 0
        for pod in pods:
            self._push(pod.arrival, 1, pod.name)
        self.waiting: dict[str, int] = {}  # pod -> submission order
        self.running: dict[str, Running] = {}
        self.runs: dict[str, int] = {}  # pod -> the run whose end event counts
        self.backoff: dict[str, int] = {}
        self.retry_due: set[str] = set()
        self.timer: dict[str, int] = {}  # pod -> the seq of its live backoff timer (today)
        self.race = random.Random(f"race-{policy}")
        self.first_start: dict[str, int] = {}
        self.preemptions = self.inversions = 0
        self.gpu_seconds = self.busy_gpu_seconds = 0.0
        self.span = self.busy_span = 0
        self.gap = self.kept = 0.0
        self.gap_now: float | None = None  # while both queues have waiting pods
        self.kept_now = 0.0
        self.gap_seconds = self.kept_seconds = 0.0
        self.both_span = 0
        self.reservation: Reservation | None = None
        self.limited: dict[str, JobSpec] = {}
        self.queues = [QueueSpec(name=q, gpus=self.fleet_gpus // 2, cohort="openb") for q in QUEUES]

    def _push(self, at: int, kind: int, name: str) -> None:
        self.seq += 1
        heapq.heappush(self.events, (at, kind, self.seq, name))

    def run(self) -> None:
        last = self.events[0][0] if self.events else 0
        while self.events:
            now = self.events[0][0]
            self._account(last, now)
            last = now
            while self.events and self.events[0][0] == now:
                _, kind, seq, name = heapq.heappop(self.events)
                if kind == 0 and self.runs.get(name) == seq:
                    del self.runs[name]
                    release_placement(self.snapshot, self.running.pop(name).placement)
                    if self.policy == "today":  # release_job signals every waiting job
                        self.retry_due.update(self.waiting)
                elif kind == 1:
                    self.waiting[name] = self.submitted[name]
                    self.retry_due.add(name)
                elif kind == 2 and name in self.waiting and self.timer.get(name) == seq:
                    self.retry_due.add(name)
            started = self._decide(now)
            self._after(now, started)

    def _account(self, last: int, now: int) -> None:
        held = sum(gpu_count(r.placement) for r in self.running.values())
        self.gpu_seconds += held * (now - last)
        self.span += now - last
        if self.waiting:
            self.busy_gpu_seconds += held * (now - last)
            self.busy_span += now - last
        if self.gap_now is not None:
            self.gap_seconds += self.gap_now * (now - last)
            self.kept_seconds += self.kept_now * (now - last)
            self.both_span += now - last

    def _start(self, name: str, placement: Placement, now: int, *, applied: bool) -> None:
        pod = self.pods[name]
        if not applied:
            apply_placement(self.snapshot, placement)
        del self.waiting[name]
        self.backoff.pop(name, None)
        self.first_start.setdefault(name, now)
        self._push(now + pod.lifetime, 0, name)
        self.runs[name] = self.seq
        ends = now + pod.lifetime if self.policy == "queue+limits" else None
        self.running[name] = Running(
            name, pod.queue, placement, pod.priority, pod.preemptible, now, ends
        )

    def _decide(self, now: int) -> list[str]:
        if self.policy.startswith("queue"):
            return self._admit(now)
        if self.policy == "fifo":
            started = []
            for name in sorted(self.waiting, key=self.waiting.__getitem__):
                found = place(self.pods[name].job, self.snapshot)
                if not isinstance(found, Placement):
                    break
                self._start(name, found, now, applied=False)
                started.append(name)
            return started
        # today: every due pod tries alone; who reaches the database lock first is a race.
        started = []
        due = sorted(self.retry_due, key=self.waiting.__getitem__)
        self.race.shuffle(due)
        for name in due:
            found = place(self.pods[name].job, self.snapshot)
            if isinstance(found, Placement):
                self._start(name, found, now, applied=False)
                started.append(name)
            else:  # waits again on a new timer (a wake ends the old one), backoff doubled
                delay = self.backoff.get(name, FIRST_RETRY_S)
                self.backoff[name] = min(MAX_RETRY_S, delay * 2)
                self._push(now + delay, 2, name)
                self.timer[name] = self.seq
        self.retry_due.clear()
        return started

    def _job(self, pod: TracePod) -> JobSpec:
        """`queue+limits`: the pod declares its trace lifetime as max_duration (an oracle: real
        limits are longer than what jobs use)."""
        if self.policy != "queue+limits":
            return pod.job
        job = self.limited.get(pod.name)
        if job is None:
            job = self.limited[pod.name] = pod.job.model_copy(update={"max_duration": pod.lifetime})
        return job

    def _admit(self, now: int) -> list[str]:
        self.retry_due.clear()
        waiting = [
            Waiting(n, p.queue, self._job(p), p.arrival, p.priority, p.preemptible)
            for n in self.waiting
            for p in (self.pods[n],)
        ]
        decision = admit(
            queues=self.queues,
            running=list(self.running.values()),
            waiting=waiting,
            snapshot=self.snapshot,
            now=now,
            reserved=self.reservation,
        )
        self.reservation = decision.reservation
        for admitted in decision.admitted:
            for victim in admitted.victims:
                self.preemptions += 1
                self.running.pop(victim)
                del self.runs[victim]
                self.waiting[victim] = self.submitted[victim]
            self._start(admitted.job.name, admitted.placement, now, applied=True)
        return [a.job.name for a in decision.admitted]

    def _after(self, now: int, started: list[str]) -> None:
        """Priority inversions and the queues' share gap at this instant."""
        fits: dict[int, bool] = {}
        for name in started:
            pod = self.pods[name]
            for other in self.waiting:
                higher = self.pods[other]
                if higher.queue != pod.queue or higher.priority <= pod.priority:
                    continue
                key = id(higher.job)
                if key not in fits:
                    fits[key] = isinstance(place(higher.job, self.snapshot), Placement)
                if fits[key]:
                    self.inversions += 1
                    break
        self.gap_now, self.kept_now = None, 0.0
        if {self.pods[n].queue for n in self.waiting} == set(QUEUES):
            held = dict.fromkeys(QUEUES, 0.0)
            for run in self.running.values():
                held[run.queue] += gpu_count(run.placement)
            total = sum(held.values())
            if total:
                self.gap_now = max(abs(h / total - 0.5) for h in held.values())
                self.gap = max(self.gap, self.gap_now)
                self.kept_now = max(self._kept(queue, held) for queue in QUEUES) / total
                self.kept = max(self.kept, self.kept_now)

    def _kept(self, queue: str, held: dict[str, float]) -> float:
        """GPUs the other queue's borrowing keeps from this one: what it is below its nominal
        quota, at most what the other holds beyond its own, and what its waiting pods ask for
        among those that would fit were the other queue's pods gone."""
        other, nominal = next(q for q in QUEUES if q != queue), self.fleet_gpus // 2
        most = min(nominal - held[queue], held[other] - nominal)
        if most <= 0:
            return 0.0
        theirs = [r.placement for r in self.running.values() if r.queue == other]
        for placement in theirs:
            release_placement(self.snapshot, placement)
        mine = [self.pods[n] for n in self.waiting if self.pods[n].queue == queue]
        fits = [p.pod for p in mine if isinstance(place(p.job, self.snapshot), Placement)]
        wanted = sum(pod.gpu_milli_total for pod in fits) / 1000
        for placement in theirs:
            apply_placement(self.snapshot, placement)
        return min(most, wanted)

    def report(self) -> dict[str, object]:
        waits: dict[int, list[float]] = {100: [], 50: [], 0: []}
        for name, pod in self.pods.items():
            if name in self.first_start:
                waits[pod.priority].append(self.first_start[name] - pod.arrival)
        eight = [
            self.first_start.get(n, self.span) - p.arrival
            for n, p in self.pods.items()
            if p.pod.num_gpu == 8
        ]
        return {
            "wait_s": {
                str(k): {"mean": sum(v) / len(v) if v else 0.0, "p95": percentile(v, 0.95)}
                for k, v in waits.items()
            },
            "never_started": len(self.pods) - len(self.first_start),
            "gpu_alloc_pct": 100 * self.gpu_seconds / max(1, self.span * self.fleet_gpus),
            "gpu_alloc_busy_pct": 100
            * self.busy_gpu_seconds
            / max(1, self.busy_span * self.fleet_gpus),
            "priority_inversions": self.inversions,
            "preemptions": self.preemptions,
            "max_wait_8gpu_s": max(eight, default=0),
            "max_share_gap_pct": 100 * self.gap,
            "mean_share_gap_pct": 100 * self.gap_seconds / max(1, self.both_span),
            "max_quota_gap_pct": 100 * self.kept,
            "mean_quota_gap_pct": 100 * self.kept_seconds / max(1, self.both_span),
            "both_waiting_s": self.both_span,
        }


def simulate(
    data: Path,
    nodes_every: int,
    limit: int | None,
    policy: str,
    *,
    offset: int = 0,
    shape: str = "openb",
) -> tuple[dict[str, object], int]:
    nodes = sorted(load_nodes(data / "openb_node_list_gpu_node.csv"), key=lambda n: n.name)
    nodes = fleet_of(nodes[offset::nodes_every], shape)
    pods = load_trace(data / "openb_pod_list_default.csv")[:limit]
    empty = snapshot_of(nodes, "fragmentation", [])
    fitting = [p for p in pods if isinstance(place(p.job, empty), Placement)]
    sim = Simulation(snapshot_of(nodes, "fragmentation", []), fitting, policy)
    sim.run()
    return sim.report(), len(pods) - len(fitting)


FIGURES = (  # heading, JSON key, width, format
    ("alloc%", "gpu_alloc_pct", 7, ".2f"),
    ("busy%", "gpu_alloc_busy_pct", 7, ".1f"),
    ("invers", "priority_inversions", 7, ""),
    ("preempt", "preemptions", 8, ""),
    ("8-GPU max s", "max_wait_8gpu_s", 12, ".0f"),
    ("unstarted", "never_started", 10, ""),
)
GAPS = (
    ("gap max", "max_share_gap_pct", 8, ".1f"),
    ("gap avg", "mean_share_gap_pct", 8, ".1f"),
    ("quota gap max", "max_quota_gap_pct", 15, ".1f"),
    ("quota gap avg", "mean_quota_gap_pct", 15, ".1f"),
    ("both wait s", "both_waiting_s", 12, ""),
)


def table(results: dict[str, dict[str, object]]) -> str:
    """Three tables under 80 columns: waits per priority class, the other figures, then the
    share gaps (percentage points, while both queues have waiting pods)."""
    lines = [f"{'wait s: mean / p95':<20}{'prio 100':>17}{'prio 50':>17}{'prio 0':>17}"]
    for policy, report in results.items():
        waits = report["wait_s"]
        assert isinstance(waits, dict)
        cells = "".join(
            f"{waits[k]['mean']:>8.0f} /{waits[k]['p95']:>7.0f}" for k in ("100", "50", "0")
        )
        lines.append(f"{policy:<20}{cells}")
    for title, columns in (("policy", FIGURES), ("share gap", GAPS)):
        lines += ["", f"{title:<13}" + "".join(f"{head:>{width}}" for head, _, width, _ in columns)]
        for policy, r in results.items():
            cells = "".join(format(r[key], f">{width}{how}") for _, key, width, how in columns)
            lines.append(f"{policy:<13}{cells}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=["trace", "e2e"])
    parser.add_argument("--json", type=Path, help="write {trace: {policy: {...}}} here")
    parser.add_argument("-n", type=int, default=200, help="e2e: jobs of `sleep 2`")
    parser.add_argument("--every", type=int, default=100, help="take every Nth openb GPU node")
    parser.add_argument("--offset", type=int, default=0, help="starting from this one")
    parser.add_argument(
        "--fleet", default="openb", choices=FLEETS, help="those nodes, or cut in 2 or 1 GPUs"
    )
    parser.add_argument("--limit", type=int, help="only the first N pods (by arrival)")
    parser.add_argument("--trace-dir", type=Path, default=_data_dir())
    parser.add_argument("--policies", default=",".join(POLICIES))
    args = parser.parse_args(argv)
    if args.mode == "e2e":
        from benchmarks.queue_e2e import main_e2e

        main_e2e(args.n, args.json)
        return 0
    results: dict[str, dict[str, object]] = {}
    for policy in args.policies.split(","):
        if policy not in POLICIES:
            parser.error(f"unknown policy {policy!r}; allowed: {', '.join(POLICIES)}")
        began = time.perf_counter()
        report, left_out = simulate(
            args.trace_dir, args.every, args.limit, policy, offset=args.offset, shape=args.fleet
        )
        report["seconds"] = round(time.perf_counter() - began, 1)
        report["pods_left_out"] = left_out
        results[policy] = report
        print(f"{policy}: {report['seconds']} s", file=sys.stderr)
    print(table(results))
    if args.json:
        existing = json.loads(args.json.read_text()) if args.json.exists() else {}
        existing["trace"] = results
        args.json.write_text(json.dumps(existing, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
