"""Jobs in queues on the time-skipping server: admission order, quota, preemption and requeue,
leaving a queue, and replay of what was recorded (DESIGN.md, "Queues and admission").

A test in which a waiting job can be told something keeps the server's clock at real pace
(`auto_time_skipping_disabled`) and ends its running jobs through their probes, never by
skipping time: the time-skipping server strands a job whose workflow task cancels its `wait
for admission` timer when a skip fired that timer while the task was with the worker
(temporalio/sdk-java#3088), and the test would hang to its timeout."""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from temporalio import activity
from temporalio.client import WorkflowHandle, WorkflowHistory
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer

from gpuflow.errors import NotFoundError
from gpuflow.payloads import DATA_CONVERTER
from gpuflow.services.capacity import allocations_of
from gpuflow.services.jobs import find_job, job_events
from gpuflow.services.queue_entries import set_priority_in
from gpuflow.services.queues import apply_queue
from gpuflow.specs.fleet import FleetSpec
from gpuflow.specs.queue import QueueSpec
from gpuflow.status import JobStatus, TerminationReason
from gpuflow.store.db import Store
from gpuflow.store.tables import QueueEntryRow
from gpuflow.workflows import checked_workflow_runner
from gpuflow.workflows.admission import AdmissionWorkflow
from gpuflow.workflows.job import JobWorkflow
from gpuflow.workflows.models import ProbeInput, ProbeResult
from gpuflow.workflows.outcome import job_result
from gpuflow.workflows.queue_models import admission_workflow_id
from tests.workflow.harness import ScriptedHosts, job, sim_fleet, start_job, workers

HISTORIES = Path(__file__).parent / "histories"
ONE_GPU = [{"name": "h1", "gpus": [{"name": "A100", "memory": "80GB", "count": 1}]}]
WAIT = {"on_events": ["no-capacity"], "duration": "1h"}


def _until_ended(ended: set[str]) -> Any:
    """A probe: a job runs until the test puts its name in `ended` (then exits 0)."""

    def probe(inp: ProbeInput, n: int) -> ProbeResult:
        name = inp.job_id.split("-")[1]
        if name in ended or f"{name}@{inp.attempt}" in ended:
            return ProbeResult(state="exited", exit_code=0)
        return ProbeResult(state="running")

    return probe


class _WallClockHosts(ScriptedHosts):
    """Scripted hosts whose probes wait on the agent for an exit as an agent's long poll does,
    in wall time: a job runs until the test puts its name (or `name@attempt`) in `ended`, and
    its probe answers within moments of that, with no timer or skip of the server's clock in
    between. For tests that keep the clock at real pace, where a tick lasts its minutes."""

    def __init__(self) -> None:
        self.ended: set[str] = set()
        super().__init__(probe=_until_ended(self.ended))

    def activities(self) -> list[Any]:
        @activity.defn(name="probe_process")
        async def probe_process(inp: ProbeInput) -> ProbeResult:
            key = (inp.job_id, inp.attempt, inp.rank)
            self.probes[key] = self.probes.get(key, 0) + 1
            loop = asyncio.get_running_loop()
            deadline = loop.time() + inp.wait_s
            while True:
                answer = self.probe(inp, self.probes[key])
                if answer.state != "running" or loop.time() >= deadline:
                    return answer
                # A probe cancelled by a stop or a preemption learns it at its next heartbeat.
                activity.heartbeat()
                await asyncio.sleep(0.05)

        scripted = [a for a in super().activities() if a.__name__ != "probe_process"]
        return [*scripted, probe_process]


@asynccontextmanager
async def real_pace(
    env: WorkflowEnvironment, store: Store, task_queue: str, fleet: FleetSpec
) -> AsyncIterator[_WallClockHosts]:
    """The workers on `fleet`'s sim hosts, whose jobs run until the test ends them
    (`hosts.ended`), with the server's clock at real pace (see the module docstring)."""
    hosts = _WallClockHosts()
    with env.auto_time_skipping_disabled():
        async with workers(env.client, store, task_queue, hosts, [fleet]):
            yield hosts


