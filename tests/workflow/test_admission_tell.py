"""The admission loop tells the jobs a pass decided on from its worker, right after the pass
(both local activities), and by its own signal commands only those the worker could not tell;
histories of the loop from before (the pass an activity task, every job told by a command)
still replay."""

from __future__ import annotations

import gzip
from typing import Any

import pytest
from temporalio import activity
from temporalio.client import WorkflowHistory
from temporalio.testing import WorkflowEnvironment

from gpuflow.control.activities import ControlActivities
from gpuflow.status import JobStatus
from gpuflow.store.db import Store
from gpuflow.workflows.outcome import job_result
from gpuflow.workflows.queue_models import PassResult, TellResult, admission_workflow_id
from tests.workflow.harness import ScriptedHosts, job, sim_fleet, start_job, workers
from tests.workflow.test_queue_workflow import (
    HISTORIES,
    ONE_GPU,
    WAIT,
    _replayer,
    _runs,
    _until_ended,
    _waits,
)


def _has(history: WorkflowHistory, field: str) -> list[Any]:
    return [getattr(e, field) for e in history.events if e.HasField(field)]


class _Mute(ControlActivities):
    """The worker's telling fails: `untold` says every job is left to tell; `broken` fails."""

    def __init__(self, *args: Any, mode: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.mode = mode
        self.asked: list[list[str]] = []

    def activities(self) -> list[Any]:
        @activity.defn(name="tell_jobs")
        async def tell_jobs(inp: PassResult) -> TellResult:
            self.asked.append([job.job_id for job in inp.admitted])
            if self.mode == "broken":
                raise RuntimeError("no route to the server")
            return TellResult(untold=[job.job_id for job in inp.admitted + inp.held])

        return [a for a in super().activities() if a != self.tell.tell_jobs] + [tell_jobs]


async def _admit_after_blocker(
    env: WorkflowEnvironment, store: Store, task_queue: str, control: ControlActivities | None
) -> tuple[Any, WorkflowHistory, WorkflowHistory]:
    """A blocker runs on the one GPU, a job waits for it and is admitted by a pass when the
    blocker is stopped: the waiter's result, its history and the loop's.

    The server's clock runs at real pace throughout (nothing here waits on a timer): the
    time-skipping server strands a job whose workflow task cancels its `wait for admission`
    timer when a skip fired that timer while the task was with the worker (temporalio/sdk-java
    #3088), which a skip made while the blocker's monitor ticks could do."""
    fleet = sim_fleet(store, hosts=ONE_GPU)
    hosts = ScriptedHosts(probe=_until_ended({"waiter"}))
    with env.auto_time_skipping_disabled():
        async with workers(env.client, store, task_queue, hosts, [fleet], control=control):
            blocker = await start_job(env.client, task_queue, job("blocker"))
            await _runs(store, blocker)
            waiter = await start_job(env.client, task_queue, job("waiter", retry=WAIT))
            await _waits(store, waiter, "no_capacity")
            await blocker.signal("stop")
            assert (await job_result(blocker)).status == JobStatus.STOPPED
            result = await job_result(waiter)
            loop = env.client.get_workflow_handle(admission_workflow_id(task_queue))
            loop_history = await loop.fetch_history()
    assert [s.job_id for s in hosts.started] == [blocker.id, waiter.id]
    return result, await waiter.fetch_history(), loop_history


def _signals(history: WorkflowHistory, name: str) -> int:
    return [
        a.signal_name for a in _has(history, "workflow_execution_signaled_event_attributes")
    ].count(name)


async def test_a_pass_and_its_news_are_local_steps_of_the_loop(
    time_env: WorkflowEnvironment, sqlite_store: Store, task_queue: str
) -> None:
    result, waiter, loop = await _admit_after_blocker(time_env, sqlite_store, task_queue, None)
    assert result.status == JobStatus.DONE
    assert _signals(waiter, "admitted") == 1
    assert _has(loop, "activity_task_scheduled_event_attributes") == []
    assert _has(loop, "signal_external_workflow_execution_initiated_event_attributes") == []
    assert len(_has(loop, "marker_recorded_event_attributes")) >= 3  # patch, passes, telling
    await _replayer().replay_workflow(loop)


@pytest.mark.parametrize("mode", ["untold", "broken"])
async def test_jobs_the_worker_could_not_tell_are_told_by_the_loop(
    time_env: WorkflowEnvironment, sqlite_store: Store, task_queue: str, mode: str
) -> None:
    control = _Mute(sqlite_store, temporal=time_env.client, task_queue=task_queue, mode=mode)
    result, waiter, loop = await _admit_after_blocker(time_env, sqlite_store, task_queue, control)
    assert result.status == JobStatus.DONE
    assert [result.job_id] in control.asked
    assert _signals(waiter, "admitted") == 1  # the loop's, sent by its own command
    told = _has(loop, "signal_external_workflow_execution_initiated_event_attributes")
    assert [(a.workflow_execution.workflow_id, a.signal_name) for a in told].count(
        (result.job_id, "admitted")
    ) == 1
    await _replayer().replay_workflow(loop)


async def test_a_loop_recorded_with_the_pass_as_an_activity_task_replays() -> None:
    """Recorded before `admission-local-pass` (see histories/README.md): a job waits behind a
    blocker, a high-priority one arrives, both are admitted in turn by activity-task passes and
    told by the loop's signal commands. A loop running when the new version is deployed goes
    on with it."""
    recorded = HISTORIES / "admission-activity-pass.json.gz"
    history = WorkflowHistory.from_json(
        "gpuflow-admission", gzip.decompress(recorded.read_bytes()).decode()
    )
    scheduled = _has(history, "activity_task_scheduled_event_attributes")
    assert {a.activity_type.name for a in scheduled} == {"admission_pass"}
    assert len(_has(history, "signal_external_workflow_execution_initiated_event_attributes")) == 3
    await _replayer().replay_workflow(history)
