"""The reservations standing in one admission pass (admission.py), the highest-ranked first, as
Slurm's backfill plans a start for each blocked job: which of them a job must respect, which one
a placement would delay, and their rooms as jobs are admitted.

The first reservation binds every job it does not outrank; the others bind only the jobs of
their own queue (priorities order the jobs of a queue; between queues the pass's fair-share
order decides, and one queue's reservation for each of its blocked jobs would hold the other
queues back from their share). Each is made on hosts the reservations before it do not hold, so
none can delay one made before it. When the first one's job is admitted, the next becomes the
first and is found again on what the pass has admitted, since it bound only its own queue
until then.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuflow.scheduler.admission_jobs import Running, Waiting
from gpuflow.scheduler.model import Placement, Snapshot
from gpuflow.scheduler.quota import Demand, Quotas
from gpuflow.scheduler.reservation import Reservation, Room, earliest_start, hidden

MAX_RESERVATIONS = 16
"""Blocked jobs that hold a reservation at once (Slurm's backfill plans a bounded number of
jobs too, `bf_max_job_test`): each costs the pass a search for its start and a check of every
job that would use its hosts; jobs behind that many reservations wait behind them anyway."""


@dataclass
class Hold:
    """A blocked job's reservation, with what it counts against its queue's quota and the room
    it needs on its hosts."""

    job: Waiting
    reservation: Reservation
    demand: Demand
    room: Room


class Holds:
    def __init__(
        self, quotas: Quotas, snapshot: Snapshot, now: float, live: dict[str, Running]
    ) -> None:
        self.quotas, self.snapshot, self.now, self.live = quotas, snapshot, now, live
        self.standing: list[Hold] = []

    def of(self, job: Waiting) -> Hold | None:
        return next((hold for hold in self.standing if hold.job.name == job.name), None)

    def reservations(self) -> list[Reservation]:
        return [hold.reservation for hold in self.standing]

    def binding(self, job: Waiting) -> list[Hold]:
        """The reservations the job must respect: of those made before its own, the first and
        the others of its own queue."""
        found: list[Hold] = []
        for k, hold in enumerate(self.standing):
            if hold.job.name == job.name:
                break
            if k == 0 or hold.job.queue == job.queue:
                found.append(hold)
        return found

    def blocking(self, job: Waiting, placement: Placement) -> Hold | None:
        """The first reservation the placement would delay, if any: one the job must respect
        and does not outrank whose hosts it touches, unless it ends before the reserved start
        or leaves the reserved job its room there."""
        hosts = {node.host_id for node in placement.nodes}
        demand = self.quotas.demand(job.queue, placement)
        for hold in self.binding(job):
            if self.outranks(job, demand, hold) or not hold.reservation.hosts & hosts:
                continue
            if self.ends_before(job, hold.reservation) or hold.room.leaves_room(placement):
                continue
            return hold
        return None

    def ends_before(self, job: Waiting, reservation: Reservation) -> bool:
        duration = job.job.max_duration
        return (
            reservation.starts_at is not None
            and duration is not None
            and self.now + duration <= reservation.starts_at
        )

    def outranks(self, job: Waiting, demand: Demand, hold: Hold) -> bool:
        """Whether the reservation may not hold this job back. In the reserved job's queue: a
        higher priority. In another queue, priorities do not count (they order jobs within a
        queue), quotas do: a job that stays within its queue's nominal quota goes before a
        reserved job that would borrow, as Kueue admits workloads within nominal quota before
        borrowing ones. Only idle quota is lent, and quota its owner's waiting jobs can use is
        not idle; a reservation must not keep it from them."""
        holder = hold.job
        if job.queue == holder.queue:
            return job.priority > holder.priority
        return self.quotas.borrows(holder.queue, hold.demand) and not (
            self.quotas.borrows(job.queue, demand)
        )

    def reserve(self, job: Waiting, keep: frozenset[str], *, lowest: int) -> bool:
        """The job reserves where and when it can start (on `keep` when those hosts can still
        serve); whether it did. A job of a higher priority than the first reservation's takes
        its place (the others are made again as their jobs come); another is added behind the
        others, up to `MAX_RESERVATIONS`, when it has a priority above `lowest` (the lowest
        waiting in its queue): the ones after the first keep jobs of a lower priority from
        delaying it, and one with none behind it has nothing to fear (its search for a start
        costs a pass tens of milliseconds on a full fleet of thousands of jobs)."""
        if self.of(job) is not None:
            return False
        if self.standing and job.priority > self.standing[0].job.priority:
            self.standing = []
        if self.standing and job.priority <= lowest:
            return False
        if len(self.standing) >= MAX_RESERVATIONS:
            return False
        found = self._make(job, keep)
        if found is not None:
            self.standing.append(found)
        return found is not None

    def taken(self, job: Waiting, placement: Placement) -> bool:
        """The job was admitted on `placement` (already applied): the rooms of the others take
        what it uses there, unless it ends before their start; its own reservation goes.
        Whether another reservation stood (it was admitted as backfill)."""
        backfill = False
        for hold in self.standing:
            if hold.job.name != job.name:
                backfill = True
                if not self.ends_before(job, hold.reservation):
                    hold.room.take(placement)
        first = bool(self.standing) and self.standing[0].job.name == job.name
        self.standing = [hold for hold in self.standing if hold.job.name != job.name]
        if first and self.standing:
            promoted, self.standing = self.standing[0], self.standing[1:]
            again = self._make(promoted.job, promoted.reservation.hosts)
            self.standing = [again, *self.standing] if again is not None else self.standing
        return backfill

    def give_back(self, name: str, placement: Placement) -> None:
        """A running job was preempted."""
        for hold in self.standing:
            hold.room.give_back(name, placement)

    def _make(self, job: Waiting, keep: frozenset[str]) -> Hold | None:
        """The job's reservation on hosts no standing reservation holds, or None when it
        cannot start there even once everything ends."""
        taken = frozenset().union(*(hold.reservation.hosts for hold in self.standing))
        live = list(self.live.values())
        with hidden(self.snapshot, taken):
            found = earliest_start(job.job, self.snapshot, live, self.now, keep=keep - taken)
        if found is None:
            return None
        reservation = Reservation(job.name, found.starts_at, found.hosts, found.waits_for)
        demand = self.quotas.demand(job.queue, found.placement)
        return Hold(job, reservation, demand, Room(job.job, reservation, self.snapshot, self.live))
