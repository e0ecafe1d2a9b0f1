"""Reconciliation at fleet scale, on SQLite and PostgreSQL: the fleet's allocations are looked
at a page at a time, each page holding whole attempts (a multi-node attempt cut by a page would
have been released with some of its processes left running), and one step stops at most
ORPHAN_NODES_PER_STEP nodes, saying when it left some out. Before, the oldest 2,000 allocation
rows were the only ones ever looked at, and every orphan of them was stopped at once."""

from __future__ import annotations

import asyncio

import pytest

from gpuflow.control import reconcile
from gpuflow.control.reconcile import find_orphans, release_orphans
from gpuflow.services.capacity import HeldKey, held_page, take_allocation
from gpuflow.services.fleets import apply_fleet
from gpuflow.specs import FleetSpec, JobSpec
from gpuflow.status import JobStatus
from gpuflow.store.db import Store
from gpuflow.workflows.models import ReleaseOrphansInput
from tests.unit.store.test_reconcile_store import _record

NODES = [1, 2, 3, 1, 3, 2, 1, 1, 2, 3, 1, 2]


def _fleet(store: Store) -> None:
    hosts = [
        {"name": f"h{i:02d}", "gpus": [{"name": "A100", "memory": "80GB", "count": 8}]}
        for i in range(30)
    ]
    apply_fleet(store, FleetSpec.model_validate({"name": "f", "kind": "sim", "hosts": hosts}))


def _jobs(store: Store) -> dict[str, int]:
    """Job id -> nodes, each job placed (a node of a multi-node job takes a whole host)."""
    placed = {}
    for k, nodes in enumerate(NODES):
        job_id = f"job-j{k:02d}-abcdef"
        gpu = "A100:8" if nodes > 1 else "A100:1"
        job = JobSpec(name=f"j{k:02d}", commands=["x"], nodes=nodes, resources={"gpu": gpu})
        assert take_allocation(store, job_id=job_id, attempt=1, job=job) is not None
        placed[job_id] = nodes
    return placed


def test_pages_hold_whole_attempts_and_reach_every_allocation(store: Store) -> None:
    _fleet(store)
    placed = _jobs(store)
    seen: dict[str, int] = {}
    after: HeldKey | None = None
    pages = 0
    while True:
        held, after = held_page(store, fleet="f", limit=5, after=after)
        pages += 1
        assert held, "a page in the middle is never empty"
        assert sum(len(h.nodes) for h in held) <= 5
        for attempt in held:
            assert attempt.job_id not in seen, f"{attempt.job_id} on two pages"
            seen[attempt.job_id] = len(attempt.nodes)
            assert [n.rank for n in attempt.nodes] == list(range(len(attempt.nodes)))
        if after is None:
            break
        assert pages < 20
    assert seen == placed
    assert pages >= sum(NODES) // 5


def test_a_step_stops_at_most_its_nodes_and_says_it_left_some_out(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reconcile, "ORPHAN_NODES_PER_STEP", 5)
    _fleet(store)
    placed = _jobs(store)
    for job_id in placed:
        _record(store, job_id, JobStatus.FAILED, message="ended")
    released: dict[str, int] = {}
    after: HeldKey | None = None
    for _ in range(20):
        found, after = asyncio.run(find_orphans(store, None, fleet="f", after=after))
        nodes = sum(len(o.nodes) for o in found.orphans)
        assert nodes <= 5 or len(found.orphans) == 1
        release_orphans(store, ReleaseOrphansInput(fleet="f", orphans=found.orphans))
        released.update({o.job_id: len(o.nodes) for o in found.orphans})
        if not found.more:
            assert after is None  # one page held them all: the next look starts over
            break
    assert released == placed
    found, _ = asyncio.run(find_orphans(store, None, fleet="f"))
    assert found.orphans == [] and found.checked == 0
