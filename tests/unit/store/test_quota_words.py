"""Which limit of its queue's quota holds a waiting job, in the words of the product's pass
(gpuflow/services/admission.py), on SQLite and PostgreSQL. Found in QA: `ps` said `no capacity:
queue research's quota is used too (A100:4 of A100:4)` for a job held by its queue's
borrowing_limit, and `queue research has no quota left for it` whatever held it."""

from __future__ import annotations

from typing import Any

from gpuflow.services.admission import run_pass_in
from gpuflow.services.queues import apply_queue
from gpuflow.specs import QueueSpec
from gpuflow.store.db import Store
from tests.unit.store.test_admission_store import _enqueue, _entry, _fleet


def _waits(store: Store, research: dict[str, Any], prod: dict[str, Any]) -> str:
    """Research runs 3 A100s, 1 beyond its quota of 2; the detail of its fourth job."""
    _fleet(store, gpus=8, cpus=64)
    apply_queue(store, QueueSpec(name="research", gpus={"A100": 2}, cohort="lab", **research))
    apply_queue(store, QueueSpec(name="prod", gpus={"A100": 6}, cohort="lab", **prod))
    for k in range(3):
        assert _enqueue(store, f"r{k}", k, queue="research").placement is not None
    assert _enqueue(store, "r3", 3, queue="research").placement is None
    with store.placement_transaction() as session:
        run_pass_in(session, reservation=None)
    entry = _entry(store, "r3")
    assert entry is not None and entry.reason == "quota" and entry.detail is not None
    return entry.detail


def test_a_job_held_by_its_queues_borrowing_limit_is_told_so(store: Store) -> None:
    detail = _waits(store, {"borrowing_limit": 1}, {})
    assert detail == "quota: research uses A100:3 = its 2 + borrowing_limit 1 and needs 1 more"


def test_a_job_held_by_a_lenders_lending_limit_is_told_so(store: Store) -> None:
    detail = _waits(store, {}, {"lending_limit": 1})
    assert detail == (
        "quota: research uses A100:3 of its 2 and needs 1 more, cohort lab lends nothing now "
        "(prod lends at most 1)"
    )
