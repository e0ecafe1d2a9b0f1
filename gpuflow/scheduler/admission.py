"""One admission pass (docs/architecture.md, "Queues and admission"): which waiting jobs start
now, on which placement, and which running jobs are preempted for them. Pure and deterministic:
it reads the queues, the jobs and a snapshot of the fleets, and changes only that snapshot
(admitted placements applied, victims' released), as `plan_together` does.

Order: the queue with the lowest dominant share goes next (recomputed after every admission),
within a queue higher priority first, then earlier submission, then name. Fit is decided by
`place` only. A job that does not fit does not block the ones behind it (best effort), except
that jobs blocked for capacity hold reservations (reservation.py, holds.py), as Slurm's backfill
plans a start for each blocked job: the highest-priority one first, then, up to
`MAX_RESERVATIONS`, the next ones that do not fit, each on hosts the reservations before it do
not hold. A job may only take room that no reservation binding it needs (the first binds every
job, the others the jobs of their own queue), so no later or lower job delays them. A job
that stays within its queue's nominal quota is not held back by a reservation for a job of
another queue that would borrow (`Holds.outranks`). A job that does not fit may preempt
`preemptible` running jobs: lower-priority ones of its own queue, or, when it stays within its
queue's nominal quota, jobs of queues of its cohort that are borrowing.

A job like one that failed since the pass last changed anything (same queue, priority, requests
and limits: `_likeness`) fails the same way and is not tried again, so a pass over a long queue
costs a try per kind of job, not per job (as kube-scheduler's equivalence cache did). Jobs
placed by the `random` scorer are always tried: its order of hosts depends on the job's name.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpuflow.scheduler.admission_jobs import (
    Admitted,
    Decision,
    Held,
    Preemption,
    Running,
    Waiting,
)
from gpuflow.scheduler.holds import MAX_RESERVATIONS, Holds
from gpuflow.scheduler.model import Placement, Snapshot
from gpuflow.scheduler.place import place
from gpuflow.scheduler.prefix import releasing, shortest
from gpuflow.scheduler.quota import Quotas, gpu_count
from gpuflow.scheduler.request import resolve
from gpuflow.scheduler.reservation import Reservation, hidden
from gpuflow.scheduler.scorers import orders_by_name
from gpuflow.scheduler.usage import apply_placement, release_placement
from gpuflow.specs.queue import QueueSpec

NO_CAPACITY = "no_capacity"
QUOTA = "quota"
RESERVED_FOR = "reserved_for:"

__all__ = [
    "MAX_RESERVATIONS",
    "NO_CAPACITY",
    "QUOTA",
    "RESERVED_FOR",
    "Admitted",
    "Decision",
    "Held",
    "Preemption",
    "Reservation",
    "Running",
    "Waiting",
    "admit",
]


def admit(
    *,
    queues: Sequence[QueueSpec],
    running: Sequence[Running],
    waiting: Sequence[Waiting],
    snapshot: Snapshot,
    now: float,
    reserved: Reservation | Sequence[Reservation] | None = None,
) -> Decision:
    """One pass. `snapshot` must hold the running jobs' placements; it is changed.
    `reserved`: the reservations the pass before returned; while their jobs wait they hold
    from the start of this pass, in that order (jobs ahead of them in this pass's order respect
    them too), on the same hosts when they can still serve."""
    if reserved is None:
        before: tuple[Reservation, ...] = ()
    elif isinstance(reserved, Reservation):
        before = (reserved,)
    else:
        before = tuple(reserved)
    return _Pass(queues, running, snapshot, now, before).run(waiting)


def _first_fit(job: Waiting, snapshot: Snapshot) -> Placement | None:
    """The first of the job's resource options that fits, each on its fleets in order."""
    for option in job.options or (job.job,):
        found = place(option, snapshot)
        if isinstance(found, Placement):
            return found
    return None


def _order(job: Waiting) -> tuple[float, float, str]:
    return (-job.priority, job.submitted_at, job.name)


def _victim_order(job: Running) -> tuple[float, int, float, str]:
    """Preferred victims first: fewest GPUs, lowest priority, most recently started."""
    return (gpu_count(job.placement), job.priority, -job.started_at, job.name)


