"""The backfill reservation (Slurm's backfill, Kueue's BestEffortFIFO plus a reservation): when
the highest-priority job blocked for capacity could start, and on which hosts.

Its start is found on the snapshot by releasing running jobs in the order of their known ends
(start + max_duration) until `place` finds it a placement; those hosts are reserved from that
time on. When it fits only once jobs without a known end are gone too, its start is unknown
(None) and its hosts are reserved outright; the pass is told the hosts reserved before, so it
keeps draining the same ones. Later jobs may use the reserved hosts only when
they declare a max_duration that ends before the reserved start; anywhere else they do not
touch what the reservation needs, so they cannot delay it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

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


def earliest_start(
    job: JobSpec,
    snapshot: Snapshot,
    running: Sequence[Running],
    now: float,
    *,
    keep: frozenset[str] = frozenset(),
) -> tuple[float | None, frozenset[str]] | None:
    """(start, host ids) for the job; None when it fits nowhere even on an empty fleet.

    When no known end lets it fit, the hosts are the ones freed by releasing the fewest jobs
    without a known end, the most recently started first (job lifetimes are heavy-tailed: one
    that has run for long is likely to run longer still); `keep` (the hosts reserved for it by
    the pass before) wins when it can still serve, so a reservation drains the same hosts from
    pass to pass."""
    known = sorted((r for r in running if r.ends_at is not None), key=lambda r: (r.ends_at, r.name))
    found = _placed_without(job, snapshot, [])
    if found is not None:
        return now, found
    found = _placed_without(job, snapshot, known)
    if found is not None:
        high, found = _fewest(job, snapshot, known, found)
        end = known[high - 1].ends_at
        return (max(now, end) if end is not None else None), found
    unknown = sorted(
        (r for r in running if r.ends_at is None),
        key=lambda r: (-r.started_at, r.name),
    )
    everything = [*known, *unknown]
    if keep:
        others = frozenset(h.id for h in snapshot.hosts()) - keep
        with hidden(snapshot, others):
            kept = _placed_without(job, snapshot, everything)
        if kept is not None:
            return None, kept
    found = _placed_without(job, snapshot, everything)
    if found is None:
        return None
    return None, _fewest(job, snapshot, everything, found, start=len(known))[1]


def _fewest(
    job: JobSpec,
    snapshot: Snapshot,
    order: Sequence[Running],
    found: frozenset[str],
    *,
    start: int = 0,
) -> tuple[int, frozenset[str]]:
    """The shortest prefix of `order` whose release lets the job fit (releasing all of it does,
    giving `found`), by binary search: releasing more never takes room away."""
    low, high = start, len(order)  # fits without order[:high], not without order[:low]
    while high - low > 1:
        middle = (low + high) // 2
        hosts = _placed_without(job, snapshot, order[:middle])
        if hosts is None:
            low = middle
        else:
            high, found = middle, hosts
    return high, found


def _placed_without(
    job: JobSpec, snapshot: Snapshot, gone: Sequence[Running]
) -> frozenset[str] | None:
    for running in gone:
        release_placement(snapshot, running.placement)
    try:
        found = place(job, snapshot)
    finally:
        for running in gone:
            apply_placement(snapshot, running.placement)
    if not isinstance(found, Placement):
        return None
    return frozenset(node.host_id for node in found.nodes)


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