async def _entry(store: Store, job_id: str) -> QueueEntryRow | None:
    def read() -> QueueEntryRow | None:
        with store.read() as session:
            return session.get(QueueEntryRow, job_id)

    return await asyncio.to_thread(read)


async def _until(check: Any, what: str, timeout: float = 30) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not await check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"never: {what}")
        await asyncio.sleep(0.05)


async def _waits(store: Store, handle: WorkflowHandle[Any, Any], reason: str | None = None) -> None:
    async def check() -> bool:
        entry = await _entry(store, handle.id)
        return (
            entry is not None
            and entry.state == "waiting"
            and (reason is None or entry.reason == reason)
        )

    await _until(check, f"{handle.id} waits ({reason or 'any reason'})")


async def _runs(store: Store, handle: WorkflowHandle[Any, Any]) -> None:
    def status() -> str | None:
        try:
            return find_job(store, handle.id).status
        except NotFoundError:  # its first record is not written yet
            return None

    async def check() -> bool:
        return await asyncio.to_thread(status) == JobStatus.RUNNING

    await _until(check, f"{handle.id} runs")


def _replayer() -> Replayer:
    return Replayer(
        workflows=[JobWorkflow, AdmissionWorkflow],
        data_converter=DATA_CONVERTER,
        workflow_runner=checked_workflow_runner(),
    )


async def test_a_freed_gpu_goes_to_the_highest_priority_then_the_earliest(
    time_env: WorkflowEnvironment, sqlite_store: Store, task_queue: str
) -> None:
    fleet = sim_fleet(sqlite_store, hosts=ONE_GPU)
    client = time_env.client
    async with real_pace(time_env, sqlite_store, task_queue, fleet) as hosts:
        blocker = await start_job(client, task_queue, job("blocker"))
        await _runs(sqlite_store, blocker)
        low1 = await start_job(client, task_queue, job("lowa", retry=WAIT))
        await _waits(sqlite_store, low1, "no_capacity")
        low2 = await start_job(client, task_queue, job("lowb", retry=WAIT))
        high = await start_job(client, task_queue, job("high", priority=100, retry=WAIT))
        await _waits(sqlite_store, low2)
        await _waits(sqlite_store, high)

        async def positions() -> list[int | None]:
            entries = [await _entry(sqlite_store, h.id) for h in (high, low1, low2)]
            return [e.position if e is not None else None for e in entries]

        async def ordered() -> bool:  # once a pass has seen all three
            return await positions() == [0, 1, 2]

        await _until(ordered, "the waiting jobs ordered high, then by submission")
        hosts.ended.update({"blocker", "high", "lowa", "lowb"})
        results = [await job_result(h) for h in (blocker, high, low1, low2)]
        admission = client.get_workflow_handle(admission_workflow_id(task_queue))
        admission_history = await admission.fetch_history()
    assert [r.status for r in results] == [JobStatus.DONE] * 4
    started = [s.job_id for s in hosts.started]
    assert started == [blocker.id, high.id, low1.id, low2.id]
    for handle in (blocker, high, low1, low2):
        assert allocations_of(sqlite_store, handle.id) == []
        assert await _entry(sqlite_store, handle.id) is None
    # Waiting cost nothing: no job was woken by a broadcast, and each was told once.
    history = await high.fetch_history()
    signals = [
        e.workflow_execution_signaled_event_attributes.signal_name
        for e in history.events
        if e.HasField("workflow_execution_signaled_event_attributes")
    ]
    assert "capacity_changed" not in signals and signals.count("admitted") == 1
    await _replayer().replay_workflow(history)
    await _replayer().replay_workflow(admission_history)


async def test_quota_holds_a_job_until_its_queue_has_room(
    time_env: WorkflowEnvironment, sqlite_store: Store, task_queue: str
) -> None:
    fleet = sim_fleet(sqlite_store)  # two GPUs
    apply_queue(sqlite_store, QueueSpec(name="small", gpus=1))
    client = time_env.client
    async with real_pace(time_env, sqlite_store, task_queue, fleet) as hosts:
        first = await start_job(client, task_queue, job("first", queue="small"))
        await _runs(sqlite_store, first)
        second = await start_job(client, task_queue, job("second", queue="small", retry=WAIT))
        await _waits(sqlite_store, second, "quota")
        other = await start_job(client, task_queue, job("other"))  # default queue
        await _runs(sqlite_store, other)
        assert len(hosts.started) == 2  # the free GPU went to another queue, not over quota
        hosts.ended.update({"first", "second", "other"})
        results = [await job_result(h) for h in (first, second, other)]
    assert [r.status for r in results] == [JobStatus.DONE] * 3
    assert [s.job_id for s in hosts.started] == [first.id, other.id, second.id]


