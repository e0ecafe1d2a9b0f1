"""The backfill reservation (Slurm's backfill, Kueue's BestEffortFIFO plus a reservation): when
the highest-ranked job blocked for capacity could start, on which hosts, and what room there it
needs.

Its start is found on the snapshot by releasing running jobs in the order of their known ends
(start + max_duration) until `place` finds it a placement; those hosts are reserved from that
time on. When it fits only once jobs without a known end are gone too, its start is unknown
(None) and its hosts are reserved outright; the pass is told the hosts reserved before, so it
keeps draining the same ones. What is reserved is the room the job will take, not the whole
hosts: a later job may use the reserved hosts when it declares a max_duration that ends before
the reserved start, or when the reserved job still fits there beside it once the jobs it waits
for are gone (`Room`); so no later job can delay it, and a 1-GPU reservation does not hold a
whole 8-GPU host.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, NamedTuple

from gpuflow.scheduler.index import index_of
from gpuflow.scheduler.model import Placement, Snapshot
from gpuflow.scheduler.place import place
from gpuflow.scheduler.prefix import releasing, shortest
from gpuflow.scheduler.usage import apply_placement, release_placement
from gpuflow.specs import JobSpec
from gpuflow.status import HostState

if TYPE_CHECKING:
    from gpuflow.scheduler.admission import Running


@dataclass(frozen=True)
class Reservation:
    job: str
    starts_at: float | None
    """The earliest time the job can start if no job ends early; None: not known."""
    hosts: frozenset[str]
    """Host ids the job will take then."""
    waits_for: frozenset[str] = frozenset()
    """Running jobs whose end it waits for; known only to the pass that found it (a reservation
    carried to the next pass is found again there)."""


class Start(NamedTuple):
    """Where and when a blocked job can start (`earliest_start`)."""

    starts_at: float | None
    hosts: frozenset[str]
    waits_for: frozenset[str]
    placement: Placement
    """Its placement once the jobs it waits for are gone."""


def earliest_start(
    job: JobSpec,
    snapshot: Snapshot,
    running: Sequence[Running],
    now: float,
    *,
    keep: frozenset[str] = frozenset(),
) -> Start | None:
    """When and where the job can start; None when it fits nowhere even on an empty fleet.

    When no known end lets it fit, the hosts are the ones freed by releasing the fewest jobs
    without a known end, the most recently started first (job lifetimes are heavy-tailed: one
    that has run for long is likely to run longer still); `keep` (the hosts reserved for it by
    the pass before) wins when it can still serve, so a reservation drains the same hosts from
    pass to pass."""

    def fits() -> Placement | None:
        found = place(job, snapshot)
        return found if isinstance(found, Placement) else None

    found = fits()
    if found is not None:
        return _start(now, found, [])
    known = sorted((r for r in running if r.ends_at is not None), key=lambda r: (r.ends_at, r.name))
    unknown = sorted(
        (r for r in running if r.ends_at is None),
        key=lambda r: (-r.started_at, r.name),
    )
    everything = [*known, *unknown]
    with releasing(snapshot, everything) as released:
        got = shortest(released, fits, end=len(known))
        if got is not None:
            high, found = got
            end = known[high - 1].ends_at
            return _start(max(now, end) if end is not None else None, found, known[:high])
    if keep:
        others = frozenset(h.id for h in snapshot.hosts()) - keep
        there = [r for r in everything if _hosts_of(r.placement) & keep]
        start = sum(1 for r in there if r.ends_at is not None)
        with hidden(snapshot, others), releasing(snapshot, there) as released:
            got = shortest(released, fits, start=start)
        if got is not None:
            return _start(None, got[1], there[: got[0]])
    with releasing(snapshot, everything) as released:
        got = shortest(released, fits, start=len(known))
    if got is None:
        return None
    return _start(None, got[1], everything[: got[0]])


def _start(at: float | None, placement: Placement, gone: Sequence[Running]) -> Start:
    hosts = frozenset(node.host_id for node in placement.nodes)
    waits_for = frozenset(r.name for r in gone if hosts & _hosts_of(r.placement))
    return Start(at, hosts, waits_for, placement)


def _hosts_of(placement: Placement) -> frozenset[str]:
    return frozenset(node.host_id for node in placement.nodes)


class Room:
    """The reserved hosts as the reserved job will find them at its start: a copy of them
    without the jobs it waits for, and with every job admitted there since (they may run past
    its start). A job may use the reserved hosts if the reserved job still fits in this copy
    beside it. The copy never holds more than the hosts do, so what fits on them can be added
    to it; if that ever fails, nothing more may use the reserved hosts (`view` None)."""

    def __init__(
        self,
        job: JobSpec,
        reservation: Reservation,
        snapshot: Snapshot,
        running: Mapping[str, Running],
    ) -> None:
        self.job, self.hosts = job, reservation.hosts
        self.waits_for = reservation.waits_for
        fleets = [
            replace(fleet, hosts=[copy.deepcopy(h) for h in fleet.hosts if h.id in self.hosts])
            for fleet in snapshot.fleets
            if any(h.id in self.hosts for h in fleet.hosts)
        ]
        self.view: Snapshot | None = Snapshot(fleets=fleets)
        for name in self.waits_for:
            if name in running:
                self._change(release_placement, running[name].placement)

    def leaves_room(self, placement: Placement) -> bool:
        """The reserved job still fits on its hosts at its start with `placement` taken."""
        if self.view is None:
            return False
        local = self._local(placement)
        try:
            apply_placement(self.view, local)
        except ValueError:
            return False
        try:
            return isinstance(place(self.job, self.view), Placement)
        finally:
            release_placement(self.view, local)

    def take(self, placement: Placement) -> None:
        """A job was admitted (it may have taken the reserved job's room, if it ranks above)."""
        self._change(apply_placement, placement)

    def give_back(self, name: str, placement: Placement) -> None:
        """A running job was preempted."""
        if name not in self.waits_for:
            self._change(release_placement, placement)

    def _change(self, how: Callable[[Snapshot, Placement], None], placement: Placement) -> None:
        if self.view is not None:
            try:
                how(self.view, self._local(placement))
            except ValueError:
                self.view = None

    def _local(self, placement: Placement) -> Placement:
        nodes = [node for node in placement.nodes if node.host_id in self.hosts]
        return placement.model_copy(update={"nodes": nodes})


@contextmanager
def hidden(snapshot: Snapshot, hosts: frozenset[str]) -> Iterator[None]:
    """Placement does not see these hosts (marked in maintenance) for the block's duration."""
    saved = [(host, host.state) for host in snapshot.hosts() if host.id in hosts]
    index = index_of(snapshot)
    try:
        for host, _ in saved:
            host.state = HostState.MAINTENANCE
        index.states_changed()
        yield
    finally:
        for host, state in saved:
            host.state = state
        index.states_changed()
