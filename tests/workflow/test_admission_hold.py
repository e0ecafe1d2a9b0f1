"""`gpuflow down` holds the admission loop while it stops the running jobs (the GPUs they free
must not start waiting jobs just before the stack goes down), and `gpuflow up` lets it go:
a held loop runs no pass however often it is asked; let go, it passes at once."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio.testing import WorkflowEnvironment

from gpuflow.client import Client
from gpuflow.client.api import TemporalApi
from gpuflow.control.admission_wake import wake_admission
from gpuflow.services.queues import apply_queue
from gpuflow.specs.queue import QueueSpec
from gpuflow.status import JobStatus
from gpuflow.store.db import Store
from gpuflow.workflows.handles import hold_admission
from gpuflow.workflows.models import ProbeResult
from gpuflow.workflows.outcome import job_result
from gpuflow.workflows.queue_models import admission_workflow_id
from tests.workflow.harness import ScriptedHosts, job, sim_fleet, start_job, workers
from tests.workflow.test_admission_safety import _local_steps
from tests.workflow.test_queue_workflow import WAIT, _entry, _replayer, _waits


async def test_a_held_loop_admits_nothing_until_it_is_let_go(
    time_env: WorkflowEnvironment, sqlite_store: Store, task_queue: str
) -> None:
    fleet = sim_fleet(sqlite_store)
    apply_queue(sqlite_store, QueueSpec(name="none", gpus=0))
    hosts = ScriptedHosts(probe=lambda inp, n: ProbeResult(state="exited", exit_code=0))
    client = Client(
        temporal=time_env.client, api=TemporalApi(time_env.client, task_queue=task_queue)
    )
    loop = time_env.client.get_workflow_handle(admission_workflow_id(task_queue))
    with time_env.auto_time_skipping_disabled():
        async with workers(time_env.client, sqlite_store, task_queue, hosts, [fleet]):
            waiter = await start_job(
                time_env.client, task_queue, job("waiter", queue="none", retry=WAIT)
            )
            await _waits(sqlite_store, waiter, "quota")
            assert not await client.admission_held()
            await client.hold_admission()
            await asyncio.sleep(0.5)  # the hold is taken before the pass it must stop
            assert await client.admission_held()  # what `gpuflow ps` says
            passes = _local_steps(await loop.fetch_history(), "admission_pass")
            apply_queue(sqlite_store, QueueSpec(name="none", gpus=1))
            assert await wake_admission(time_env.client, task_queue)
            await time_env.sleep(timedelta(minutes=3))  # the loop's own passes are held too
            entry = await _entry(sqlite_store, waiter.id)
            assert entry is not None and entry.state == "waiting"
            assert _local_steps(await loop.fetch_history(), "admission_pass") == passes
            await client.hold_admission(False)  # what `gpuflow up` does
            assert not await client.admission_held()
            result = await job_result(waiter)
            history = await loop.fetch_history()
    assert result.status == JobStatus.DONE
    assert _local_steps(history, "admission_pass") > passes
    await _replayer().replay_workflow(history)


async def test_letting_go_of_a_loop_that_is_not_running_is_fine(
    time_env: WorkflowEnvironment, task_queue: str
) -> None:
    await hold_admission(time_env.client, False, task_queue)  # what `gpuflow up` calls
    client = Client(
        temporal=time_env.client, api=TemporalApi(time_env.client, task_queue=task_queue)
    )
    await client.hold_admission(False)
    assert not await client.admission_held()  # no loop: nothing holds
