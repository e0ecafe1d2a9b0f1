"""Preemption within an admission pass (admission.py): which preemptible running jobs a
blocked job may stop, the fewest that make room, and what its queue's quota then allows.
`_Pass` has these steps; they change the pass's snapshot and quotas only when they preempt."""

from __future__ import annotations

from gpuflow.scheduler.admission_jobs import Running, Waiting, victim_order
from gpuflow.scheduler.model import Placement, Snapshot
from gpuflow.scheduler.place import place
from gpuflow.scheduler.prefix import releasing, shortest
from gpuflow.scheduler.quota import Quotas
from gpuflow.scheduler.reservation import Room
from gpuflow.scheduler.usage import apply_placement, release_placement


class Preempting:
    """The preemption steps of an admission pass, over the pass's own state."""

    snapshot: Snapshot
    quotas: Quotas
    live: dict[str, Running]
    preemptible: dict[str, Running]
    room: Room | None
    _ordered: list[Running] | None = None
    """`_in_victim_order`'s, until `preemptible` changes (None: sort again)."""

    def _allowed(self, job: Waiting, placement: Placement) -> bool:
        raise NotImplementedError

    def _stopping(self, hosts: frozenset[str]) -> None:
        """The victims' hosts, nobody else's for the rest of the pass: the victims hold what
        they free in the database until they have stopped, and their preemptor takes only
        what it needs of it (the next pass admits it once they have)."""
        raise NotImplementedError

    def _eligible(self, job: Waiting) -> list[Running]:
        """Its own queue's preemptible jobs of lower priority; those of another queue of its
        cohort that borrows; and those of any queue using beyond its nominal quota what
        nothing lends it now (`Quotas.over`: a quota lowered under it, or its cohort left),
        which is nobody's to keep; in victim order."""
        cohort = set(self.quotas.cohort(job.queue)) - {job.queue}
        taken_back = {
            queue
            for queue in {r.queue for r in self.preemptible.values()} - {job.queue}
            if self.quotas.borrowing(queue) and (queue in cohort or self.quotas.over(queue))
        }
        return [
            r
            for r in self._in_victim_order()
            if (r.queue == job.queue and r.priority < job.priority) or r.queue in taken_back
        ]

    def _in_victim_order(self) -> list[Running]:
        """The preemptible jobs in victim order, sorted once until they change."""
        if self._ordered is None:
            self._ordered = sorted(self.preemptible.values(), key=victim_order)
        return self._ordered

    def _preempt(self, job: Waiting) -> tuple[Placement, tuple[str, ...]] | None:
        """A placement for the job once some of the jobs it may preempt are released, and
        those victims (released from the snapshot and the quotas); None leaves both as they
        were. Another queue's jobs are taken only while that queue borrows
        (`Quotas.reclaimable`), which cuts the victim order short: when the preferred victims
        within that limit do not make room where the job fits, the same is tried among the
        jobs of one host at a time (a borrower's newest job may sit on the wrong host, and
        one of its older ones, on a host the job fits once it is freed, be the one to take)."""
        eligible = self._eligible(job)
        kept = self.quotas.reclaimable(eligible, job.queue)
        found = self._preempt_among(job, kept)
        if found is not None or job.job.nodes > 1:
            return found
        cut = [victim for victim in eligible if victim not in kept]
        hosts = dict.fromkeys(node.host_id for victim in cut for node in victim.placement.nodes)
        on_host: dict[str, list[Running]] = {host: [] for host in hosts}
        for victim in eligible:  # each host's in victim order
            for host in dict.fromkeys(node.host_id for node in victim.placement.nodes):
                if host in on_host:
                    on_host[host].append(victim)
        for host in hosts:
            local = self.quotas.reclaimable(on_host[host], job.queue)
            found = self._preempt_among(job, local)
            if found is not None:
                return found
        return None

    def _preempt_among(
        self, job: Waiting, candidates: list[Running]
    ) -> tuple[Placement, tuple[str, ...]] | None:
        """_preempt over these candidates, in their order."""
        if not candidates:
            return None

        def fits() -> Placement | None:
            found = place(job.job, self.snapshot)
            return found if isinstance(found, Placement) and self._allowed(job, found) else None

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
        if isinstance(found, Placement) and self._allowed(job, found):
            apply_placement(self.snapshot, found)
            for victim in reversed(candidates[:high]):  # the most protected go back first
                try:
                    self._restore(victim)
                except ValueError:
                    continue
                out.remove(victim)
            release_placement(self.snapshot, found)
            if self._quota_after(job, found, out, candidates):
                # Until they have stopped, the victims hold what they free (the job waits
                # for them): their hosts are no other job's this pass.
                self._stopping(
                    frozenset(node.host_id for victim in out for node in victim.placement.nodes)
                )
                for victim in out:
                    del self.live[victim.name], self.preemptible[victim.name]
                    self._ordered = None
                    if self.room is not None:
                        self.room.give_back(victim.name, victim.placement)
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
