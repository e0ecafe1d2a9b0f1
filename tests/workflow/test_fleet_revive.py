"""FleetWorkflow restarts the agents of silent ssh hosts, on the time-skipping server.

Seen in QA on a real sshd: an ssh host's agent is started only by provisioning, which runs after
placement, and placement takes only hosts whose agent answers. A host whose agent died (or was
never started, or whose one provisioning failed) stayed out of placement for good, while sshd
answered. The health round now starts such an agent again over SSH (the `revive_hosts`
activity), pings it once more and records that; a host that stays silent is tried again with a
growing wait, and `fleet apply` (the `refresh` signal) tries every one again at once."""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from temporalio import activity
from temporalio.client import Client, WorkflowHandle
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer, Worker

from gpuflow.payloads import DATA_CONVERTER
from gpuflow.workflows import checked_workflow_runner
from gpuflow.workflows.fleet import FleetWorkflow
from gpuflow.workflows.models import (
    FleetHost,
    FleetHostsResult,
    FleetInput,
    HostHealthInput,
    HostHealthResult,
    HostPing,
    OrphansResult,
    Revival,
    ReviveInput,
    ReviveResult,
)
from gpuflow.workflows.revivals import REVIVE_BACKOFF_MAX, after_round, backoff, due

pytestmark = pytest.mark.asyncio(loop_scope="session")

BOX, LOCAL = "f/box", "f/local"


class SshFleet:
    """Fleet `f`: `box`, an ssh host whose agent answers only once `revive_hosts` started it
    (or never, when `starts` is False), and `local`, a host without SSH whose agent never
    answers (nothing in the control plane may start it)."""

    def __init__(self, task_queue: str, *, starts: bool = True) -> None:
        self.hosts = [
            FleetHost(host_id=BOX, name="box", task_queue=f"{task_queue}-box", ssh=True),
            FleetHost(host_id=LOCAL, name="local", task_queue=f"{task_queue}-local"),
        ]
        self.starts = starts
        self.agent_up = False
        self.revived: list[tuple[datetime, list[str]]] = []
        """When `revive_hosts` was scheduled (workflow time), and for which hosts."""
        self.rounds: list[dict[str, bool]] = []
        """What each `record_host_health` heard, by host id."""

    def control(self) -> list[Any]:
        @activity.defn(name="fleet_hosts")
        async def fleet_hosts(inp: FleetInput) -> FleetHostsResult:
            return FleetHostsResult(hosts=self.hosts)

        @activity.defn(name="revive_hosts")
        async def revive_hosts(inp: ReviveInput) -> ReviveResult:
            self.revived.append((activity.info().scheduled_time, list(inp.host_ids)))
            if not self.starts:
                return ReviveResult(unreachable=list(inp.host_ids))
            self.agent_up = True
            return ReviveResult(revived=list(inp.host_ids))

        @activity.defn(name="record_host_health")
        async def record_host_health(inp: HostHealthInput) -> HostHealthResult:
            self.rounds.append({ping.host_id: ping.answered for ping in inp.pings})
            return HostHealthResult()

        @activity.defn(name="find_orphans")
        async def find_orphans(inp: FleetInput) -> OrphansResult:
            return OrphansResult()

        return [fleet_hosts, revive_hosts, record_host_health, find_orphans]

    def box_agent(self) -> Any:
        @activity.defn(name="ping_host")
        async def ping_host() -> str:
            if not self.agent_up:  # no agent polls: here it fails at once instead of timing out
                raise ApplicationError("no agent", non_retryable=True)
            return "pong"

        return ping_host


@activity.defn(name="ping_host")
async def silent_ping() -> str:
    raise ApplicationError("no agent", non_retryable=True)


async def _run(
    env: WorkflowEnvironment,
    task_queue: str,
    fleet: SshFleet,
    inp: FleetInput,
    until: Callable[[], bool],
    then: Callable[[WorkflowHandle[Any, Any]], Any] | None = None,
) -> WorkflowHandle[Any, Any]:
    client: Client = env.client
    async with (
        Worker(
            client,
            task_queue=task_queue,
            workflows=[FleetWorkflow],
            workflow_runner=checked_workflow_runner(),
            activities=fleet.control(),
        ),
        Worker(client, task_queue=f"{task_queue}-box", activities=[fleet.box_agent()]),
        Worker(client, task_queue=f"{task_queue}-local", activities=[silent_ping]),
    ):
        handle = await client.start_workflow(
            FleetWorkflow.run,
            inp,
            id=f"fleet-f-{uuid.uuid4().hex[:6]}",
            task_queue=task_queue,
            execution_timeout=timedelta(hours=2),
        )
        deadline = asyncio.get_running_loop().time() + 60
        while not until():
            assert asyncio.get_running_loop().time() < deadline, fleet.rounds[-3:]
            await env.sleep(1)
        if then is not None:
            await then(handle)
        await handle.signal(FleetWorkflow.delete)
        await handle.result()
    return handle


