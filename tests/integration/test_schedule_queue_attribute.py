"""Against a real dev server (with visibility): a job run by a Temporal Schedule, which is not
submitted through the API and so enters its queue only at its first step, is found in the UI by
its `GpuflowQueue` search attribute like a submitted job: the schedules gpuflow's client creates
carry it, and a run started without it (a schedule created outside gpuflow's client, or before
queues) sets it at its first step."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

import pytest
from temporalio.client import (
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleHandle,
    ScheduleIntervalSpec,
    ScheduleSpec,
)
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.testing import WorkflowEnvironment

from gpuflow.client import Client
from gpuflow.services.queues import apply_queue
from gpuflow.specs import JobSpec
from gpuflow.specs.queue import QueueSpec
from gpuflow.status import JobStatus
from gpuflow.store.db import Store
from gpuflow.workflows.models import JobInput, ProbeResult
from gpuflow.workflows.outcome import job_result
from gpuflow.workflows.ui import SA_PRIORITY, SA_QUEUE, SA_STATUS
from tests.workflow.harness import ScriptedHosts, sim_fleet, workers

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

STARTED_WITH = {
    # What `gpuflow schedule` gave a schedule's runs before queues: no GpuflowQueue.
    "before-queues": TypedSearchAttributes(
        [
            SearchAttributePair(SA_STATUS, JobStatus.PENDING.value),
            SearchAttributePair(SA_PRIORITY, 0),
        ]
    ),
    # A schedule made with Temporal's own client, as a platform team's code may.
    "none": TypedSearchAttributes.empty,
}


async def _first_run(schedule: ScheduleHandle) -> str:
    for _ in range(100):
        info = (await schedule.describe()).info
        runs = [a.action for a in info.recent_actions]
        ids = [getattr(action, "workflow_id", None) for action in runs]
        if ids and ids[0]:
            return str(ids[0])
        await asyncio.sleep(0.1)
    raise AssertionError(f"schedule {schedule.id} started no run")


@pytest.mark.parametrize("started_with", sorted(STARTED_WITH))
async def test_a_schedule_run_started_without_its_queue_attribute_sets_it(
    dev_env: WorkflowEnvironment, sqlite_store: Store, task_queue: str, started_with: str
) -> None:
    client = dev_env.client
    queue = f"q{uuid.uuid4().hex[:8]}"  # only this test's run is in it
    apply_queue(sqlite_store, QueueSpec(name=queue, gpus=2))
    fleet = sim_fleet(sqlite_store)
    hosts = ScriptedHosts(at_start=lambda inp: ProbeResult(state="exited", exit_code=0))
    spec = JobSpec(name="nightly", commands=["python train.py"], queue=queue)
    schedule = await client.create_schedule(
        f"schedule-{uuid.uuid4().hex[:8]}",
        Schedule(
            action=ScheduleActionStartWorkflow(
                "JobWorkflow",
                JobInput(spec=spec, search_attributes=True),
                id="job-nightly",
                task_queue=task_queue,
                typed_search_attributes=STARTED_WITH[started_with],
            ),
            spec=ScheduleSpec(intervals=[ScheduleIntervalSpec(every=timedelta(days=1))]),
        ),
    )
    try:
        async with workers(client, sqlite_store, task_queue, hosts, [fleet]):
            await schedule.trigger()
            run = client.get_workflow_handle(await _first_run(schedule))
            result = await job_result(run)
        assert result.status == JobStatus.DONE
        attributes = (await run.describe()).typed_search_attributes
        assert attributes.get(SA_QUEUE) == queue
        assert attributes.get(SA_STATUS) == JobStatus.DONE.value
        listed: list[str] = []
        for _ in range(50):  # visibility is eventually consistent
            listed = [w.id async for w in client.list_workflows(f"GpuflowQueue = '{queue}'")]
            if listed:
                break
            await asyncio.sleep(0.1)
        assert listed == [run.id]
    finally:
        await schedule.delete()


async def test_the_schedules_of_gpuflows_client_carry_the_queue_attribute(
    dev_env: WorkflowEnvironment,
) -> None:
    """Their runs start with it, as submitted jobs do, so they are listed by queue at once."""
    spec = JobSpec(name="nightly", commands=["python train.py"], queue="research", priority=7)
    asked: list[str] = []

    class ControlPlane:  # no control worker here: it finds the queue and fleets known
        async def call(self, update: str, arg: object, result_type: object, **_: object) -> list:
            asked.append(update)
            return []

    client = Client(temporal=dev_env.client, api=ControlPlane())
    schedule_id = await client.schedule(
        spec, cron="0 3 * * *", schedule_id=f"schedule-{uuid.uuid4().hex[:8]}"
    )
    assert asked == ["plan"]  # the queue and fleets were checked before it was created
    schedule = dev_env.client.get_schedule_handle(schedule_id)
    try:
        action = (await schedule.describe()).schedule.action
        assert isinstance(action, ScheduleActionStartWorkflow)
        attributes = action.typed_search_attributes
        assert (attributes.get(SA_QUEUE), attributes.get(SA_PRIORITY)) == ("research", 7)
    finally:
        await schedule.delete()