async def test_a_job_that_may_not_wait_is_refused_over_quota_with_the_reason(
    time_env: WorkflowEnvironment, sqlite_store: Store, task_queue: str
) -> None:
    fleet = sim_fleet(sqlite_store)
    apply_queue(sqlite_store, QueueSpec(name="none", gpus=0))
    async with workers(time_env.client, sqlite_store, task_queue, ScriptedHosts(), [fleet]):
        result = await job_result(
            await start_job(time_env.client, task_queue, job("late", queue="none"))
        )
    assert (result.status, result.reason) == (JobStatus.FAILED, TerminationReason.NO_CAPACITY)
    assert "queue none can never admit it: it asks 1 GPU(s) of A100" in result.message
    assert await _entry(sqlite_store, result.job_id) is None


@pytest.mark.parametrize("events", [["interruption", "no-capacity"], ["interruption"]])
async def test_a_preemptible_job_is_stopped_for_a_higher_priority_one_and_requeued(
    time_env: WorkflowEnvironment, sqlite_store: Store, task_queue: str, events: list[str]
) -> None:
    """`retry` on `interruption` requeues a preempted job (README): its next attempt waits in
    its queue whether or not its retry covers no-capacity (without it, the attempt was
    refused by the first pass in the same second: the preemptor holds the GPUs it freed)."""
    fleet = sim_fleet(sqlite_store, hosts=ONE_GPU)
    requeue = {"on_events": events, "duration": "1h"}
    client = time_env.client
    async with real_pace(time_env, sqlite_store, task_queue, fleet) as hosts:
        victim = await start_job(client, task_queue, job("victim", preemptible=True, retry=requeue))
        await _runs(sqlite_store, victim)
        boss = await start_job(client, task_queue, job("boss", priority=100, retry=WAIT))
        await _runs(sqlite_store, boss)
        await _waits(sqlite_store, victim)  # its second attempt waits behind the boss
        hosts.ended.update({"boss", "victim@2"})
        boss_result = await job_result(boss)
        victim_result = await job_result(victim)
        history = await victim.fetch_history()
    assert boss_result.status == JobStatus.DONE
    assert (victim_result.status, victim_result.attempts) == (JobStatus.DONE, 2)
    assert [(s.job_id, s.attempt) for s in hosts.started] == [
        (victim.id, 1),
        (boss.id, 1),
        (victim.id, 2),
    ]
    assert (victim.id, 1, 0) in {(s.job_id, s.attempt, s.rank) for s in hosts.stopped}
    assert any(
        e.kind == "terminated" and f"preempted for {boss.id}" in e.message
        for e in job_events(sqlite_store, victim.id)
    )
    await _replayer().replay_workflow(history)


async def test_nothing_that_is_not_preemptible_is_preempted(
    time_env: WorkflowEnvironment, sqlite_store: Store, task_queue: str
) -> None:
    fleet = sim_fleet(sqlite_store, hosts=ONE_GPU)
    client = time_env.client
    async with real_pace(time_env, sqlite_store, task_queue, fleet) as hosts:
        keeper = await start_job(client, task_queue, job("keeper"))
        await _runs(sqlite_store, keeper)
        boss = await start_job(client, task_queue, job("boss", priority=100, retry=WAIT))
        await _waits(sqlite_store, boss, "no_capacity")
        assert hosts.stopped == []
        hosts.ended.update({"keeper", "boss"})
        results = [await job_result(h) for h in (keeper, boss)]
    assert [(r.status, r.attempts) for r in results] == [(JobStatus.DONE, 1)] * 2


