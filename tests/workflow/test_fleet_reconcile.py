"""FleetWorkflow's reconciliation on the time-skipping server: capacity held by a job whose
workflow was terminated from outside, or whose row has ended, is stopped and released; a live
job is left alone; a job waiting for capacity is woken."""

from __future__ import annotations

import asyncio
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio import activity
from temporalio.client import WorkflowHandle
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer, Worker

from gpuflow.control.activities import ControlActivities
from gpuflow.naming import host_task_queue
from gpuflow.payloads import DATA_CONVERTER
from gpuflow.scheduler.model import Placement
from gpuflow.services.capacity import allocations_of, take_allocation
from gpuflow.services.jobs import find_job, job_events, record_status_in
from gpuflow.status import JobStatus, TerminationReason
from gpuflow.store.db import Store
from gpuflow.store.tables import QueueEntryRow
from gpuflow.workflows import checked_workflow_runner
from gpuflow.workflows.fleet import FleetWorkflow
from gpuflow.workflows.models import (
    FleetInput,
    HostHealthInput,
    HostHealthResult,
    JobProgress,
    OrphansResult,
    ProbeResult,
)
from tests.workflow.harness import ScriptedHosts, job, sim_fleet, start_job, workers

pytestmark = pytest.mark.asyncio(loop_scope="session")

HISTORIES = Path(__file__).parent / "histories"


class PingedHosts(ScriptedHosts):
    """Scripted hosts that also answer the fleet's health pings."""

    def activities(self) -> list[Any]:
        @activity.defn(name="ping_host")
        async def ping_host() -> str:
            return "pong"

        return [*super().activities(), ping_host]


async def _until(check: Any, what: str, timeout: float = 30) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not await check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"never: {what}")
        await asyncio.sleep(0.1)


async def _status(handle: WorkflowHandle[Any, Any]) -> JobStatus:
    progress = await handle.query("progress", result_type=JobProgress)
    return progress.status


def _replayer() -> Replayer:
    return Replayer(
        workflows=[FleetWorkflow],
        data_converter=DATA_CONVERTER,
        workflow_runner=checked_workflow_runner(),
    )


async def test_orphans_are_stopped_and_released_and_live_jobs_left_alone(
    time_env: WorkflowEnvironment, sqlite_store: Store, task_queue: str
) -> None:
    fleet = sim_fleet(
        sqlite_store,
        hosts=[{"name": "h1", "gpus": [{"name": "A100", "memory": "80GB", "count": 4}]}],
    )
    hosts = PingedHosts(probe=lambda inp, n: ProbeResult(state="running"))
    fleet_queue = f"{task_queue}-fleet"
    async with workers(time_env.client, sqlite_store, task_queue, hosts, [fleet]):
        lost = await start_job(time_env.client, task_queue, job("lost", fleets=[fleet.name]))
        alive = await start_job(time_env.client, task_queue, job("alive", fleets=[fleet.name]))
        for handle in (lost, alive):
            await _until(
                lambda h=handle: _is(h, JobStatus.RUNNING),
                f"{handle.id} running",  # type: ignore[misc]
            )
        # A job whose row ended while it still holds a GPU (what the issue found after a
        # failed finalize): no workflow to ask, its row is enough.
        ended = f"job-ended-{uuid.uuid4().hex[:6]}"
        held = take_allocation(sqlite_store, job_id=ended, attempt=1, job=job("ended"))
        assert isinstance(held, Placement)
        with sqlite_store.session() as session:
            record_status_in(
                session,
                job_id=ended,
                name="ended",
                spec=None,
                status=JobStatus.DONE,
                event_key="1:done",
                attempt=1,
                reason="done",
                message="all exited",
            )
            session.commit()
        # Needs two GPUs, one is free: it waits, and wakes when the orphans are released.
        waiter = await start_job(
            time_env.client,
            task_queue,
            job(
                "waiter",
                fleets=[fleet.name],
                resources={"gpu": "A100:2"},
                retry={"on_events": ["no-capacity"], "duration": "1h"},
            ),
        )
        await _until(lambda: _waiting(sqlite_store, waiter.id), "waiter waits for capacity")
        await lost.terminate(reason="broken on purpose")

        with ThreadPoolExecutor(max_workers=2) as executor:
            async with Worker(
                time_env.client,
                task_queue=fleet_queue,
                workflows=[FleetWorkflow],
                workflow_runner=checked_workflow_runner(),
                activities=ControlActivities(
                    sqlite_store, temporal=time_env.client, task_queue=task_queue
                ).activities(),
                activity_executor=executor,
            ):
                watcher = await time_env.client.start_workflow(
                    FleetWorkflow.run,
                    FleetInput(fleet=fleet.name),
                    id=f"fleet-{fleet.name}",
                    task_queue=fleet_queue,
                )
                await _until(
                    lambda: _released(sqlite_store, lost.id), "the terminated job's GPU released"
                )
                await _until(lambda: _is(waiter, JobStatus.RUNNING), "the waiter placed")
                await watcher.signal("delete")
                await watcher.result()
                history = await watcher.fetch_history()
        await alive.terminate()
        await waiter.terminate()

    stopped = {(s.job_id, s.attempt, s.rank) for s in hosts.stopped}
    assert stopped == {(lost.id, 1, 0), (ended, 1, 0)}
    assert allocations_of(sqlite_store, ended) == []
    assert len(allocations_of(sqlite_store, alive.id)) == 1
    row = find_job(sqlite_store, lost.id)
    assert row.status == JobStatus.TERMINATED
    assert row.termination_reason == TerminationReason.WORKFLOW_CLOSED.value
    assert row.message == "workflow terminated outside gpuflow"
    (event,) = [e for e in job_events(sqlite_store, lost.id) if e.key == "1:reconciled"]
    assert event.kind == "terminated"
    assert event.message.startswith("workflow terminated outside gpuflow: gpuflow stopped its")
    ended_row = find_job(sqlite_store, ended)
    assert (ended_row.status, ended_row.message) == (JobStatus.DONE, "all exited")
    assert find_job(sqlite_store, alive.id).status == JobStatus.RUNNING
    await _replayer().replay_workflow(history)


