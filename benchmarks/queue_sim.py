"""The queue benchmark's replay of the openb default trace (queueing.py `trace`): the pods as
jobs with their arrival, trace lifetime, priority and queue, and one policy's run over them in
simulated time, with the figures it reports. The protocol and the policies are in queueing.py's
docstring.
"""

from __future__ import annotations

import csv
import heapq
import random
import zlib
from dataclasses import dataclass
from pathlib import Path

from benchmarks.openb import OnlineMix, Pod, fleet_of, job_of, load_nodes, pod_of, snapshot_of
from gpuflow.scheduler import Placement, Snapshot, apply_placement, place, release_placement
from gpuflow.scheduler.admission import RESERVED_FOR, Reservation, Running, Waiting, admit
from gpuflow.scheduler.quota import gpu_count
from gpuflow.specs import JobSpec, QueueSpec

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


TIMED = ("qos", "creation_time", "deletion_time", "scheduled_time")
"""The columns the queue replays a trace by (the multigpu variants of openb list none)."""


def load_trace(path: Path) -> list[TracePod]:
    jobs: dict[tuple[int, int, int, int, str], JobSpec] = {}
    pods: list[TracePod] = []
    with path.open() as handle:
        reader = csv.DictReader(handle)
        missing = [column for column in TIMED if column not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{path.name} has no {', '.join(missing)}: nothing to replay in time")
        for row in reader:
            pod = pod_of(row)
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
        self.mix = OnlineMix(snapshot.fleets[0])
        """The fleet's mix the scorer uses, learned from the pods that arrived, as the product's
        admission pass scores with the mix its fleet's jobs make."""
        self.first_start: dict[str, int] = {}
        self.preemptions = self.inversions = self.behind_reservation = 0
        self.gpu_seconds = self.busy_gpu_seconds = 0.0
        self.span = self.busy_span = 0
        self.gap = self.kept = 0.0
        self.gap_now: float | None = None  # while both queues have waiting pods
        self.kept_now = 0.0
        self.gap_seconds = self.kept_seconds = 0.0
        self.both_span = 0
        self.reservation: Reservation | None = None
        self.held_for: dict[str, str] = {}
        """`queue`: a waiting pod -> the reserved pod whose room it may not take."""
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
                    self.mix.arrived(self.pods[name].job)
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
        self.held_for = {
            held.job.name: held.reason.removeprefix(RESERVED_FOR)
            for held in decision.waiting
            if held.reason.startswith(RESERVED_FOR)
        }
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
                    if self._behind_reservation(higher):
                        self.behind_reservation += 1
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

    def _behind_reservation(self, higher: TracePod) -> bool:
        """Whether the waiting pod fits only in room held for a reserved pod it may not delay
        (the admission's `reserved_for`): one of its queue at its priority or higher that came
        first (Slurm's backfill rule), or one of another queue within its quota where this pod
        would borrow (Kueue's order). The pod that started did not take its place."""
        return higher.name in self.held_for

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
            "inversions_behind_reservation": self.behind_reservation,
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
    trace: str = "default",
) -> tuple[dict[str, object], int]:
    nodes = sorted(load_nodes(data / "openb_node_list_gpu_node.csv"), key=lambda n: n.name)
    nodes = fleet_of(nodes[offset::nodes_every], shape)
    pods = load_trace(data / f"openb_pod_list_{trace}.csv")[:limit]
    empty = snapshot_of(nodes, "fragmentation", [])
    fitting = [p for p in pods if isinstance(place(p.job, empty), Placement)]
    sim = Simulation(snapshot_of(nodes, "fragmentation", []), fitting, policy)
    sim.run()
    return sim.report(), len(pods) - len(fitting)
