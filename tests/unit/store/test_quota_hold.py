"""A job held on its queue's quota holds the later jobs of its queue through the product's pass
(gpuflow/services/admission.py), on SQLite and PostgreSQL: they wait `quota_held_for:<job>`,
with why in words, and `ps` words it; the held job starts once its queue has drained."""

from __future__ import annotations

from gpuflow.cli.waiting import queue_reason_text
from gpuflow.services.admission import run_pass_in
from gpuflow.services.capacity import allocations_of
from gpuflow.services.queues import apply_queue
from gpuflow.specs import QueueSpec
from gpuflow.store.db import Store
from tests.unit.store.test_admission_store import _enqueue, _entry, _fleet, _release


def test_a_job_held_on_quota_holds_its_queue_until_it_starts(store: Store) -> None:
    _fleet(store, gpus=4, cpus=32)
    apply_queue(store, QueueSpec(name="small", gpus=2))
    assert _enqueue(store, "first", 0, queue="small").placement is not None
    assert _enqueue(store, "big", 1, queue="small", resources={"gpu": "A100:2"}).placement is None
    assert _enqueue(store, "later", 2, queue="small").placement is None
    _enqueue(store, "other", 3)  # others wait: the pass decides it
    with store.placement_transaction() as session:
        run_pass_in(session, reservation=None)
    big, later = _entry(store, "big"), _entry(store, "later")
    assert big is not None and big.reason == "quota"
    assert later is not None and later.reason == "quota_held_for:job-big"
    assert later.detail is not None and "is held for job-big" in later.detail
    assert queue_reason_text(later.reason) == "quota held for job-big"
    assert allocations_of(store, "job-later") == []
    assert len(allocations_of(store, "job-other")) == 1  # the default queue goes on

    _release(store, "first")
    with store.placement_transaction() as session:
        run_pass_in(session, reservation=None)
    assert len(allocations_of(store, "job-big")) == 1
    later = _entry(store, "later")
    assert later is not None and later.reason == "quota"  # now behind what big holds


def test_a_job_without_capacity_is_told_its_quota_holds_it_too(store: Store) -> None:
    """Its words say both: a host freeing would not start it while its queue's quota is
    used (the pass stops at the first check that fails, capacity)."""
    _fleet(store, gpus=1, cpus=8)
    apply_queue(store, QueueSpec(name="pq", gpus=1))
    assert _enqueue(store, "low", 0, queue="pq", priority=95).placement is not None
    assert _enqueue(store, "high", 1, queue="pq", priority=90).placement is None
    assert _enqueue(store, "free", 2).placement is None  # another queue's: no quota to say
    with store.placement_transaction() as session:
        run_pass_in(session, reservation=None)
    high, free = _entry(store, "high"), _entry(store, "free")
    assert high is not None and high.reason == "no_capacity" and high.detail is not None
    assert high.detail.splitlines()[0] == (
        "quota: pq uses 1 of its 1 and needs 1 more, with no cohort to borrow from"
    )
    assert "h1" in high.detail  # the hosts' reasons follow
    assert free is not None and free.detail is not None and "quota" not in free.detail
