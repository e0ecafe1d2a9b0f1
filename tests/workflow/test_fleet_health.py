"""FleetWorkflow's health rounds at fleet scale, on the time-skipping server: a fleet of more
hosts than Temporal lets one workflow keep activities pending (2,000) is pinged in batches, and
a run whose history grows long continues as new before Temporal would terminate it (51,200
events; a round adds three events per host)."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import uuid
from collections.abc import AsyncIterator, Iterable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHistory
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer, Worker

from gpuflow.payloads import DATA_CONVERTER
from gpuflow.workflows import checked_workflow_runner
from gpuflow.workflows import fleet as fleet_module
from gpuflow.workflows.fleet import EVENTS_PER_RUN, PINGS_AT_ONCE, FleetWorkflow
from gpuflow.workflows.models import (
    FleetHost,
    FleetHostsResult,
    FleetInput,
    HostHealthInput,
    HostHealthResult,
    OrphansResult,
)

pytestmark = pytest.mark.asyncio(loop_scope="session")

HISTORIES = Path(__file__).parent / "histories"

HOSTS = 2 * PINGS_AT_ONCE + 201
"""Three batches, and a round of over 3,600 events (three per ping)."""


class BigFleet:
    """A fleet of HOSTS hosts whose agents all answer on one task queue."""

    def __init__(self, hosts_queue: str) -> None:
        self.hosts = [
            FleetHost(host_id=f"big/h{i:04d}", name=f"h{i:04d}", task_queue=hosts_queue)
            for i in range(HOSTS)
        ]
        self.rounds: list[list[str]] = []
        """The hosts each `record_host_health` heard of, in order."""

    def control(self) -> list[Any]:
        @activity.defn(name="fleet_hosts")
        async def fleet_hosts(inp: FleetInput) -> FleetHostsResult:
            return FleetHostsResult(hosts=self.hosts)

        @activity.defn(name="record_host_health")
        async def record_host_health(inp: HostHealthInput) -> HostHealthResult:
            assert all(ping.answered for ping in inp.pings)
            self.rounds.append([ping.host_id for ping in inp.pings])
            return HostHealthResult()

        @activity.defn(name="find_orphans")
        async def find_orphans(inp: FleetInput) -> OrphansResult:
            return OrphansResult()

        return [fleet_hosts, record_host_health, find_orphans]


@activity.defn(name="ping_host")
async def ping_host() -> str:
    return "pong"


@contextlib.asynccontextmanager
async def fleet_workers(
    client: Client, task_queue: str, control: list[Any], hosts: list[Any]
) -> AsyncIterator[None]:
    """A worker of FleetWorkflow with these control activities, and one of these host
    activities on the hosts' task queue (`<task_queue>-hosts`)."""
    async with (
        Worker(
            client,
            task_queue=task_queue,
            workflows=[FleetWorkflow],
            workflow_runner=checked_workflow_runner(),
            activities=control,
        ),
        Worker(
            client,
            task_queue=f"{task_queue}-hosts",
            activities=hosts,
            max_concurrent_activities=1000,
        ),
    ):
        yield


def most_pings_pending(history: WorkflowHistory, activity_type: str = "ping_host") -> int:
    """The most activities of this type scheduled and not yet closed at any point of the
    history."""
    scheduled: set[int] = set()
    most = 0
    for event in history.events:
        if _is_ping(event, activity_type):
            scheduled.add(event.event_id)
            most = max(most, len(scheduled))
        for closed in _closed(event):
            scheduled.discard(closed)
    return most


def _closed(event: Any) -> Iterable[int]:
    for field in (
        "activity_task_completed_event_attributes",
        "activity_task_failed_event_attributes",
        "activity_task_timed_out_event_attributes",
        "activity_task_canceled_event_attributes",
    ):
        if event.HasField(field):
            yield getattr(event, field).scheduled_event_id


async def test_a_big_fleet_is_pinged_in_batches_and_its_runs_stay_short(
    time_env: WorkflowEnvironment, task_queue: str
) -> None:
    fleet = BigFleet(f"{task_queue}-hosts")
    client = time_env.client
    async with fleet_workers(client, task_queue, fleet.control(), [ping_host]):
        handle = await client.start_workflow(
            FleetWorkflow.run,
            FleetInput(fleet="big", health_interval_s=1),
            id=f"fleet-big-{uuid.uuid4().hex[:6]}",
            task_queue=task_queue,
            execution_timeout=timedelta(hours=1),
        )
        first = client.get_workflow_handle(handle.id, run_id=handle.first_execution_run_id)
        deadline = asyncio.get_running_loop().time() + 120
        while len(fleet.rounds) < 4:
            assert asyncio.get_running_loop().time() < deadline, f"{len(fleet.rounds)} rounds"
            await time_env.sleep(1)
        await handle.signal(FleetWorkflow.delete)
        described = await first.describe()
        history = await first.fetch_history()

    # every host, in order, in every round
    assert all(heard == [host.host_id for host in fleet.hosts] for heard in fleet.rounds)
    # never more pings pending than a batch, and more than one batch's worth of hosts
    assert most_pings_pending(history) == PINGS_AT_ONCE
    # the first run continued as new once its history was long (when the server suggested
    # it, or at EVENTS_PER_RUN), not after 100 rounds of some 3,600 events each
    assert described.status == WorkflowExecutionStatus.CONTINUED_AS_NEW
    assert 3 * HOSTS < len(history.events) < EVENTS_PER_RUN + 4 * HOSTS


async def test_a_run_recorded_before_batches_replays() -> None:
    """fleet-unbatched.json.gz: three hosts pinged all at once for two rounds, then deleted,
    recorded at b980425 (before BOUNDED_PATCH); it replays on the current workflow."""
    recorded = gzip.decompress((HISTORIES / "fleet-unbatched.json.gz").read_bytes()).decode()
    history = WorkflowHistory.from_json("fleet-f", recorded)
    assert sum(_is_ping(event) for event in history.events) == 6
    replayer = Replayer(
        workflows=[FleetWorkflow],
        data_converter=DATA_CONVERTER,
        workflow_runner=checked_workflow_runner(),
    )
    await replayer.replay_workflow(history)


def _is_ping(event: Any, activity_type: str = "ping_host") -> bool:
    return (
        event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and event.activity_task_scheduled_event_attributes.activity_type.name == activity_type
    )


class _Info:
    def __init__(self, length: int, suggested: bool) -> None:
        self.length, self.suggested = length, suggested

    def is_continue_as_new_suggested(self) -> bool:
        return self.suggested

    def get_current_history_length(self) -> int:
        return self.length


@pytest.mark.parametrize(
    ("length", "suggested", "full"),
    [
        (EVENTS_PER_RUN - 1, False, False),
        (EVENTS_PER_RUN, False, True),  # a server that never suggests it
        (100, True, True),
    ],
)
async def test_a_run_is_full_at_events_per_run_or_when_the_server_says(
    monkeypatch: pytest.MonkeyPatch, length: int, suggested: bool, full: bool
) -> None:
    monkeypatch.setattr(fleet_module.workflow, "info", lambda: _Info(length, suggested))
    assert fleet_module._history_full() is full
