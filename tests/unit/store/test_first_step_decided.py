"""A job's first step in the worker whose submit decided it (admitted or refused) takes the
submit's verdict without a read (control/admission.py `GroupCommit.decided`); a step whose
entry waited reads it (a pass may have admitted it since), and so does a repeated step; the
kept verdicts are bounded."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from gpuflow.control import admission
from gpuflow.control.admission import AdmissionActivities, GroupCommit
from gpuflow.store.db import Store
from gpuflow.workflows.queue_models import QueueVerdict
from tests.unit.store.test_first_step_reads import submits_then_steps
from tests.unit.store.test_group_entry import _first_step, _jobs, _prepared

ONE_GPU = {"gpu": "1", "nodes": 1, "queue": "default"}


def _steps(store: Store) -> tuple[GroupCommit, AdmissionActivities, list[str]]:
    """The API's group commit and the first steps beside it, with the job ids steps read."""
    entries, step = GroupCommit(store), AdmissionActivities(store)
    step.entries = entries
    read: list[str] = []
    serve = step._looks.serve

    def counted(asks: Sequence[tuple[str, int]]) -> Any:
        read.extend(job_id for job_id, _ in asks)
        return serve(asks)

    step._looks.serve = counted
    return entries, step, read


def test_first_steps_take_decided_verdicts_and_read_the_others(
    sqlite_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    _prepared(sqlite_store)  # 8 GPUs
    too_big = {"gpu": "16", "nodes": 1, "queue": "default", "may_wait": False}
    jobs = _jobs([too_big] + [{**ONE_GPU, "may_wait": True}] * 10)
    entries, step, read = _steps(sqlite_store)

    async def wake(*args: Any) -> None:
        return None

    monkeypatch.setattr(admission, "ask_for_pass", wake)

    submitted, steps = submits_then_steps(entries, step, jobs)
    assert steps == submitted
    assert submitted[0].refused and sum(v.placement is not None for v in submitted) == 8
    waited = [job.job_id for job, v in zip(jobs, submitted, strict=True) if v.placement is None]
    assert sorted(read) == sorted(waited[1:])  # the two that wait; not the refused one
    # A repeated first step (the activity retried) reads: the kept verdict was taken once.
    placed = jobs[1]
    again = asyncio.run(step.enqueue_job(_first_step(placed)))
    assert again == submitted[1] and read[-1] == placed.job_id


def test_kept_verdicts_are_bounded(sqlite_store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    _prepared(sqlite_store)
    monkeypatch.setattr(admission, "MAX_DECIDED", 3)
    jobs = _jobs([{**ONE_GPU, "may_wait": False}] * 5)
    entries, step, read = _steps(sqlite_store)

    async def one_by_one() -> list[QueueVerdict]:
        submitted = [await entries.enter(job) for job in jobs]
        steps = [await step.enqueue_job(_first_step(job)) for job in jobs]
        assert steps == submitted
        return steps

    asyncio.run(one_by_one())
    assert read == ["job-0", "job-1"]  # the oldest two were let go: their steps read