async def _is(handle: WorkflowHandle[Any, Any], status: JobStatus) -> bool:
    return await _status(handle) == status


async def _waiting(store: Store, job_id: str) -> bool:
    def read() -> bool:
        with store.read() as session:
            entry = session.get(QueueEntryRow, job_id)
            return entry is not None and entry.state == "waiting"

    return await asyncio.to_thread(read)


async def _released(store: Store, job_id: str) -> bool:
    return await asyncio.to_thread(lambda: allocations_of(store, job_id) == [])


async def test_a_reconciliation_that_keeps_failing_never_stops_the_health_checks(
    time_env: WorkflowEnvironment, sqlite_store: Store, task_queue: str
) -> None:
    """find_orphans broken for good (a bug, a database that refuses): each round gives it up
    after its retries, and the fleet's hosts are still pinged and recorded every round."""
    fleet = sim_fleet(sqlite_store)
    control = ControlActivities(sqlite_store)  # no admission loop here: none is woken
    health_rounds: list[HostHealthInput] = []
    broken: list[int] = []

    @activity.defn(name="find_orphans")
    async def find_orphans(inp: FleetInput) -> OrphansResult:
        broken.append(1)
        raise RuntimeError("reconciliation is broken")

    @activity.defn(name="record_host_health")
    async def record_host_health(inp: HostHealthInput) -> HostHealthResult:
        health_rounds.append(inp)
        return await control.record_host_health(inp)

    replaced = {"find_orphans": find_orphans, "record_host_health": record_host_health}
    activities = [
        replaced.get(getattr(a, "__temporal_activity_definition").name, a)
        for a in control.activities()
    ]
    fleet_queue = f"{task_queue}-fleet"
    with ThreadPoolExecutor(max_workers=2) as executor:
        async with (
            Worker(
                time_env.client,
                task_queue=fleet_queue,
                workflows=[FleetWorkflow],
                workflow_runner=checked_workflow_runner(),
                activities=activities,
                activity_executor=executor,
            ),
            Worker(
                time_env.client,
                task_queue=host_task_queue(f"{fleet.name}/h1"),
                activities=PingedHosts().activities(),
            ),
        ):
            watcher = await time_env.client.start_workflow(
                FleetWorkflow.run,
                FleetInput(fleet=fleet.name, health_interval_s=30),
                id=f"fleet-{fleet.name}-{task_queue}",
                task_queue=fleet_queue,
            )
            await time_env.sleep(timedelta(minutes=8))
            await watcher.signal("delete")
            await asyncio.wait_for(watcher.result(), 30)
    assert len(broken) > 2  # retried within a round, and tried again in later rounds
    assert len(health_rounds) >= 3
    assert all(p.answered for rounds in health_rounds for p in rounds.pings)


async def test_a_fleet_history_from_before_reconciliation_still_replays() -> None:
    """A FleetWorkflow that was running when reconciliation was added replays without it."""
    from temporalio.client import WorkflowHistory

    text = (HISTORIES / "fleet-before-reconcile.json").read_text()
    await _replayer().replay_workflow(WorkflowHistory.from_json("fleet-f", text))
