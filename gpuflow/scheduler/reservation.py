"""The backfill reservation (Slurm's backfill, Kueue's BestEffortFIFO plus a reservation): when
the highest-priority job blocked for capacity could start, on which hosts, and which running
jobs it waits for.

Its start is found on the snapshot by releasing running jobs in the order of their known ends
(start + max_duration) until `place` finds it a placement; those hosts are reserved from that
time on. When it fits only once jobs without a known end are gone too, its start is unknown
(None) and its hosts are reserved outright; the pass is told the hosts reserved before, so it
keeps draining the same ones. Later jobs may use the reserved hosts only when they declare a
max_duration that ends before the reserved start; anywhere else they do not touch what the
reservation needs, so they cannot delay it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from gpuflow.scheduler.index import index_of
from gpuflow.scheduler.model import Placement, Snapshot
from gpuflow.scheduler.place import place
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
    known = sorted((r for r in running if r.ends_at is not None), key=lambda r: (r.ends_at, r.name))
    found = _placed_without(job, snapshot, [])
    if found is not None:
        return _start(now, found, [])
    found = _placed_without(job, snapshot, known)
    if found is not None:
        high, found = _fewest(job, snapshot, known, found)
        end = known[high - 1].ends_at
        return _start(max(now, end) if end is not None else None, found, known[:high])
    unknown = sorted(
        (r for r in running if r.ends_at is None),
        key=lambda r: (-r.started_at, r.name),
    )
    everything = [*known, *unknown]
    if keep:
        others = frozenset(h.id for h in snapshot.hosts()) - keep
        there = [r for r in everything if _hosts_of(r.placement) & keep]
        with hidden(snapshot, others):
            kept = _placed_without(job, snapshot, there)
            if kept is not None:
                start = sum(1 for r in there if r.ends_at is not None)
                high, kept = _fewest(job, snapshot, there, kept, start=start)
        if kept is not None:
            return _start(None, kept, there[:high])
    found = _placed_without(job, snapshot, everything)
    if found is None:
        return None
    high, found = _fewest(job, snapshot, everything, found, start=len(known))
    return _start(None, found, everything[:high])


def _start(at: float | None, placement: Placement, gone: Sequence[Running]) -> Start:
    hosts = frozenset(node.host_id for node in placement.nodes)
    waits_for = frozenset(r.name for r in gone if hosts & _hosts_of(r.placement))
    return Start(at, hosts, waits_for, placement)


def _hosts_of(placement: Placement) -> frozenset[str]:
    return frozenset(node.host_id for node in placement.nodes)


def _fewest(
    job: JobSpec,
    snapshot: Snapshot,
    order: Sequence[Running],
    found: Placement,
    *,
    start: int = 0,
) -> tuple[int, Placement]:
    """The shortest prefix of `order` whose release lets the job fit (releasing all of it does,
    giving `found`), by binary search: releasing more never takes room away."""
    low, high = start, len(order)  # fits without order[:high], not without order[:low]
    while high - low > 1:
        middle = (low + high) // 2
        placed = _placed_without(job, snapshot, order[:middle])
        if placed is None:
            low = middle
        else:
            high, found = middle, placed
    return high, found


def _placed_without(job: JobSpec, snapshot: Snapshot, gone: Sequence[Running]) -> Placement | None:
    for running in gone:
        release_placement(snapshot, running.placement)
    try:
        found = place(job, snapshot)
    finally:
        for running in gone:
            apply_placement(snapshot, running.placement)
    return found if isinstance(found, Placement) else None


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
