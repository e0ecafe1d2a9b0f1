"""Against a real dev server (with visibility): `ps` lists a job started outside the API (a
Temporal Schedule's run) from the moment its workflow exists, before its first step writes its
row; a request no control worker answers is one line, not a hang."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from gpuflow.client import Client
from gpuflow.client.api import TemporalApi
from gpuflow.control.api import ApiActivities
from gpuflow.services.jobs import list_jobs
from gpuflow.specs import FleetSpec, JobSpec
from gpuflow.store.db import Store
from gpuflow.workflows import workflow_runner
from gpuflow.workflows.api import JOB_MEMO, ControlApiWorkflow
from gpuflow.workflows.models import JobInput

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]


async def test_an_unrecorded_job_is_listed_from_visibility(
    dev_env: WorkflowEnvironment, sqlite_store: Store, tmp_path: Path, task_queue: str
) -> None:
    activities = ApiActivities(sqlite_store, dev_env.client, home=tmp_path)
    # Only the API is served: the job's workflow is not run, so its row is never written.
    async with Worker(
        dev_env.client,
        task_queue=task_queue,
        workflows=[ControlApiWorkflow],
        activities=activities.activities(),
        workflow_runner=workflow_runner(),
    ):
        api = TemporalApi(
            dev_env.client, task_queue=task_queue, workflow_id=f"gpuflow-api-{uuid.uuid4().hex[:6]}"
        )
        client = Client(temporal=dev_env.client, api=api)
        fleet = f"f{uuid.uuid4().hex[:6]}"
        await client.apply_fleet(
            FleetSpec.model_validate(
                {
                    "type": "fleet",
                    "name": fleet,
                    "kind": "sim",
                    "hosts": [{"name": "a", "gpus": [{"name": "A100", "memory": "80GB"}]}],
                }
            )
        )
        spec = JobSpec(name="early", commands=["x"], fleets=[fleet], priority=3)
        # Started as a Schedule starts its runs: not through the API's submit, which records
        # the job and enters it in its queue at once.
        job = await dev_env.client.start_workflow(
            "JobWorkflow",
            JobInput(spec=spec, search_attributes=False),
            id=f"job-early-{uuid.uuid4().hex[:6]}",
            task_queue=task_queue,
            memo={JOB_MEMO: {"name": "early", "priority": 3, "queue": "default"}},
        )
        try:
            assert list_jobs(sqlite_store, include_finished=True) == []
            listed = None
            for _ in range(50):  # visibility is eventually consistent
                listed = next((j for j in await client.jobs() if j.id == job.id), None)
                if listed is not None:
                    break
                await asyncio.sleep(0.1)
            assert listed is not None
            assert (listed.name, listed.status, listed.priority) == ("early", "pending", 3)
            assert (await client.get("early")).id == job.id
            # A page asks visibility for the workflows started within its span (the query's
            # StartTime bounds, on the real server)
            started = (await job.describe()).start_time
            second = timedelta(seconds=1)
            spans = {
                (started - second, started + second): True,
                (None, started + second): True,
                (started - second, None): True,
                (started + second, None): False,
                (None, started - second): False,
            }
            for span, found in spans.items():
                ids = {r.id for r in await activities._open_unrecorded(set(), span)}
                assert (job.id in ids) is found, span
        finally:
            await dev_env.client.get_workflow_handle(job.id).terminate("test over")
            await dev_env.client.get_workflow_handle(f"fleet-{fleet}").terminate("test over")


async def test_no_control_worker_is_one_line_not_a_hang(dev_env: WorkflowEnvironment) -> None:
    from gpuflow.errors import ConnectionFailed
    from gpuflow.workflows.api import Empty
    from gpuflow.workflows.api_fleets import FleetRecord

    nobody = TemporalApi(
        dev_env.client,
        task_queue=f"tq-none-{uuid.uuid4().hex[:6]}",
        workflow_id=f"gpuflow-api-{uuid.uuid4().hex[:6]}",
    )
    try:
        with pytest.raises(ConnectionFailed) as failed:
            await nobody.call("fleets", Empty(), list[FleetRecord], timeout_s=2)
        assert str(failed.value).startswith(
            "the control plane did not answer within 2s; a request no control worker took up "
            "in its first 1s is never carried out later; is a control worker running?"
        )
    finally:
        await dev_env.client.get_workflow_handle(nobody.workflow_id).terminate("test over")


async def test_a_request_its_client_gave_up_on_is_not_carried_out_later(
    dev_env: WorkflowEnvironment, sqlite_store: Store, tmp_path: Path
) -> None:
    """With no control worker, a submit fails after its timeout; Temporal keeps the request,
    and the worker that starts later used to carry it out: a retried submit made two jobs."""
    from temporalio.service import RPCError

    from gpuflow.control.worker import ControlWorker
    from gpuflow.errors import ConnectionFailed, NotFoundError
    from gpuflow.workflows.api import JobRecord, SubmitRequest

    api = TemporalApi(dev_env.client, workflow_id=f"gpuflow-api-{uuid.uuid4().hex[:6]}")
    job_id = f"job-ghost-{uuid.uuid4().hex[:6]}"
    spec = JobSpec.model_validate({"name": "ghost", "commands": ["true"]})
    with pytest.raises(ConnectionFailed, match="first 1s is never carried out later"):
        await api.call("submit", SubmitRequest(job_id=job_id, spec=spec), JobRecord, timeout_s=2)
    try:
        async with ControlWorker(dev_env.client, sqlite_store, home=tmp_path):
            client = Client(temporal=dev_env.client, api=api)
            await client.jobs(include_finished=True)  # the worker has served the lane
            with pytest.raises(NotFoundError):
                await client.get(job_id)
            history = await dev_env.client.get_workflow_handle(api.workflow_id).fetch_history()
        # refused by its validator: nothing of it in the API workflow's history
        accepted = "workflow_execution_update_accepted_event_attributes"
        names = [
            getattr(e, accepted).accepted_request.input.name
            for e in history.events
            if e.HasField(accepted)
        ]
        assert "jobs" in names and "submit" not in names
        with pytest.raises(RPCError):  # no workflow of the job was ever started
            await dev_env.client.get_workflow_handle(job_id).describe()
    finally:
        await dev_env.client.get_workflow_handle(api.workflow_id).terminate("test over")