async def test_a_silent_ssh_agent_is_started_again_and_answers_in_the_same_round(
    time_env: WorkflowEnvironment, task_queue: str
) -> None:
    fleet = SshFleet(task_queue)
    handle = await _run(
        time_env,
        task_queue,
        fleet,
        FleetInput(fleet="f", health_interval_s=1),
        until=lambda: len(fleet.rounds) >= 3,
    )
    # the first round already records box as answering: it never looked not ready
    assert [r[BOX] for r in fleet.rounds] == [True] * len(fleet.rounds)
    assert not any(r[LOCAL] for r in fleet.rounds)
    # started once, box only: a host without SSH is not the control plane's to start
    assert [hosts for _, hosts in fleet.revived] == [[BOX]]
    # the history with the new steps replays
    history = await handle.fetch_history()
    replayer = Replayer(
        workflows=[FleetWorkflow],
        data_converter=DATA_CONVERTER,
        workflow_runner=checked_workflow_runner(),
    )
    await replayer.replay_workflow(history)


async def test_an_unreachable_ssh_host_is_retried_with_a_growing_wait(
    time_env: WorkflowEnvironment, task_queue: str
) -> None:
    fleet = SshFleet(task_queue, starts=False)
    await _run(
        time_env,
        task_queue,
        fleet,
        FleetInput(fleet="f", health_interval_s=1),
        until=lambda: len(fleet.revived) >= 5,
    )
    assert all(not r[BOX] for r in fleet.rounds)
    times = [at for at, _ in fleet.revived]
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(times)]
    # one interval after the first try, then twice as long each time (a round may come late
    # by a round's length, never early)
    assert all(2**i <= gap < 2**i + 2 for i, gap in enumerate(gaps)), gaps
    # far fewer tries than rounds: the host is not logged into every round
    assert len(fleet.rounds) >= 2 ** (len(gaps)) - 1


async def test_backoff_is_carried_into_a_new_run_and_cleared_by_a_refresh(
    time_env: WorkflowEnvironment, task_queue: str
) -> None:
    """A run that continues as new hands on its backoff (FleetInput.revivals); `fleet apply`
    (the refresh signal) tries every silent host again at once."""
    fleet = SshFleet(task_queue)
    later = datetime.now(UTC) + timedelta(days=365)
    rounds_before_refresh: list[int] = []

    async def refresh(handle: WorkflowHandle[Any, Any]) -> None:
        assert fleet.revived == []  # still waiting for its backoff
        rounds_before_refresh.append(len(fleet.rounds))
        await handle.signal(FleetWorkflow.refresh)
        deadline = asyncio.get_running_loop().time() + 60
        while not fleet.revived or len(fleet.rounds) <= rounds_before_refresh[0]:
            assert asyncio.get_running_loop().time() < deadline
            await time_env.sleep(1)

    await _run(
        time_env,
        task_queue,
        fleet,
        FleetInput(
            fleet="f",
            health_interval_s=1,
            revivals={BOX: Revival(tries=4, next_at=later)},
        ),
        until=lambda: len(fleet.rounds) >= 3,
        then=refresh,
    )
    assert not any(r[BOX] for r in fleet.rounds[:3])
    assert [hosts for _, hosts in fleet.revived] == [[BOX]]
    assert fleet.rounds[-1][BOX] is True


async def test_which_hosts_are_due_and_how_long_they_wait() -> None:
    now = datetime(2025, 1, 1, tzinfo=UTC)
    hosts = [
        FleetHost(host_id=BOX, name="box", task_queue="q", ssh=True),
        FleetHost(host_id="f/up", name="up", task_queue="q", ssh=True),
        FleetHost(host_id=LOCAL, name="local", task_queue="q"),
        FleetHost(host_id="f/later", name="later", task_queue="q", ssh=True),
    ]
    pings = [
        HostPing(host_id=BOX, answered=False),
        HostPing(host_id="f/up", answered=True),
        HostPing(host_id=LOCAL, answered=False),
        HostPing(host_id="f/later", answered=False),
    ]
    waits = {"f/later": Revival(tries=2, next_at=now + timedelta(seconds=1))}
    assert [h.host_id for h in due(hosts, pings, waits, now)] == [BOX]
    interval = timedelta(seconds=30)
    kept = after_round(
        {**waits, "f/up": Revival(tries=1, next_at=now), "f/gone": Revival(tries=1, next_at=now)},
        hosts=hosts,
        pings=pings,
        tried=[BOX],
        now=now,
        interval=interval,
    )
    # box waits one interval; later keeps its wait; the host that answered and the one that
    # left the fleet are forgotten
    assert kept == {
        "f/later": waits["f/later"],
        BOX: Revival(tries=1, next_at=now + interval),
    }
    assert [backoff(n, interval).total_seconds() for n in (1, 2, 3, 4, 5, 6, 50)] == [
        30,
        60,
        120,
        240,
        480,
        REVIVE_BACKOFF_MAX.total_seconds(),
        REVIVE_BACKOFF_MAX.total_seconds(),
    ]
