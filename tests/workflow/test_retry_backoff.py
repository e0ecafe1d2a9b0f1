"""Another attempt after a failure waits first (job_state.py `retry_backoff`), on the
time-skipping server: a command that fails at once is not restarted in a hot loop, a stop
during the wait ends the job, and a deadline the wait would pass ends it at once."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHistory
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer

from gpuflow.errors import NotFoundError
from gpuflow.payloads import DATA_CONVERTER
from gpuflow.services.capacity import allocations_of
from gpuflow.services.jobs import find_job
from gpuflow.status import JobStatus, TerminationReason
from gpuflow.store.db import Store
from gpuflow.workflows import checked_workflow_runner
from gpuflow.workflows.job import JobWorkflow
from gpuflow.workflows.models import ProbeResult
from gpuflow.workflows.outcome import job_result
from tests.workflow.harness import ScriptedHosts, job, sim_fleet, start_job, workers

pytestmark = pytest.mark.asyncio(loop_scope="session")


def _fails(inp: object, n: int) -> ProbeResult:
    return ProbeResult(state="exited", exit_code=3)


def _retry_waits(history: WorkflowHistory) -> list[float]:
    """The seconds of each `wait to retry` timer, in order."""
    waits = []
    for event in history.events:
        if event.event_type != EventType.EVENT_TYPE_TIMER_STARTED:
            continue
        summary = event.user_metadata.summary.data.decode()
        if "wait to retry" in summary:
            waits.append(event.timer_started_event_attributes.start_to_fire_timeout.seconds)
    return waits


async def test_a_failing_command_waits_longer_before_each_attempt(
    time_env: WorkflowEnvironment, sqlite_store: Store, task_queue: str
) -> None:
    fleet = sim_fleet(sqlite_store)
    hosts = ScriptedHosts(probe=_fails)
    spec = job(retry={"on_events": ["error"], "max_attempts": 4, "duration": "1h"})
    async with workers(time_env.client, sqlite_store, task_queue, hosts, [fleet]):
        handle = await start_job(time_env.client, task_queue, spec)
        result = await job_result(handle)
        history = await handle.fetch_history()
    assert result.status == JobStatus.FAILED and result.attempts == 4
    assert result.reason == TerminationReason.PROCESS_FAILED
    assert _retry_waits(history) == [10, 20, 40]
    assert allocations_of(sqlite_store, result.job_id) == []
    replayer = Replayer(
        workflows=[JobWorkflow],
        data_converter=DATA_CONVERTER,
        workflow_runner=checked_workflow_runner(),
    )
    await replayer.replay_workflow(history)


async def test_no_attempt_starts_when_the_wait_would_pass_the_deadline(
    time_env: WorkflowEnvironment, sqlite_store: Store, task_queue: str
) -> None:
    """With 30 s of retry left: attempt 2 after 10 s; attempt 3 would start 20 s later, past
    the deadline, so the job ends with attempt 2's failure instead of waiting for nothing."""
    fleet = sim_fleet(sqlite_store)
    hosts = ScriptedHosts(probe=_fails)
    spec = job(retry={"on_events": ["error"], "duration": "25s"})
    async with workers(time_env.client, sqlite_store, task_queue, hosts, [fleet]):
        handle = await start_job(time_env.client, task_queue, spec)
        result = await job_result(handle)
        history = await handle.fetch_history()
    assert result.status == JobStatus.FAILED and result.attempts == 2
    assert _retry_waits(history) == [10]


async def test_a_stop_during_the_wait_ends_the_job_stopped(
    time_env: WorkflowEnvironment, sqlite_store: Store, task_queue: str
) -> None:
    fleet = sim_fleet(sqlite_store)
    hosts = ScriptedHosts(probe=_fails)
    spec = job(retry={"on_events": ["error"], "duration": "1h"})
    with time_env.auto_time_skipping_disabled():
        async with workers(time_env.client, sqlite_store, task_queue, hosts, [fleet]):
            handle = await start_job(time_env.client, task_queue, spec)
            for _ in range(300):
                with contextlib.suppress(NotFoundError):  # its row comes with its first step
                    message = find_job(sqlite_store, handle.id).message or ""
                    if "retrying after process_failed in 10 s" in message:
                        break
                await asyncio.sleep(0.05)
            else:
                raise AssertionError("the job never waited to retry")
            await handle.signal("stop")
            result = await asyncio.wait_for(job_result(handle), timeout=5)
    assert result.status == JobStatus.STOPPED
    assert result.reason == TerminationReason.STOPPED_BY_USER
    assert result.attempts == 2  # the attempt it waited to start; nothing of it ran
    assert len(hosts.started) == 1
    assert allocations_of(sqlite_store, result.job_id) == []
