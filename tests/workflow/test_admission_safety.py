"""What keeps a waiting job from waiting forever when an ask or a verdict is lost, and what it
costs: the admission loop, not each job, passes again while jobs wait (one timer in the loop,
`SAFETY_PASS`), and a pass tells again the verdicts a run of it that was lost had committed
(`PassInput.pass_id`); a job asks again only rarely (`ADMISSION_CHECK`), for a loop that is gone.
Histories recorded before (a job asking every minute, a loop without a timer) still replay.

Recording (histories/README.md): `GPUFLOW_RECORD=1 pytest tests/workflow/test_admission_safety.py
-k record` writes them under histories/ from the code checked out."""

from __future__ import annotations

import gzip
import json
import os
from datetime import timedelta

import pytest
from temporalio.client import WorkflowHistory
from temporalio.testing import WorkflowEnvironment

from gpuflow.services.queues import apply_queue
from gpuflow.specs.queue import QueueSpec
from gpuflow.status import JobStatus
from gpuflow.store.db import Store
from gpuflow.workflows.models import ProbeResult
from gpuflow.workflows.outcome import job_result
from gpuflow.workflows.queue_models import admission_workflow_id
from tests.workflow.harness import ScriptedHosts, job, sim_fleet, start_job, workers
from tests.workflow.test_queue_workflow import HISTORIES, WAIT, _replayer, _waits

ASKING_JOB = HISTORIES / "queue-check-every-minute.json.gz"
LOOP_NO_TIMER = HISTORIES / "admission-no-timer.json.gz"


def _load(path: os.PathLike[str], workflow_id: str) -> WorkflowHistory:
    with open(path, "rb") as handle:
        return WorkflowHistory.from_json(workflow_id, gzip.decompress(handle.read()).decode())


def _save(path: os.PathLike[str], history: WorkflowHistory) -> None:
    with open(path, "wb") as handle:
        handle.write(gzip.compress(history.to_json().encode()))


async def _waits_on_quota(
    env: WorkflowEnvironment, store: Store, task_queue: str, skip: timedelta
) -> tuple[JobStatus, WorkflowHistory, WorkflowHistory]:
    """A job waits in a queue with no quota (nothing runs), the server's clock skips `skip`,
    then the job is stopped: its status, its history and the loop's."""
    fleet = sim_fleet(store)
    apply_queue(store, QueueSpec(name="none", gpus=0))
    with env.auto_time_skipping_disabled():
        async with workers(env.client, store, task_queue, ScriptedHosts(), [fleet]):
            waiter = await start_job(
                env.client, task_queue, job("waiter", queue="none", retry=WAIT)
            )
            await _waits(store, waiter, "quota")
            await env.sleep(skip)
            await waiter.signal("stop")
            result = await job_result(waiter)
            loop = env.client.get_workflow_handle(admission_workflow_id(task_queue))
            loop_history = await loop.fetch_history()
    return result.status, await waiter.fetch_history(), loop_history


@pytest.mark.skipif(not os.environ.get("GPUFLOW_RECORD"), reason="records histories")
async def test_record(time_env: WorkflowEnvironment, sqlite_store: Store, task_queue: str) -> None:
    status, waiter, loop = await _waits_on_quota(
        time_env, sqlite_store, task_queue, timedelta(seconds=150)
    )
    assert status == JobStatus.STOPPED
    _save(ASKING_JOB, waiter)
    _save(LOOP_NO_TIMER, loop)


def _local_steps(history: WorkflowHistory, name: str) -> int:
    """Local activities of this name the history records (each marker's data names its type)."""
    count = 0
    for event in history.events:
        if event.HasField("marker_recorded_event_attributes"):
            marker = event.marker_recorded_event_attributes
            if marker.marker_name == "core_local_activity":
                data = marker.details["data"].payloads[0].data
                count += json.loads(data)["activity_type"] == name
    return count


def _timers(history: WorkflowHistory) -> list[timedelta]:
    return [
        event.timer_started_event_attributes.start_to_fire_timeout.ToTimedelta()
        for event in history.events
        if event.HasField("timer_started_event_attributes")
    ]


async def test_histories_of_a_job_asking_every_minute_and_a_loop_without_timer_replay() -> None:
    """Recorded before `queue-rare-check` and `admission-safety-pass` (this module's
    `test_record`, at a2f800c): a job waits on a queue without quota for 150 s, asking again
    every minute, and is stopped; the loop passed on every ask."""
    asking = _load(ASKING_JOB, "job-waiter")
    assert _timers(asking) == [timedelta(seconds=60)] * 3
    assert _local_steps(asking, "enqueue_job") == 3
    loop = _load(LOOP_NO_TIMER, "gpuflow-admission")
    assert _timers(loop) == [] and _local_steps(loop, "admission_pass") == 4
    for history in (asking, loop):
        await _replayer().replay_workflow(history)


async def test_a_waiting_job_asks_rarely_while_the_loop_passes_each_minute(
    time_env: WorkflowEnvironment, sqlite_store: Store, task_queue: str
) -> None:
    status, waiter, loop = await _waits_on_quota(
        time_env, sqlite_store, task_queue, timedelta(minutes=25)
    )
    assert status == JobStatus.STOPPED
    # enter, then ask once at 10 min (the next would be at 30): 26 asks before
    assert _local_steps(waiter, "enqueue_job") == 2
    assert _timers(waiter)[:2] == [timedelta(minutes=10), timedelta(minutes=20)]
    # one timer at a time in the loop, each run out: a pass a minute for all who wait
    assert set(_timers(loop)) == {timedelta(seconds=60)}
    assert len(_timers(loop)) >= 20
    assert not [e for e in loop.events if e.HasField("timer_canceled_event_attributes")]
    assert _local_steps(loop, "admission_pass") >= 20
    for history in (waiter, loop):
        await _replayer().replay_workflow(history)


async def test_an_ask_that_was_lost_costs_a_minute_not_the_job(
    time_env: WorkflowEnvironment, sqlite_store: Store, task_queue: str
) -> None:
    """The queue gets quota without anybody asking for a pass (as when the wake of an apply
    was lost): the loop's own pass admits the waiting job within a minute."""
    fleet = sim_fleet(sqlite_store)
    apply_queue(sqlite_store, QueueSpec(name="none", gpus=0))
    hosts = ScriptedHosts(probe=lambda inp, n: ProbeResult(state="exited", exit_code=0))
    with time_env.auto_time_skipping_disabled():
        async with workers(time_env.client, sqlite_store, task_queue, hosts, [fleet]):
            waiter = await start_job(
                time_env.client, task_queue, job("waiter", queue="none", retry=WAIT)
            )
            await _waits(sqlite_store, waiter, "quota")
            apply_queue(sqlite_store, QueueSpec(name="none", gpus=1))  # nobody wakes the loop
            await time_env.sleep(timedelta(seconds=61))
            result = await job_result(waiter)
    assert result.status == JobStatus.DONE
    history = await waiter.fetch_history()
    assert _local_steps(history, "enqueue_job") == 1  # it never asked again
