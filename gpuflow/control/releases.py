"""Releases of one control worker served in groups (batches.py), as submits are entered: the
`release_job` calls that arrive while a group's transaction runs are the next group, at most
MAX_RELEASES. Every release holds the placement lock, so under load (many jobs ending at once)
the lock, the counters' read, the allocations' and queue entries' deletes, the question whether
anyone waits, and the commit are paid once per group, not once per job; alone, a release is
served at once. Each job's ending is recorded in the transaction that frees its capacity."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

from gpuflow.control.batches import Batches
from gpuflow.control.records import record_in
from gpuflow.metrics import store as metrics
from gpuflow.services.capacity import release_allocations_in
from gpuflow.services.jobs import jobs_waiting_for_capacity_in, unrecorded_in
from gpuflow.services.queue_entries import anyone_waits_in, leave_queues_in
from gpuflow.store.db import Store
from gpuflow.workflows.models import ReleaseInput

log = logging.getLogger(__name__)

MAX_RELEASES = 64
"""Releases one transaction serves at most."""


@dataclass(frozen=True)
class Released:
    """What one release freed and whom it concerns."""

    nodes: int
    """Nodes of the job's placement given back (0 when a repeat finds them gone)."""
    wake: bool
    """It freed something while some job waits in a queue: the admission loop should pass. Every
    such release of a group asks (the loop folds asks that come together into one pass), so a
    caller that gave up before hearing its answer takes no other release's ask with it."""
    waiting: list[str]
    """Jobs that wait for capacity the way workflows did before queues (they poll on a
    `capacity_changed` signal)."""


def release_all(store: Store, asks: Sequence[ReleaseInput]) -> list[Released | Exception]:
    """Release several jobs in one placement transaction, in their order: each as if it had its
    own transaction (a repeat of a release in the same group frees nothing). When the group
    fails, each is released alone, so one job's error is its own."""
    if len(asks) > 1:
        try:
            return list(_release_group(store, asks))
        except Exception as exc:
            log.warning("a group of %d releases failed (%s): releasing each alone", len(asks), exc)
    found: list[Released | Exception] = []
    for ask in asks:
        try:
            found.extend(_release_group(store, [ask]))
        except Exception as exc:  # this release's own error, for its activity to raise
            found.append(exc)
    return found


def _release_group(store: Store, asks: Sequence[ReleaseInput]) -> list[Released]:
    started = time.perf_counter()
    job_ids = list(dict.fromkeys(ask.job_id for ask in asks))
    with store.placement_transaction() as session:
        nodes = release_allocations_in(session, job_ids)
        entries = leave_queues_in(session, job_ids)
        records = [ask.record for ask in asks if ask.record is not None]
        first = unrecorded_in(session, [(r.job_id, r.event_key) for r in records])
        with session.no_autoflush:  # the group's records are written together, below
            for record, new in zip(records, first, strict=True):
                if new:
                    record_in(session, record, unrecorded=True)
        freed: list[tuple[int, bool]] = []
        for ask in asks:  # the first release of a job frees what it held; a repeat, nothing
            freed.append((nodes.pop(ask.job_id, 0), ask.job_id in entries))
            entries.discard(ask.job_id)
        # Read in the same transaction as the releases, so a job that enters its queue after
        # it is decided on what they freed, and one that entered before is seen.
        waits = any(n > 0 or left for n, left in freed) and anyone_waits_in(session)
        waiting = jobs_waiting_for_capacity_in(session)
    metrics.observe_release_group(time.perf_counter() - started, len(asks))
    return [Released(n, waits and (n > 0 or left), waiting) for n, left in freed]


class ReleaseGroups:
    """`release_job` calls of one control worker, served in groups."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._batches: Batches[ReleaseInput, Released] = Batches(self._serve, MAX_RELEASES)

    @property
    def groups(self) -> int:
        """Transactions run (for tests and the benchmarks)."""
        return self._batches.batches

    def _serve(self, asks: Sequence[ReleaseInput]) -> list[Released | Exception]:
        return release_all(self.store, asks)

    async def release(self, ask: ReleaseInput) -> Released:
        return await self._batches.call(ask)
