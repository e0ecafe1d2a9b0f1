"""Invariant 3 broken on purpose, against a real Temporal dev server: a job's workflow is
terminated from outside gpuflow, and the fleet's reconciliation heals it within one health
interval; `gpuflow stop` ends a job whose workflow does not answer."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
from temporalio.client import WorkflowExecutionStatus
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.testing import WorkflowEnvironment

from gpuflow.client import Client, StopStep
from gpuflow.control.worker import ControlWorker
from gpuflow.naming import CONTROL_TASK_QUEUE
from gpuflow.scheduler.model import Placement
from gpuflow.services.capacity import allocations_of, take_allocation
from gpuflow.services.fleets import apply_fleet
from gpuflow.services.jobs import job_events, record_status_in
from gpuflow.specs import FleetSpec, JobSpec
from gpuflow.status import JobStatus, TerminationReason
from gpuflow.store.db import Store
from gpuflow.workflows.models import FleetInput, JobInput

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

HEALTH_INTERVAL_S = 3.0
SLACK_S = 12.0
"""Above the interval: the pass's own activities, and the stop's grace when a process ignores
SIGTERM, on a loaded machine."""


def _fleet(name: str) -> FleetSpec:
    return FleetSpec.model_validate(
        {
            "type": "fleet",
            "name": name,
            "kind": "sim",
            "hosts": [{"name": "h1", "gpus": [{"name": "A100", "memory": "80GB", "count": 2}]}],
        }
    )


def _job(name: str, commands: list[str], fleet: str) -> JobSpec:
    return JobSpec.model_validate(
        {"name": name, "commands": commands, "resources": {"gpu": "A100:1"}, "fleets": [fleet]}
    )


async def _watch(env: WorkflowEnvironment, fleet: str, interval_s: float) -> None:
    """The fleet's health checks, with the interval this test needs."""
    await env.client.start_workflow(
        "FleetWorkflow",
        FleetInput(fleet=fleet, health_interval_s=interval_s),
        id=f"fleet-{fleet}",
        task_queue=CONTROL_TASK_QUEUE,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
    )


def _alive(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat")
    try:
        return stat.read_text().split(") ")[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


async def test_a_terminated_workflow_is_healed_within_one_health_interval(
    dev_env: WorkflowEnvironment, store: Store, tmp_path: Path
) -> None:
    fleet = f"f{uuid.uuid4().hex[:6]}"
    pid_file = tmp_path / "pid"
    apply_fleet(store, _fleet(fleet))
    client = Client(temporal=dev_env.client)
    async with ControlWorker(dev_env.client, store, home=tmp_path):
        await _watch(dev_env, fleet, HEALTH_INTERVAL_S)
        job = await client.submit(_job("orphan", [f"echo $$ > {pid_file}", "sleep 300"], fleet))
        for _ in range(300):
            running = (await client.get(job.id)).status == JobStatus.RUNNING
            if running and pid_file.exists() and pid_file.read_text().strip():
                break
            await asyncio.sleep(0.1)
        pid = int(pid_file.read_text())
        assert _alive(pid) and len(allocations_of(store, job.id)) == 1

        # Break invariant 3: nothing of the job's workflow runs to compensate.
        await dev_env.client.get_workflow_handle(job.id).terminate(reason="broken on purpose")
        terminated = asyncio.get_running_loop().time()
        while allocations_of(store, job.id) or _alive(pid):
            elapsed = asyncio.get_running_loop().time() - terminated
            assert elapsed < HEALTH_INTERVAL_S + SLACK_S, "not healed within a health interval"
            await asyncio.sleep(0.1)
        for _ in range(50):  # released and recorded in one transaction; read it settled
            info = await client.get(job.id)
            if info.status.is_final:
                break
            await asyncio.sleep(0.1)
        await client.delete_fleet(fleet)

    assert info.status == JobStatus.TERMINATED
    assert info.reason == TerminationReason.WORKFLOW_CLOSED.value
    assert info.message == "workflow terminated outside gpuflow"
    events = [e.message for e in job_events(store, job.id) if e.key == "1:reconciled"]
    assert events == [
        f"workflow terminated outside gpuflow: gpuflow stopped its processes and released its "
        f"GPUs (attempt 1, fleet {fleet})"
    ]
    assert not _alive(pid)


async def test_stop_terminates_a_workflow_that_does_not_answer(
    dev_env: WorkflowEnvironment, sqlite_store: Store, tmp_path: Path
) -> None:
    """A job whose workflow no worker runs (as stuck as a workflow task that fails forever):
    neither stop nor cancel ends it, so `stop` terminates it, and the refresh it sends makes
    reconciliation release the job's GPUs long before the next health check."""
    fleet = f"f{uuid.uuid4().hex[:6]}"
    apply_fleet(sqlite_store, _fleet(fleet))
    spec = _job("stuck", ["sleep 300"], fleet)
    job_id = f"job-stuck-{uuid.uuid4().hex[:6]}"
    await dev_env.client.start_workflow(
        "JobWorkflow",
        JobInput(job_id=job_id, spec=spec, search_attributes=False),
        id=job_id,
        task_queue=f"nobody-{uuid.uuid4().hex[:6]}",
    )
    placed = take_allocation(sqlite_store, job_id=job_id, attempt=1, job=spec, fleets=[fleet])
    assert isinstance(placed, Placement)
    with sqlite_store.session() as session:
        record_status_in(
            session,
            job_id=job_id,
            name="stuck",
            spec=spec.model_dump(mode="json"),
            status=JobStatus.RUNNING,
            event_key="1:running",
            attempt=1,
            fleet=fleet,
            hosts=["h1"],
        )
        session.commit()
    client = Client(temporal=dev_env.client)
    async with ControlWorker(dev_env.client, sqlite_store, home=tmp_path):
        await _watch(dev_env, fleet, 600)  # only the stop's refresh can make it run in time
        await asyncio.sleep(1)  # its first pass has seen the job's workflow running
        assert len(allocations_of(sqlite_store, job_id)) == 1
        outcome = await client.stop(job_id, grace_s=1, timeout_s=60)
        described = await dev_env.client.get_workflow_handle(job_id).describe()
        await client.delete_fleet(fleet)
    assert outcome.ended_by == StopStep.TERMINATION
    assert outcome.status == JobStatus.TERMINATED
    assert outcome.reason == TerminationReason.WORKFLOW_CLOSED.value
    assert described.status == WorkflowExecutionStatus.TERMINATED
    assert allocations_of(sqlite_store, job_id) == []
