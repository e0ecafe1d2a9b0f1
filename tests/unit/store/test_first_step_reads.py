"""A job's first step (`enqueue_job`) after its submit entered it: the verdict is read, not
written, and the reads of steps that come together share one read transaction
(control/admission.py, control/batches.py); the placement is observed once, by whoever placed
it; a step whose entry waits still asks the loop for a pass."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gpuflow.control import admission
from gpuflow.control.admission import AdmissionActivities, GroupCommit
from gpuflow.metrics._registry import REGISTRY
from gpuflow.services import queue_entries
from gpuflow.services.group_entry import Submitted
from gpuflow.services.queue_entries import look_all_in, look_in
from gpuflow.store.db import Store
from gpuflow.workflows.queue_models import QueueVerdict
from tests.unit.store.test_group_entry import _first_step, _jobs, _prepared

ONE_GPU = {"gpu": "1", "nodes": 1, "queue": "default"}


def _placed_observations() -> float:
    found = REGISTRY.get_sample_value("gpuflow_placement_seconds_count", {"outcome": "placed"})
    return found or 0.0


def submits_then_steps(
    entries: GroupCommit, step: AdmissionActivities, jobs: list[Submitted]
) -> tuple[list[QueueVerdict], list[QueueVerdict]]:
    """The jobs' submits at once, then their first steps at once: the verdicts of both."""

    async def both() -> tuple[list[QueueVerdict], list[QueueVerdict]]:
        submitted = await asyncio.gather(*(entries.enter(job) for job in jobs))
        steps = await asyncio.gather(*(step.enqueue_job(_first_step(job)) for job in jobs))
        return submitted, steps

    return asyncio.run(both())


def test_first_steps_read_their_verdicts_together(
    sqlite_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Twelve steps after their submits: the verdicts their submits got, from fewer read
    transactions than steps, without a placement transaction, each placement observed once."""
    _prepared(sqlite_store)
    jobs = _jobs([{**ONE_GPU, "may_wait": True}] * 9 + [{**ONE_GPU, "may_wait": False}] * 3)
    entries, step = GroupCommit(sqlite_store), AdmissionActivities(sqlite_store)
    woken: list[Any] = []

    async def wake(*args: Any) -> None:
        woken.append(args)

    def own_entry(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the step entered the job itself")

    monkeypatch.setattr(admission, "enqueue_in", own_entry)
    monkeypatch.setattr(admission, "ask_for_pass", wake)
    before = _placed_observations()

    submitted, steps = submits_then_steps(entries, step, jobs)
    assert steps == submitted
    placed = sum(v.placement is not None for v in steps)
    assert placed == 8  # 8 GPUs: the others wait for the loop's pass (someone waits already)
    waiting = [v for v in steps if v.placement is None and v.refused is None]
    assert step._looks.batches < len(jobs)
    assert _placed_observations() - before == placed  # by the submits; the reads add none
    assert len(waiting) == 4 and len(woken) == 4  # a step whose entry waits asks for a pass


def test_look_all_answers_each_ask_in_order(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """Admitted (with the placement held), refused, waiting, another attempt, and unknown, in
    the order asked, on both databases; `look_in` is the same read for one job."""
    _prepared(store)
    jobs = _jobs(
        [{**ONE_GPU, "gpu": "4", "may_wait": True}]
        + [{**ONE_GPU, "gpu": "A100:8", "may_wait": False}]
        + [{**ONE_GPU, "gpu": "4", "may_wait": True}] * 2
    )
    verdicts = admission.enter_all_at_submit(store, jobs)
    assert all(isinstance(v, QueueVerdict) for v in verdicts)
    admitted, refused, _, waiting = verdicts
    assert isinstance(admitted, QueueVerdict) and admitted.placement is not None
    assert isinstance(refused, QueueVerdict) and refused.refused
    assert isinstance(waiting, QueueVerdict) and waiting.placement is None
    asks = [("job-3", 1), ("nobody", 1), ("job-0", 2), ("job-1", 1), ("job-0", 1), ("job-0", 1)]
    with store.read() as session:
        found = look_all_in(session, asks)
        alone = [look_in(session, job_id=job_id, attempt=n) for job_id, n in asks]
    assert found == [waiting, None, None, refused, admitted, admitted]
    assert alone == found
    monkeypatch.setattr(queue_entries, "IDS_PER_STATEMENT", 2)  # the ids read in chunks
    with store.read() as session:
        assert look_all_in(session, asks) == found