class _Pass:
    def __init__(
        self,
        queues: Sequence[QueueSpec],
        running: Sequence[Running],
        snapshot: Snapshot,
        now: float,
        before: tuple[Reservation, ...],
    ) -> None:
        self.before = {reservation.job: reservation for reservation in before}
        self.before_order = [reservation.job for reservation in before]
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
        self.holds = Holds(self.quotas, snapshot, now, self.live)
        self.failed: dict[tuple[object, ...], str] = {}
        """`_likeness` of jobs that failed since the pass last changed -> why."""
        self.lowest: dict[str, int] = {}
        """Per queue, the lowest priority waiting."""

    def run(self, waiting: Sequence[Waiting]) -> Decision:
        pending: dict[str, list[Waiting]] = {}
        for job in sorted(waiting, key=_order):
            self.quotas.queue(job.queue)
            pending.setdefault(job.queue, []).append(job)
        tried: dict[str, list[Waiting]] = {name: [] for name in pending}
        by_name = {job.name: job for job in waiting}
        self.lowest = {queue: jobs[-1].priority for queue, jobs in pending.items()}
        for name in self.before_order:  # they hold from the start, in the order they held
            if name in by_name:
                self._reserve(by_name[name])
        while any(pending.values()):
            queue = min((q for q in pending if pending[q]), key=lambda q: (self.quotas.share(q), q))
            job = pending[queue].pop(0)
            self.positions.setdefault(job.name, len(self.positions))
            held_room = self.holds.of(job) is not None
            if self._try(job):
                self.reasons.pop(job.name, None)
                # capacity came back, or the room it held is open to the others: look again
                if self.decision.admitted[-1].victims or held_room:
                    for name, jobs in tried.items():
                        pending[name] = sorted([*jobs, *pending[name]], key=_order)
                        jobs.clear()
            else:
                tried[queue].append(job)
        held = [job for jobs in tried.values() for job in jobs]
        held.sort(key=lambda job: self.positions[job.name])
        self.decision.waiting = [
            Held(job, self.reasons[job.name], position) for position, job in enumerate(held)
        ]
        self.decision.reservations = self.holds.reservations()
        return self.decision

    def _try(self, job: Waiting) -> bool:
        like = self._likeness(job)
        reason = self.failed.get(like) if like is not None else None
        if reason is not None:
            self.reasons[job.name] = reason
            return False
        placement, reason = self._place(job)
        if placement is not None:
            demand = self.quotas.demand(job.queue, placement)
            if self.quotas.allows(job.queue, demand):
                self._take(job, placement, ())
                return True
            reason = QUOTA
        found = self._preempt(job)
        if found is not None:
            self._take(job, *found)
            return True
        self.reasons[job.name] = reason
        if reason == NO_CAPACITY and job.may_wait:
            self._reserve(job)
        if like is not None and self.holds.of(job) is None:
            self.failed[like] = reason
        return False

    def _likeness(self, job: Waiting) -> tuple[object, ...] | None:
        """What a try of the job depends on besides the pass's state; None for a job whose name
        counts too: it holds a reservation (now or from the pass before), or the `random`
        scorer, which orders hosts by the job's name, may place it."""
        if job.name in self.before or self.holds.of(job) is not None:
            return None
        fleets = self.snapshot.fleets
        if any(orders_by_name(o.scorer, f) for o in (job.job, *job.options) for f in fleets):
            return None
        options = tuple((resolve(o).key, o.scorer, tuple(o.fleets)) for o in job.options)
        first = job.job
        asks = (resolve(first).key, first.scorer, tuple(first.fleets), first.max_duration)
        return (job.queue, job.priority, job.may_wait, asks, options)

    def _place(self, job: Waiting) -> tuple[Placement | None, str]:
        """Every job goes outside the hosts reserved for the jobs it must respect when it can:
        on them (when none of those would be delayed: holds.py) only when nothing else fits,
        so the reservations drain."""
        found = _first_fit(job, self.snapshot)
        if not isinstance(found, Placement):
            return None, NO_CAPACITY
        binding = self.holds.binding(job)
        reserved = frozenset().union(*(hold.reservation.hosts for hold in binding))
        if not reserved & {node.host_id for node in found.nodes}:
            return found, ""
        with hidden(self.snapshot, reserved):
            elsewhere = _first_fit(job, self.snapshot)
        if isinstance(elsewhere, Placement):
            return elsewhere, ""
        blocking = self.holds.blocking(job, found)
        if blocking is None:
            return found, ""
        return None, RESERVED_FOR + blocking.job.name

    def _take(self, job: Waiting, placement: Placement, victims: tuple[str, ...]) -> None:
        self.failed.clear()
        apply_placement(self.snapshot, placement)
        self.quotas.add(job.queue, self.quotas.demand(job.queue, placement))
        duration = job.job.max_duration
        self.live[job.name] = admitted = Running(
            name=job.name,
            queue=job.queue,
            placement=placement,
            priority=job.priority,
            preemptible=job.preemptible,
            started_at=self.now,
            ends_at=None if duration is None else self.now + duration,
        )
        if job.preemptible:
            self.preemptible[job.name] = admitted
        backfill = self.holds.taken(job, placement)
        self.decision.admitted.append(Admitted(job, placement, victims, backfill))
        self.decision.preemptions.extend(Preemption(name, job.name) for name in victims)

    def _reserve(self, job: Waiting) -> None:
        before = self.before.get(job.name)
        keep = before.hosts if before is not None else frozenset()
        if self.holds.reserve(job, keep, lowest=self.lowest[job.queue]):
            self.failed.clear()

    def _candidates(self, job: Waiting) -> list[Running]:
        cohort = set(self.quotas.cohort(job.queue)) - {job.queue}
        live = self.preemptible.values()
        same = [r for r in live if r.queue == job.queue and r.priority < job.priority]
        others = [r for r in live if r.queue in cohort and self.quotas.borrowing(r.queue)]
        return sorted([*same, *others], key=_victim_order)

    def _preempt(self, job: Waiting) -> tuple[Placement, tuple[str, ...]] | None:
        """A placement for the job once some candidates are released, and those victims
        (released from the snapshot and the quotas); None leaves both as they were."""
        candidates = self._candidates(job)

        def fits() -> Placement | None:
            found = place(job.job, self.snapshot)
            if isinstance(found, Placement) and self.holds.blocking(job, found) is None:
                return found
            return None

        # the fewest preferred victims that make room (releasing more never takes room away)
        with releasing(self.snapshot, candidates) as released:
            got = shortest(released, fits)
        if got is None:
            return None
        high = got[0]
        out = candidates[:high]
        for victim in out:
            self._release(victim)
        found = place(job.job, self.snapshot)
        if isinstance(found, Placement) and self.holds.blocking(job, found) is None:
            apply_placement(self.snapshot, found)
            for victim in reversed(candidates[:high]):  # the most protected go back first
                try:
                    self._restore(victim)
                except ValueError:
                    continue
                out.remove(victim)
            release_placement(self.snapshot, found)
            if self._quota_after(job, found, out, candidates):
                for victim in out:
                    del self.live[victim.name], self.preemptible[victim.name]
                    self.holds.give_back(victim.name, victim.placement)
                return found, tuple(victim.name for victim in out)
        for victim in out:
            self._restore(victim)
        return None

    def _quota_after(
        self, job: Waiting, found: Placement, out: list[Running], candidates: list[Running]
    ) -> bool:
        """With `out` released, the job fits its quota, releasing more jobs of its own queue if
        that is what it takes (added to `out`); victims of other queues are allowed only when
        the job stays within its nominal quota."""
        demand = self.quotas.demand(job.queue, found)
        extra = [c for c in candidates if c.queue == job.queue and c not in out]
        while not self.quotas.allows(job.queue, demand):
            if not extra:
                return False
            victim = extra.pop(0)
            self._release(victim)
            out.append(victim)
        if any(victim.queue != job.queue for victim in out):
            return self.quotas.within_nominal(job.queue, demand)
        return True

    def _release(self, job: Running) -> None:
        release_placement(self.snapshot, job.placement)
        self.quotas.add(job.queue, self.quotas.demand(job.queue, job.placement), -1.0)

    def _restore(self, job: Running) -> None:
        """Raises ValueError (changing nothing) when its capacity is taken."""
        apply_placement(self.snapshot, job.placement)
        self.quotas.add(job.queue, self.quotas.demand(job.queue, job.placement))
