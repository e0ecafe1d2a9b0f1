"""Releases that arrive together share one placement transaction (gpuflow/control/releases.py),
each as if it had its own: its own nodes freed and ending recorded, a repeat freeing nothing,
one error failing only its own release. On SQLite and PostgreSQL, through the activity."""

from __future__ import annotations

import asyncio

import pytest

from gpuflow.control import releases
from gpuflow.control.activities import ControlActivities
from gpuflow.metrics import REGISTRY
from gpuflow.services.capacity import allocations_of
from gpuflow.services.jobs import find_job, job_events
from gpuflow.status import JobStatus, TerminationReason
from gpuflow.store.db import Store
from gpuflow.workflows.models import JobStatusInput, ReleaseInput, ReleaseResult
from tests.unit.store.test_admission_store import _enqueue, _entry, _fleet
from tests.unit.store.test_warm import _look, _memory_checked

_SAMPLES = (
    "gpuflow_release_group_size_count",
    "gpuflow_release_group_size_sum",
    "gpuflow_release_seconds_count",
)


def _sample(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


def _ended(name: str) -> ReleaseInput:
    record = JobStatusInput(
        job_id=f"job-{name}",
        name=name,
        status=JobStatus.DONE,
        attempt=1,
        event_key="ended",
        reason=TerminationReason.DONE,
    )
    return ReleaseInput(job_id=f"job-{name}", record=record)


async def _together(
    activities: ControlActivities, asks: list[ReleaseInput]
) -> list[ReleaseResult | BaseException]:
    return await asyncio.gather(
        *(activities.release_job(ask) for ask in asks), return_exceptions=True
    )


async def test_releases_that_arrive_together_are_one_transaction_each_as_if_alone(
    store: Store, wakes: list[str | None]
) -> None:
    _fleet(store, gpus=4)
    for k, name in enumerate("abcd"):
        assert _enqueue(store, name, k).placement is not None
    assert _enqueue(store, "waiting", 9, resources={"gpu": "A100:2"}).placement is None
    activities = ControlActivities(store, task_queue="control")
    asks = [_ended("a"), _ended("b"), _ended("a"), ReleaseInput(job_id="job-c")]
    before = [_sample(name) for name in _SAMPLES]
    found = await _together(activities, asks)
    assert activities.releases.groups == 1
    # one group of 4 in gpuflow_release_group_size, 4 releases in gpuflow_release_seconds
    assert [_sample(name) - b for name, b in zip(_SAMPLES, before, strict=True)] == [1, 4, 4]
    assert [r.released_nodes for r in found if isinstance(r, ReleaseResult)] == [1, 1, 0, 1]
    assert wakes == ["control"] * 3  # a job waits: each release that freed something asks
    for name in "abc":
        assert allocations_of(store, f"job-{name}") == [] and _entry(store, name) is None
    assert len(allocations_of(store, "job-d")) == 1 and _entry(store, "d") is not None
    for name in "ab":
        assert find_job(store, f"job-{name}").status == JobStatus.DONE
        assert [e.key for e in job_events(store, f"job-{name}")].count("ended") == 1
    with _memory_checked() as checks:  # the warm state followed the group: a catch-up finds
        _look(store)  # it equal to a cold read of the database
    assert checks[0] == 1


async def test_one_release_that_fails_fails_alone(
    store: Store, wakes: list[str | None], monkeypatch: pytest.MonkeyPatch
) -> None:
    _fleet(store, gpus=3)
    for k, name in enumerate("abc"):
        assert _enqueue(store, name, k).placement is not None
    original = releases.record_in

    def record_in(session: object, inp: JobStatusInput, **flags: bool) -> None:
        if inp.job_id == "job-b":
            raise RuntimeError("the database refused job-b's record")
        original(session, inp, **flags)  # type: ignore[arg-type]

    monkeypatch.setattr(releases, "record_in", record_in)
    activities = ControlActivities(store, task_queue="control")
    found = await _together(activities, [_ended("a"), _ended("b"), _ended("c")])
    assert isinstance(found[1], RuntimeError) and "job-b" in str(found[1])
    assert [r.released_nodes for r in found if isinstance(r, ReleaseResult)] == [1, 1]
    assert allocations_of(store, "job-a") == [] and allocations_of(store, "job-c") == []
    # job-b's release was rolled back whole: it still holds its GPU and its entry
    assert len(allocations_of(store, "job-b")) == 1 and _entry(store, "b") is not None
    assert find_job(store, "job-c").status == JobStatus.DONE
    assert activities.releases.groups == 1  # the group, then each alone inside its batch
    assert wakes == []  # nobody waits
