"""FleetWorkflow's reconciliation of many orphans, on the time-skipping server: a step stops at
most the nodes `find_orphans` answers (control/reconcile.py ORPHAN_NODES_PER_STEP), and while it
says it left some out (`more`), the next step follows in the same round. Before, every orphan
of the fleet was stopped at once: past 2,000 nodes each workflow task failed (Temporal's limit
of pending activities) and the fleet's health checks stopped with it."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta
from typing import Any

import pytest
from temporalio import activity
from temporalio.testing import WorkflowEnvironment

from gpuflow.workflows.fleet import FleetWorkflow
from gpuflow.workflows.models import (
    FleetHost,
    FleetHostsResult,
    FleetInput,
    HostHealthInput,
    HostHealthResult,
    Orphan,
    OrphanNode,
    OrphansResult,
    ReleaseOrphansInput,
    ReleaseResult,
    StopProcessInput,
    StopProcessResult,
)
from tests.workflow.test_fleet_health import fleet_workers, most_pings_pending

pytestmark = pytest.mark.asyncio(loop_scope="session")

STEP = 20
"""Nodes a step stops (500 in the product: control/reconcile.py `ORPHAN_NODES_PER_STEP`; a few
here, as the workflow stops whatever a step answers)."""
ORPHANS = STEP + 5  # two-node orphans: three steps


class ManyOrphans:
    """A fleet of one host whose control side found ORPHANS two-node orphans, answered a step
    of STEP nodes at a time, as control/reconcile.py `find_orphans` answers."""

    def __init__(self, hosts_queue: str) -> None:
        self.hosts_queue = hosts_queue
        self.left = [
            Orphan(
                job_id=f"job-o{i:04d}-abcdef",
                attempt=1,
                nodes=[
                    OrphanNode(rank=r, host_name=f"h{r}", task_queue=hosts_queue) for r in (0, 1)
                ],
                message="ended",
                job_ended=True,
            )
            for i in range(ORPHANS)
        ]
        self.finds = 0
        self.steps: list[int] = []
        """Orphans each `release_orphans` released."""
        self.stopped: list[StopProcessInput] = []

    def control(self) -> list[Any]:
        @activity.defn(name="fleet_hosts")
        async def fleet_hosts(inp: FleetInput) -> FleetHostsResult:
            host = FleetHost(host_id="f/h0", name="h0", task_queue=self.hosts_queue)
            return FleetHostsResult(hosts=[host])

        @activity.defn(name="record_host_health")
        async def record_host_health(inp: HostHealthInput) -> HostHealthResult:
            return HostHealthResult()

        @activity.defn(name="find_orphans")
        async def find_orphans(inp: FleetInput) -> OrphansResult:
            self.finds += 1
            step = self.left[: STEP // 2]
            more = len(self.left) > len(step)
            return OrphansResult(orphans=step, checked=len(self.left), more=more)

        @activity.defn(name="release_orphans")
        async def release_orphans(inp: ReleaseOrphansInput) -> ReleaseResult:
            gone = {o.job_id for o in inp.orphans}
            self.left = [o for o in self.left if o.job_id not in gone]
            self.steps.append(len(inp.orphans))
            return ReleaseResult(released_nodes=2 * len(inp.orphans))

        return [fleet_hosts, record_host_health, find_orphans, release_orphans]

    def hosts(self) -> list[Any]:
        @activity.defn(name="ping_host")
        async def ping_host() -> str:
            return "pong"

        @activity.defn(name="stop_process")
        async def stop_process(inp: StopProcessInput) -> StopProcessResult:
            self.stopped.append(inp)
            return StopProcessResult(was_running=True, signal="TERM")

        return [ping_host, stop_process]


async def test_many_orphans_are_stopped_a_step_at_a_time_in_one_round(
    time_env: WorkflowEnvironment, task_queue: str
) -> None:
    fleet = ManyOrphans(f"{task_queue}-hosts")
    client = time_env.client
    async with fleet_workers(client, task_queue, fleet.control(), fleet.hosts()):
        handle = await client.start_workflow(
            FleetWorkflow.run,
            FleetInput(fleet="f", health_interval_s=3600),  # one round in this test
            id=f"fleet-f-{uuid.uuid4().hex[:6]}",
            task_queue=task_queue,
            execution_timeout=timedelta(hours=1),
        )
        deadline = asyncio.get_running_loop().time() + 60
        while fleet.left:
            assert asyncio.get_running_loop().time() < deadline, f"{len(fleet.left)} left"
            await asyncio.sleep(0.2)
        history = await handle.fetch_history()
        await handle.signal(FleetWorkflow.delete)

    assert fleet.steps == [STEP // 2, STEP // 2, ORPHANS - STEP]  # in one round
    assert fleet.finds == 3
    assert len(fleet.stopped) == 2 * ORPHANS
    assert most_pings_pending(history, "stop_process") == STEP
