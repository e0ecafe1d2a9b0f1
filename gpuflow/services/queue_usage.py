"""What the running jobs count against the queues' quotas, kept in memory per engine between
the submits that a control worker decides alone.

A job submitted while nobody waits is decided in its submit's transaction. For a queue with a
quota limit or a cohort that takes the queues' usage: a full admission pass reads every
admitted entry and counts every running job for it, O(running jobs) a submit (on openb's
fleet, 8,000 of them: the few placements a second of a cold read). The usage changes only with
the allocations (an admission writes them, a release or a reconciliation deletes them, each
bumping the allocations counter of services/changes.py), so it is counted again only when that
counter, the fleets' structure or the queues' names moved since; the control worker's own
admissions in between are added as it commits them. Another worker's write, a release, or a
queue deleted makes the next submit count again from the database, as a pass would.
"""

from __future__ import annotations

import threading
import weakref
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import event
from sqlmodel import Session

from gpuflow.scheduler.model import Placement
from gpuflow.scheduler.quota import Quotas, gpus_by_model
from gpuflow.services.capacity import placements_of
from gpuflow.services.changes import read_versions
from gpuflow.services.running import admitted_rows, counted_queue
from gpuflow.specs.queue import ANY_MODEL, QueueSpec

Key = tuple[int, int, frozenset[str]]
"""(allocations counter, structure counter, the queues' names) the usage was counted at."""


@dataclass
class _Counted:
    key: Key
    by_queue: dict[str, dict[str, float]] = field(default_factory=dict)
    """An entry's own queue (deleted or not) -> GPU model -> GPUs its running jobs hold."""


_COUNTED: weakref.WeakKeyDictionary[Any, _Counted] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()
_TOUCHED = "gpuflow.queue_usage.engine"
"""session.info: the engine whose count this transaction read or changed."""
_COMMITTED = "gpuflow.queue_usage.committed"


def quotas_now(session: Session, queues: Sequence[QueueSpec]) -> tuple[Quotas, Key | None]:
    """The queues' quotas with the running jobs' usage, as a pass would count it in this
    transaction, and the key it was counted at (None: no counter to trust, counted afresh)."""
    key = _key(session, queues)
    engine = session.get_bind()
    session.info[_TOUCHED] = engine
    with _LOCK:
        counted = _COUNTED.get(engine) if key is not None else None
        if counted is None or counted.key != key:
            counted = _count(session, key)
            if key is not None:
                _COUNTED[engine] = counted
        by_queue = {queue: dict(models) for queue, models in counted.by_queue.items()}
    quotas = Quotas(queues)
    names = set(quotas.queues)
    for queue, models in by_queue.items():
        counted_in = counted_queue(queue, names)
        if ANY_MODEL in quotas.queue(counted_in).quota:
            quotas.add(counted_in, {ANY_MODEL: sum(models.values())})
        else:
            quotas.add(counted_in, models)
    return quotas, key


@event.listens_for(Session, "after_transaction_end")
def _ended(session: Session, transaction: Any) -> None:
    """A transaction that counted or added usage and did not commit: its engine's count may
    hold what it never wrote (a rolled-back admission), which a later counter of the same value
    would pass for the database's; it is counted again."""
    if transaction.parent is not None:
        return
    engine = session.info.pop(_TOUCHED, None)
    if engine is not None and not session.info.pop(_COMMITTED, False):
        with _LOCK:
            _COUNTED.pop(engine, None)
    session.info.pop(_COMMITTED, None)


@event.listens_for(Session, "after_commit")
def _committed(session: Session) -> None:
    if _TOUCHED in session.info:
        session.info[_COMMITTED] = True


def admitted(
    session: Session,
    queues: Sequence[QueueSpec],
    before: Key | None,
    queue: str,
    placement: Placement,
) -> None:
    """The control worker admitted a job of `queue` on `placement` in this transaction, after
    `quotas_now` counted at `before`: its usage is added when that admission is the only write
    since (the counter one further); otherwise the next submit counts again."""
    after = _key(session, queues)
    engine = session.get_bind()
    with _LOCK:
        counted = _COUNTED.get(engine)
        if counted is None or before is None or after is None or counted.key != before:
            return
        if after != (before[0] + 1, before[1], before[2]):
            del _COUNTED[engine]
            return
        models = counted.by_queue.setdefault(queue, defaultdict(float))
        for model, gpus in gpus_by_model(placement).items():
            models[model] = models.get(model, 0.0) + gpus
        counted.key = after


def _key(session: Session, queues: Sequence[QueueSpec]) -> Key | None:
    versions = read_versions(session)
    if versions is None:
        return None
    return versions.allocations, versions.structure, frozenset(q.name for q in queues)


def _count(session: Session, key: Key | None) -> _Counted:
    """The admitted entries' usage as this transaction reads it (`services/running.py`)."""
    rows = admitted_rows(session)
    keys = [(row.job_id, row.attempt, row.admitted_at) for row in rows]
    placements = placements_of(session, keys)
    counted = _Counted(key if key is not None else (0, 0, frozenset()))
    for row, entry_key in zip(rows, keys, strict=True):
        placement = placements.get(entry_key)
        if placement is None:
            continue  # holds nothing: counts for nothing, as in a pass
        models = counted.by_queue.setdefault(row.queue, defaultdict(float))
        for model, gpus in gpus_by_model(placement).items():
            models[model] += gpus
    return counted
