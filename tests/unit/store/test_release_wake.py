"""A release asks the admission loop for a pass only when some job waits in a queue
(gpuflow/control/activities.py `release_job`): with none waiting a pass has nothing to admit,
and a job that enters later is decided as it enters, on what is free then. On SQLite and
PostgreSQL, through the activity itself."""

from __future__ import annotations

from temporalio.testing import ActivityEnvironment

from gpuflow.control.activities import ControlActivities
from gpuflow.services.capacity import allocations_of
from gpuflow.store.db import Store
from gpuflow.workflows.models import ReleaseInput
from tests.unit.store.test_admission_store import _enqueue, _entry, _fleet


async def _release(store: Store, name: str) -> int:
    activities = ControlActivities(store, task_queue="control")
    result = await ActivityEnvironment().run(
        activities.release_job, ReleaseInput(job_id=f"job-{name}")
    )
    return result.released_nodes


async def test_a_release_while_nobody_waits_asks_for_no_pass(
    store: Store, wakes: list[str | None]
) -> None:
    _fleet(store, gpus=2)
    assert _enqueue(store, "a", 0).placement is not None
    assert _enqueue(store, "b", 1).placement is not None
    assert await _release(store, "a") == 1
    assert wakes == []
    assert allocations_of(store, "job-a") == [] and _entry(store, "a") is None
    # what it freed is there for the next job as it enters
    assert _enqueue(store, "c", 2).placement is not None


async def test_a_release_while_a_job_waits_asks_for_a_pass(
    store: Store, wakes: list[str | None]
) -> None:
    _fleet(store, gpus=1)
    assert _enqueue(store, "running", 0).placement is not None
    waiting = _enqueue(store, "waiting", 1)
    assert waiting.placement is None and waiting.reason == "no_capacity"
    assert await _release(store, "running") == 1
    assert wakes == ["control"]


async def test_a_release_of_nothing_asks_for_no_pass(store: Store, wakes: list[str | None]) -> None:
    """A repeated release (the activity retried) frees nothing and changes nothing."""
    _fleet(store, gpus=1)
    assert _enqueue(store, "running", 0).placement is not None
    assert _enqueue(store, "waiting", 1).placement is None
    assert await _release(store, "running") == 1
    assert await _release(store, "running") == 0
    assert wakes == ["control"]
