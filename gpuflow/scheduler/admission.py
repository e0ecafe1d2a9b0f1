"""One admission pass (docs/architecture.md, "Queues and admission"): which waiting jobs start
now, on which placement, and which running jobs are preempted for them. Pure and deterministic:
it reads the queues, the jobs and a snapshot of the fleets, and changes only that snapshot
(admitted placements applied, victims' released), as `plan_together` does.

Order: the queue with the lowest dominant share goes next (recomputed after every admission),
within a queue higher priority first, then earlier submission, then name. Fit is decided by
`place` only. A job that does not fit does not block the ones behind it (best effort), except
that the first job blocked for capacity in this order holds a reservation (reservation.py): the
jobs after it may only take room its reservation does not need. It keeps the reservation from
pass to pass until it starts, unless a blocked job comes before it in a later pass's order
(ahead of it in its queue, or of a queue whose share is lower), or a job of another queue that
stays within its nominal quota while the holder would borrow (`_yields_to`: priorities do not
count across queues). A job that stays within its queue's nominal quota is not held back by a
reservation for a job of another queue that would borrow (`_outranks`). Quota is held too: the
first job of a queue held on quota that its queue's own quota can serve holds the queue's later
jobs that need that quota (quota_hold.py), so the queue drains down to it; and a later job of
the reserved job's queue may not take the quota it needs at its start
(`_spends_reserved_quota`). A job that does not fit may preempt `preemptible` running jobs:
lower-priority ones of its own queue, or, when it stays within its queue's nominal quota, jobs of
its cohort's queues, each only while its queue borrows (`Quotas.reclaimable`). The room victims
free is their preemptor's first (`Waiting.claims`), ahead of any reservation.

A job like one that failed since the pass last changed anything (same queue, priority, requests
and limits: `_likeness`) fails the same way and is not tried again, so a pass over a long queue
costs a try per kind of job, not per job (as kube-scheduler's equivalence cache did). Jobs
placed by the `random` scorer are always tried: its order of hosts depends on the job's name.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import replace

from gpuflow.scheduler.admission_jobs import (
    Admitted,
    Decision,
    Held,
    Preemption,
    Running,
    Waiting,
    queue_order,
)
from gpuflow.scheduler.model import Placement, Snapshot
from gpuflow.scheduler.place import place
from gpuflow.scheduler.preemption import Preempting
from gpuflow.scheduler.quota import Demand, Quotas, by_covered_model, never_admitted
from gpuflow.scheduler.quota_hold import QuotaHolds
from gpuflow.scheduler.request import resolve
from gpuflow.scheduler.reservation import Reservation, Room, earliest_start, hidden
from gpuflow.scheduler.scorers import orders_by_name
from gpuflow.scheduler.usage import apply_placement
from gpuflow.specs.job import JobSpec
from gpuflow.specs.queue import QueueSpec

NO_CAPACITY = "no_capacity"
QUOTA = "quota"
RESERVED_FOR = "reserved_for:"
QUOTA_HELD_FOR = "quota_held_for:"
"""The job waits behind a job of its queue held on quota, which would otherwise starve."""

__all__ = [
    "NO_CAPACITY",
    "QUOTA",
    "QUOTA_HELD_FOR",
    "RESERVED_FOR",
    "Admitted",
    "Decision",
    "Held",
    "Preemption",
    "Reservation",
    "Running",
    "Waiting",
    "admit",
    "first_fit",
]


def admit(
    *,
    queues: Sequence[QueueSpec],
    running: Sequence[Running],
    waiting: Sequence[Waiting],
    snapshot: Snapshot,
    now: float,
    reserved: Reservation | None = None,
) -> Decision:
    """One pass. `snapshot` must hold the running jobs' placements; it is changed.
    `reserved`: the reservation the pass before returned; while its job waits it holds from
    the start of this pass (jobs ahead of it in this pass's order respect it too) on the same
    hosts when they can still serve."""
    return _Pass(queues, running, snapshot, now, reserved).run(waiting)


def first_fit(options: Sequence[JobSpec], snapshot: Snapshot) -> Placement | None:
    """Where the first of a job's resource options that fits goes, each on its fleets in
    order: what a pass takes for a job that fits (a lone submit decided alone too)."""
    for option in options:
        found = place(option, snapshot)
        if isinstance(found, Placement):
            return found
    return None


def _first_fit(job: Waiting, snapshot: Snapshot) -> Placement | None:
    return first_fit(job.options or (job.job,), snapshot)


class _Pass(Preempting):
    def __init__(
        self,
        queues: Sequence[QueueSpec],
        running: Sequence[Running],
        snapshot: Snapshot,
        now: float,
        before: Reservation | None,
    ) -> None:
        self.before = before
        self.quotas = Quotas(queues)
        self.snapshot, self.now = snapshot, now
        self.live = {job.name: job for job in running}
        self.preemptible = {job.name: job for job in running if job.preemptible}
        """The live jobs that may be preempted: a blocked job looks only at these."""
        for job in running:
            self.quotas.add(job.queue, self.quotas.demand(job.queue, job.placement))
        self.decision = Decision()
        self.reasons: dict[str, str] = {}
        self.positions: dict[str, int] = {}
        self.reserved: Waiting | None = None
        self.reserved_demand: Demand = {}
        """What the reserved job will count against its queue's quota."""
        self.room: Room | None = None
        self.failed: dict[tuple[object, ...], str] = {}
        """`_likeness` of jobs that failed since the pass last changed -> why."""
        self.quota_holds = QuotaHolds(self.quotas)
        """Each queue's first job this pass held on quota, which the later ones wait behind."""
        self.stopped = ExitStack()
        """The hosts of the jobs this pass preempts, hidden until the pass ends (`_stopping`)."""

    def run(self, waiting: Sequence[Waiting]) -> Decision:
        with self.stopped:
            return self._run(waiting)

    def _stopping(self, hosts: frozenset[str]) -> None:
        self.stopped.enter_context(hidden(self.snapshot, hosts))

    def _run(self, waiting: Sequence[Waiting]) -> Decision:
        pending: dict[str, list[Waiting]] = {}
        for job in sorted(waiting, key=queue_order):
            self.quotas.queue(job.queue)
            pending.setdefault(job.queue, []).append(job)
        tried: dict[str, list[Waiting]] = {name: [] for name in pending}
        for jobs in pending.values():
            jobs[:] = self._claimed(jobs)
        holder = next((job for job in waiting if self.before and job.name == self.before.job), None)
        if holder is not None and holder.name not in self.live:
            self._reserve(holder)  # it holds from the start: jobs ahead may not take its room
        while any(pending.values()):
            queue = min((q for q in pending if pending[q]), key=lambda q: (self.quotas.share(q), q))
            job = pending[queue].pop(0)
            self.positions.setdefault(job.name, len(self.positions))
            held_room = self.reserved is job
            if self._try(job):
                self.reasons.pop(job.name, None)
                # quota came back, or the room it held is open to the others: look again
                if self.decision.admitted[-1].victims or held_room:
                    for name, jobs in tried.items():
                        pending[name] = sorted([*jobs, *pending[name]], key=queue_order)
                        jobs.clear()
            else:
                tried[queue].append(job)
        held = [job for jobs in tried.values() for job in jobs]
        held.sort(key=lambda job: self.positions[job.name])
        self.decision.waiting = [
            Held(job, self.reasons[job.name], position) for position, job in enumerate(held)
        ]
        return self.decision

    def _claimed(self, jobs: list[Waiting]) -> list[Waiting]:
        """The queue's jobs less those whose victims freed their room and that take it now, up
        to the first that does not (a claim does not jump its queue)."""
        for k, job in enumerate(jobs):
            found = _first_fit(job, self.snapshot) if job.claims else None
            if found is None or not self.quotas.allows(
                job.queue, self.quotas.demand(job.queue, found)
            ):
                return jobs[k:]
            self.positions.setdefault(job.name, len(self.positions))
            self._take(job, found, ())
        return []

    def _try(self, job: Waiting) -> bool:
        head = self.quota_holds.behind(job)
        if head is not None:
            self.reasons[job.name] = QUOTA_HELD_FOR + head
            return False
        like = self._likeness(job)
        reason = self.failed.get(like) if like is not None else None
        if reason is not None:
            self.reasons[job.name] = reason
            return False
        placement, reason = self._place(job)
        demand: Demand | None = None
        if placement is not None:
            demand = self.quotas.demand(job.queue, placement)
            if not self.quotas.allows(job.queue, demand):
                placement = self._place_within_quota(job)
                reason = QUOTA
            if placement is not None:
                holder = self._spends_reserved_quota(job, placement)
                if holder is None:
                    self._take(job, placement, ())
                    return True
                self.reasons[job.name] = QUOTA_HELD_FOR + holder
                return False
        never = reason in (NO_CAPACITY, QUOTA) and self._never_admitted(job)
        if never:
            reason = QUOTA  # the lasting reason: no capacity would admit it, nor a reservation
        found = None if never else self._preempt(job)
        if found is not None:
            self._take(job, *found)
            return True
        self.reasons[job.name] = reason
        if reason == QUOTA and not never and job.may_wait:
            if demand is None:  # held on quota on the reserved hosts: where it would go
                there = _first_fit(job, self.snapshot)
                demand = None if there is None else self.quotas.demand(job.queue, there)
            if demand is not None:
                self.quota_holds.hold(job, demand)
        if reason == NO_CAPACITY and job.may_wait:
            self._reserve(job)
        if like is not None and self.reserved is not job:
            self.failed[like] = reason
        return False

    def _spends_reserved_quota(self, job: Waiting, placement: Placement) -> str | None:
        """The reserved job, when this later job of its queue would take quota it needs at its
        start (the jobs it waits for gone, this one still running), else None: backfill may
        not delay the reserved job through its queue's quota either."""
        holder, reservation = self.reserved, self.decision.reservation
        if holder is None or reservation is None or holder.queue != job.queue:
            return None
        if job is holder or queue_order(job) < queue_order(holder):
            return None
        if self._ends_before_reserved_start(job):
            return None
        with self.quotas.trial():
            for name in reservation.waits_for & self.live.keys():
                gone = self.live[name]
                self.quotas.add(gone.queue, self.quotas.demand(gone.queue, gone.placement), -1.0)
            self.quotas.add(job.queue, self.quotas.demand(job.queue, placement))
            keeps = self.quotas.allows(holder.queue, self.reserved_demand)
        return None if keeps else holder.name

    def _never_admitted(self, job: Waiting) -> bool:
        """Its queue could not admit it even with its whole cohort idle (quota.py)."""
        queues = list(self.quotas.queues.values())
        return never_admitted(queues, job.queue, job.job) is not None

    def _likeness(self, job: Waiting) -> tuple[object, ...] | None:
        """What a try of the job depends on besides the pass's state; None for a job whose name
        counts too: it holds the reservation (now or from the pass before), or the `random`
        scorer, which orders hosts by the job's name, may place it."""
        holders = {r.job for r in (self.before, self.decision.reservation) if r is not None}
        if job.name in holders:
            return None
        fleets = self.snapshot.fleets
        if any(orders_by_name(o.scorer, f) for o in (job.job, *job.options) for f in fleets):
            return None
        options = tuple((resolve(o).key, o.scorer, tuple(o.fleets)) for o in job.options)
        first = job.job
        asks = (resolve(first).key, first.scorer, tuple(first.fleets), first.max_duration)
        # ahead of the holder in its queue or not (the holder, carried from the pass before,
        # can be behind a requeued job): it decides whether the job may take the held room
        holder = self.reserved
        ahead = (
            holder is not None
            and job.queue == holder.queue
            and queue_order(job) < queue_order(holder)
        )
        return (job.queue, job.priority, job.may_wait, ahead, asks, options)

    def _allowed(self, job: Waiting, placement: Placement) -> bool:
        """The placement does not delay the reservation (it ends before the reserved start, or
        leaves the reserved job its room), or there is none, or it is the job's own, or the job
        outranks it."""
        reservation, holder = self.decision.reservation, self.reserved
        if reservation is None or holder is None or job.name == reservation.job:
            return True
        if self._outranks(job, self.quotas.demand(job.queue, placement)):
            return True
        if not reservation.hosts & {node.host_id for node in placement.nodes}:
            return True
        if self._ends_before_reserved_start(job):
            return True
        return self.room is not None and self.room.leaves_room(placement)

    def _ends_before_reserved_start(self, job: Waiting) -> bool:
        reservation, duration = self.decision.reservation, job.job.max_duration
        return (
            reservation is not None
            and reservation.starts_at is not None
            and duration is not None
            and self.now + duration <= reservation.starts_at
        )

    def _outranks(self, job: Waiting, demand: Demand | None) -> bool:
        """Whether the reservation may not hold this job back. In the reserved job's queue: ahead
        of it in the queue's order (a holder carried from the pass before can be behind a job of
        its queue that came back: a preempted job requeued keeps its submission time). In
        another queue, priorities do not count (they order jobs within a queue), quotas do: a
        job that stays within its queue's nominal quota (`demand`; None: not known yet, so it
        may) goes before a reserved job that would borrow, as Kueue admits workloads within
        nominal quota before borrowing ones. Only idle quota is lent, and quota its owner's
        waiting jobs can use is not idle; a reservation must not keep it from them."""
        holder = self.reserved
        if holder is None:
            return True
        if job.queue == holder.queue:
            return queue_order(job) < queue_order(holder)
        if not self.quotas.borrows(holder.queue, self.reserved_demand):
            return False
        return demand is None or not self.quotas.borrows(job.queue, demand)

    def _yields_to(self, job: Waiting, demand: Demand | None) -> bool:
        """Whether the reservation's holder gives it up to this blocked job: the reservation is
        the first blocked job's in the pass's order. A job of another queue tried before the
        holder in this pass (its queue's share is the lower: a holder carried from the pass
        before has not been tried yet) takes it; otherwise only a job that outranks the holder
        does (`_outranks`). A job tried after the holder never takes it for its priority, so a
        queue whose jobs keep coming with higher priorities cannot starve another's big job."""
        holder = self.reserved
        if holder is not None and job.queue != holder.queue and holder.name not in self.positions:
            return True
        return self._outranks(job, demand)

    def _place(self, job: Waiting) -> tuple[Placement | None, str]:
        """Every job but the holder goes outside the reserved hosts when it can: those that
        may use them (`_allowed`) only when nothing else fits, so the reservation drains."""
        found = _first_fit(job, self.snapshot)
        if not isinstance(found, Placement):
            return None, NO_CAPACITY
        reservation = self.decision.reservation
        if reservation is None or job.name == reservation.job:
            return found, ""
        if not reservation.hosts & {node.host_id for node in found.nodes}:
            return found, ""
        with hidden(self.snapshot, reservation.hosts):
            elsewhere = _first_fit(job, self.snapshot)
        if isinstance(elsewhere, Placement):
            return elsewhere, ""
        if self._allowed(job, found):
            return found, ""
        if not self.quotas.allows(job.queue, self.quotas.demand(job.queue, found)):
            return None, QUOTA  # the lasting reason: the reservation is not all that holds it
        return None, RESERVED_FOR + reservation.job

    def _place_within_quota(self, job: Waiting) -> Placement | None:
        """For a job whose best placement is over its queue's quota: a placement on a model
        its quota covers, if it accepts one (quota.py `by_covered_model`)."""
        for spec in by_covered_model(self.quotas, job.queue, job.options or (job.job,)):
            found, _ = self._place(replace(job, job=spec, options=()))
            if found is not None and self.quotas.allows(
                job.queue, self.quotas.demand(job.queue, found)
            ):
                return found
        return None

    def _take(self, job: Waiting, placement: Placement, victims: tuple[str, ...]) -> None:
        self.failed.clear()
        apply_placement(self.snapshot, placement)
        self.quotas.add(job.queue, self.quotas.demand(job.queue, placement))
        self.live[job.name] = admitted = Running.admitted(job, placement, self.now)
        if job.preemptible:
            self.preemptible[job.name] = admitted
            self._ordered = None
        backfill = self.decision.reservation is not None and self.reserved is not job
        if backfill and self.room is not None and not self._ends_before_reserved_start(job):
            self.room.take(placement)
        self.decision.admitted.append(Admitted(job, placement, victims, backfill))
        self.decision.preemptions.extend(Preemption(name, job.name) for name in victims)
        if self.reserved is job:
            self.reserved, self.decision.reservation, self.room = None, None, None

    def _reserve(self, job: Waiting) -> None:
        if not self._yields_to(job, None):
            return
        before = self.before
        keep = before.hosts if before and before.job == job.name else frozenset()
        live = list(self.live.values())
        found = earliest_start(job.job, self.snapshot, live, self.now, keep=keep)
        if found is None:
            return
        if not self._yields_to(job, self.quotas.demand(job.queue, found.placement)):
            return
        reservation = Reservation(job.name, found.starts_at, found.hosts, found.waits_for)
        self.failed.clear()
        self.reserved, self.decision.reservation = job, reservation
        self.reserved_demand = self.quotas.demand(job.queue, found.placement)
        self.room = Room(job.job, reservation, self.snapshot, self.live)
