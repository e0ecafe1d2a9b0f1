"""The admission loop passes again at once when a pass says it left admissions or words for the
next (`PassResult.more`: services/admission.py bounds a pass's result, one Temporal payload),
and waits for an ask again once a pass has done all it could."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from temporalio import activity
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from gpuflow.workflows import checked_workflow_runner
from gpuflow.workflows.admission import AdmissionWorkflow
from gpuflow.workflows.queue_models import AdmissionState, PassInput, PassResult, TellResult

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_a_pass_that_left_some_is_followed_by_another_at_once(
    time_env: WorkflowEnvironment, task_queue: str
) -> None:
    passes: list[bool] = []
    left = [True, True, False]  # what each pass says: two leave some for the next

    @activity.defn(name="admission_pass")
    async def admission_pass(inp: PassInput) -> PassResult:
        more = left.pop(0) if left else False
        passes.append(more)
        return PassResult(more=more)

    @activity.defn(name="tell_jobs")
    async def tell_jobs(inp: PassResult) -> TellResult:
        return TellResult()

    async with Worker(
        time_env.client,
        task_queue=task_queue,
        workflows=[AdmissionWorkflow],
        workflow_runner=checked_workflow_runner(),
        activities=[admission_pass, tell_jobs],
    ):
        handle = await time_env.client.start_workflow(
            AdmissionWorkflow.run,
            AdmissionState(),
            id=f"admission-{uuid.uuid4().hex[:6]}",
            task_queue=task_queue,
        )
        for _ in range(100):  # the first pass is at the start; the next two follow on their own
            if len(passes) >= 3:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)
        assert passes == [True, True, False]  # and no fourth: nothing asked for one
        await handle.signal(AdmissionWorkflow.wake)
        for _ in range(100):
            if len(passes) == 4:
                break
            await asyncio.sleep(0.05)
        assert passes == [True, True, False, False]
        await handle.terminate()