async def test_a_priority_set_while_it_runs_holds_off_preemption_and_survives_a_requeue(
    time_env: WorkflowEnvironment, sqlite_store: Store, task_queue: str
) -> None:
    """`gpuflow set-priority`: the API signals the job's workflow and changes its entry. Raised
    from 0 to 60, a running preemptible job is not preempted for a job of priority 50; one of
    100 still preempts it, and its second attempt enters the queue at 60, so it starts before
    the job of 50 that waited longer. A value that is not a priority changes nothing."""
    fleet = sim_fleet(sqlite_store, hosts=ONE_GPU)
    requeue = {"on_events": ["interruption", "no-capacity"], "duration": "1h"}
    client = time_env.client
    async with real_pace(time_env, sqlite_store, task_queue, fleet) as hosts:
        victim = await start_job(client, task_queue, job("victim", preemptible=True, retry=requeue))
        await _runs(sqlite_store, victim)
        await victim.signal("set_priority", 60)  # what the API's set_priority does
        await victim.signal("set_priority", 500)  # not a priority (sent from outside): ignored
        with sqlite_store.placement_transaction() as session:
            assert set_priority_in(session, job_id=victim.id, priority=60)
        mid = await start_job(client, task_queue, job("mid", priority=50, retry=WAIT))
        await _waits(sqlite_store, mid, "no_capacity")
        assert hosts.stopped == []
        boss = await start_job(client, task_queue, job("boss", priority=100, retry=WAIT))
        await _runs(sqlite_store, boss)
        await _waits(sqlite_store, victim)  # its second attempt

        async def second_at_60() -> bool:
            entry = await _entry(sqlite_store, victim.id)
            return entry is not None and (entry.attempt, entry.priority) == (2, 60)

        await _until(second_at_60, "the second attempt waits at priority 60")
        hosts.ended.add("boss")
        await _runs(sqlite_store, victim)
        hosts.ended.update({"victim@2", "mid"})
        results = [await job_result(h) for h in (victim, mid, boss)]
        history = await victim.fetch_history()
    assert [r.status for r in results] == [JobStatus.DONE] * 3
    assert [(s.job_id, s.attempt) for s in hosts.started] == [
        (victim.id, 1),
        (boss.id, 1),
        (victim.id, 2),
        (mid.id, 1),
    ]
    await _replayer().replay_workflow(history)


async def test_a_job_stopped_while_it_waits_leaves_its_queue(
    time_env: WorkflowEnvironment, sqlite_store: Store, task_queue: str
) -> None:
    fleet = sim_fleet(sqlite_store, hosts=ONE_GPU)
    client = time_env.client
    async with real_pace(time_env, sqlite_store, task_queue, fleet) as hosts:
        blocker = await start_job(client, task_queue, job("blocker"))
        await _runs(sqlite_store, blocker)
        waiter = await start_job(client, task_queue, job("waiter", retry=WAIT))
        await _waits(sqlite_store, waiter)
        await waiter.signal("stop")
        stopped = await job_result(waiter)
        assert await _entry(sqlite_store, waiter.id) is None
        hosts.ended.add("blocker")
        await job_result(blocker)
    assert (stopped.status, stopped.reason) == (
        JobStatus.STOPPED,
        TerminationReason.STOPPED_BY_USER,
    )
    assert [s.job_id for s in hosts.started] == [blocker.id]
    assert allocations_of(sqlite_store, waiter.id) == []


@pytest.mark.parametrize("name", ["schedule-no-attributes", "schedule-no-queue-attribute"])
async def test_schedule_runs_from_before_the_queue_attribute_replay(name: str) -> None:
    """Runs of a Temporal Schedule as the job workflow ran them before it set a missing
    `GpuflowQueue` itself (recorded at 1bc996b on the dev server: a sim fleet of 2 GPUs, a job
    of queue `nightly` that exits at its start): started with no search attribute, and with the
    status and priority that `gpuflow schedule` gave its runs before queues. A run that was
    under way when the new version was deployed goes on with it."""
    data = gzip.decompress((HISTORIES / f"{name}.json.gz").read_bytes()).decode()
    await _replayer().replay_workflow(WorkflowHistory.from_json(f"job-{name}", data))
