"""Asks and verdicts that must not be lost (gpuflow/workflows/admission.py). A run of an
admission pass whose result the loop never recorded (its worker died after the commit) is run
again with the same `pass_id`: it tells again the jobs the lost run admitted or refused, which
wait no more and would otherwise never hear. A job's ask for a pass is made until delivered."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest
from temporalio.client import Client
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from gpuflow.control.admission import AdmissionActivities
from gpuflow.services.capacity import allocations_of
from gpuflow.specs import JobSpec
from gpuflow.store.db import Store
from gpuflow.workflows.queue_models import EnqueueInput, PassInput, PassResult
from tests.unit.store.test_admission_store import T0, _enqueue, _entry, _fleet, _release


def _pass(store: Store, pass_id: str | None) -> PassResult:
    return asyncio.run(AdmissionActivities(store).admission_pass(PassInput(pass_id=pass_id)))


def test_a_pass_run_again_tells_what_its_lost_run_decided_and_no_other_pass_does(
    store: Store,
) -> None:
    _fleet(store)
    assert _enqueue(store, "blocker", 0).placement is not None
    assert _enqueue(store, "low", 1).placement is None
    assert _enqueue(store, "late", 2, may_wait=False).refused is None  # waits behind low
    _release(store, "blocker")

    lost = _pass(store, "p1")
    assert [(a.job_id, a.attempt) for a in lost.admitted] == [("job-low", 1)]
    assert [r.job_id for r in lost.refused] == ["job-late"]
    entry = _entry(store, "low")
    assert entry is not None and (entry.state, entry.decided_by) == ("admitted", "p1")

    again = _pass(store, "p1")
    assert again.admitted == lost.admitted  # the same placement, not a second one
    assert again.refused == lost.refused
    assert len(allocations_of(store, "job-low")) == 1

    assert _pass(store, "p2").admitted == [] and _pass(store, "p2").refused == []
    assert _pass(store, None).admitted == []


class _FlakyTemporal:
    """A Temporal client whose first ask for a pass (signal-with-start of the loop) is refused."""

    def __init__(self) -> None:
        self.asks = 0

    async def start_workflow(self, *args: Any, **kwargs: Any) -> None:
        self.asks += 1
        if self.asks == 1:
            raise RPCError("server unavailable", RPCStatusCode.UNAVAILABLE, b"")


def test_a_job_that_waits_asks_for_a_pass_again_until_the_ask_is_delivered(store: Store) -> None:
    """The loop passes on its own only while it knows of waiting jobs, and a job asks again only
    after minutes: the step that entered a job to wait fails while its ask is lost (Temporal
    retries it), and entering again changes nothing."""
    _fleet(store)
    assert _enqueue(store, "blocker", 0).placement is not None
    temporal = _FlakyTemporal()
    step = AdmissionActivities(store, temporal=cast(Client, temporal), task_queue="tq")
    spec = JobSpec.model_validate(
        {"name": "waiter", "commands": ["true"], "resources": {"gpu": "A100:1"}}
    )
    ask = EnqueueInput(job_id="job-waiter", attempt=1, spec=spec, submitted_at=T0, may_wait=True)
    with pytest.raises(ApplicationError, match="could not ask the admission loop"):
        asyncio.run(step.enqueue_job(ask))
    entry = _entry(store, "waiter")
    assert entry is not None and entry.state == "waiting"
    again = asyncio.run(step.enqueue_job(ask))
    assert again.placement is None and again.reason == "no_capacity"
    assert temporal.asks == 2
