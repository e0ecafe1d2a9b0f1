"""The queue with two control workers on a real Temporal dev server, on SQLite and PostgreSQL:
both serve jobs and passes (each with its own engine and warm state, as two processes would),
and still no GPU is ever held twice and no lower-priority job jumps a higher one."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from sqlmodel import select
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from gpuflow.client import Client
from gpuflow.control.activities import ControlActivities
from gpuflow.control.api import ApiActivities
from gpuflow.control.worker import ControlWorker
from gpuflow.naming import CONTROL_TASK_QUEUE
from gpuflow.specs import JobSpec
from gpuflow.status import JobStatus
from gpuflow.store.db import Store
from gpuflow.store.tables import AllocationRow, JobEventRow, QueueEntryRow
from gpuflow.workflows import workflow_runner
from gpuflow.workflows.admission import AdmissionWorkflow
from gpuflow.workflows.api import ControlApiWorkflow
from gpuflow.workflows.fleet import FleetWorkflow
from gpuflow.workflows.job import JobWorkflow
from gpuflow.workflows.logs import LogReaderWorkflow
from tests.integration.two_workers import running, second_connection, sim_fleet

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]


class Counted(Store):
    """A second engine on the same database, counting its placement transactions."""

    transactions = 0

    @contextlib.contextmanager
    def placement_transaction(self) -> Iterator[Any]:
        self.transactions += 1
        with super().placement_transaction() as session:
            yield session


def _overlaps(store: Store, stop: threading.Event, found: list[str]) -> None:
    while not stop.wait(0.05):
        with store.read() as session:
            rows = session.exec(select(AllocationRow)).all()
        held: set[tuple[str, int]] = set()
        for row in rows:
            for index in row.gpu_indices:
                if (row.host_id, index) in held:
                    found.append(f"{row.host_id}:{index} held twice")
                held.add((row.host_id, index))


def _admitted_at(store: Store, job_id: str) -> int:
    """The order of admission: the id of the event the admitting pass wrote."""
    with store.read() as session:
        (event,) = [
            e
            for e in session.exec(select(JobEventRow).where(JobEventRow.job_id == job_id))
            if ":admitted:" in e.key
        ]
    assert event.id is not None
    return event.id


async def test_two_control_workers_admit_in_order_and_never_give_a_gpu_twice(
    dev_env: WorkflowEnvironment, store: Store, tmp_path: Path
) -> None:
    spec = sim_fleet()
    fleet = spec.name
    other = Counted(store.url).init()
    client = Client(temporal=dev_env.client)
    wait = {"on_events": ["no-capacity"], "duration": "10m"}
    found: list[str] = []
    stop = threading.Event()
    watcher = threading.Thread(target=_overlaps, args=(store, stop, found), daemon=True)
    # The second worker serves everything the first does (jobs, passes, control steps, the
    # API) but the sim hosts: the first one's in-process agents serve them (one agent a host).
    # Its own connection, as a second process has: one connection serves one worker per queue.
    connection = await second_connection(dev_env)
    second = ControlActivities(other, temporal=connection)
    api = ApiActivities(other, connection, home=tmp_path)
    try:
        async with ControlWorker(dev_env.client, store, home=tmp_path):
            await client.apply_fleet(spec)
            with ThreadPoolExecutor(max_workers=8) as executor:
                async with Worker(
                    connection,
                    task_queue=CONTROL_TASK_QUEUE,
                    workflows=[
                        JobWorkflow,
                        AdmissionWorkflow,
                        ControlApiWorkflow,
                        FleetWorkflow,
                        LogReaderWorkflow,
                    ],
                    workflow_runner=workflow_runner(),
                    activities=[*second.activities(), *api.activities()],
                    activity_executor=executor,
                ):
                    watcher.start()
                    blocker = await client.submit(
                        JobSpec.model_validate(
                            {
                                "name": "blocker",
                                "commands": ["sleep 12"],
                                "resources": {"gpu": "A100:2"},
                                "nodes": 2,
                                "fleets": [fleet],
                            }
                        )
                    )
                    await running(client, blocker.id)
                    jobs = [blocker]
                    for k in range(16):
                        priority = 0 if k < 8 else 100
                        job = JobSpec.model_validate(
                            {
                                "name": f"p{priority}-{k}",
                                "commands": ["sleep 0.5"],
                                "resources": {"gpu": "A100:1"},
                                "priority": priority,
                                "retry": wait,
                                "fleets": [fleet],
                            }
                        )
                        jobs.append(await client.submit(job))
                    blocked = (await client.get(blocker.id)).status == JobStatus.RUNNING
                    results = await asyncio.gather(
                        *(client.wait(j.id, timeout_s=180) for j in jobs)
                    )
    finally:
        stop.set()
        if watcher.is_alive():
            watcher.join()
        other.dispose()
    assert [r.status for r in results] == [JobStatus.DONE] * len(jobs)
    assert found == []
    assert other.transactions > 0  # the second worker took part
    assert blocked, "the jobs were all submitted while the fleet was full"
    admitted = {j.id: _admitted_at(store, j.id) for j in jobs[1:]}
    low = [admitted[j.id] for j in jobs[1:] if j.name.startswith("p0-")]
    high = [admitted[j.id] for j in jobs[1:] if j.name.startswith("p100-")]
    assert max(high) < min(low)  # every high-priority job was admitted before any low one
    with store.read() as session:
        assert session.exec(select(QueueEntryRow)).all() == []
        assert session.exec(select(AllocationRow)).all() == []
