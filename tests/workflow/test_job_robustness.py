"""JobWorkflow's robustness and what Temporal shows of it: internal errors end the job failed and
compensated, long-poll probes see an exit at once, a job that did not end `done` fails its
workflow, and histories recorded by earlier versions still replay."""

from __future__ import annotations

import asyncio
import gzip
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from temporalio import activity
from temporalio.client import WorkflowExecutionStatus, WorkflowFailureError, WorkflowHistory
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer, WorkflowRunner

from gpuflow import utilization
from gpuflow.payloads import DATA_CONVERTER
from gpuflow.services.capacity import allocations_of
from gpuflow.services.jobs import find_job
from gpuflow.status import JobStatus, TerminationReason
from gpuflow.store.db import Store
from gpuflow.workflows import checked_workflow_runner, workflow_runner
from gpuflow.workflows.job import JobWorkflow
from gpuflow.workflows.models import JobProgress, JobResult, ProbeInput, ProbeResult
from gpuflow.workflows.outcome import job_result
from tests.workflow.harness import ScriptedHosts, idle_samples, job, sim_fleet, start_job, workers

pytestmark = pytest.mark.asyncio(loop_scope="session")

HISTORIES = Path(__file__).parent / "histories"


async def _wait_status(handle, status: JobStatus, timeout: float = 30) -> JobProgress:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        progress = await handle.query("progress", result_type=JobProgress)
        if progress.status == status:
            return progress
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"still {progress.status}, wanted {status}")
        await asyncio.sleep(0.1)


async def test_an_error_in_workflow_code_fails_the_job_and_compensates(
    time_env: WorkflowEnvironment,
    sqlite_store: Store,
    task_queue: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A bug in a pure helper the monitor calls (here: the utilization verdict overflows) ends
    the job `failed` with a reason that names the error, instead of failing its workflow task
    forever; its processes are stopped and its GPUs released."""

    def broken(state: object, policy: object) -> None:
        raise OverflowError("date value out of range")

    monkeypatch.setattr(utilization, "verdict", broken)
    fleet = sim_fleet(sqlite_store)
    hosts = ScriptedHosts(probe=idle_samples(90.0))
    async with workers(time_env.client, sqlite_store, task_queue, hosts, [fleet]):
        handle = await start_job(
            time_env.client,
            task_queue,
            job(utilization_policy={"min_gpu_utilization": 50, "time_window": "10m"}),
        )
        result = await asyncio.wait_for(job_result(handle), 60)
    assert result.status == JobStatus.FAILED
    assert result.reason == TerminationReason.INTERNAL_ERROR
    assert result.message == "gpuflow internal error: OverflowError: date value out of range"
    assert [s.job_id for s in hosts.stopped] == [result.job_id]
    assert allocations_of(sqlite_store, result.job_id) == []
    row = find_job(sqlite_store, result.job_id)
    assert row.status == "failed" and row.termination_reason == "internal_error"


async def test_huge_durations_are_clamped_not_overflowed(
    time_env: WorkflowEnvironment, sqlite_store: Store, task_queue: str
) -> None:
    """The longest durations a spec may carry run to their end; anything longer (an old
    payload, a bug) is clamped by `monitor.span`, never overflowing datetime arithmetic."""
    from gpuflow.workflows.monitor import MAX_SPAN, span

    assert span(1e20) == MAX_SPAN and span(float("inf")) == MAX_SPAN
    assert span(-5).total_seconds() == 0
    fleet = sim_fleet(sqlite_store)
    async with workers(time_env.client, sqlite_store, task_queue, ScriptedHosts(), [fleet]):
        year = 366 * 86400  # the specs' upper bound (gpuflow/specs/units.py)
        spec = job(max_duration=year, retry={"on_events": ["no-capacity"], "duration": year})
        result = await asyncio.wait_for(
            job_result(await start_job(time_env.client, task_queue, spec)), 60
        )
    assert (result.status, result.reason) == (JobStatus.DONE, TerminationReason.DONE)


async def test_a_long_poll_sees_the_exit_at_once_without_timers(
    time_env: WorkflowEnvironment, sqlite_store: Store, task_queue: str
) -> None:
    """Probes wait on the agent up to a tick and answer the moment the job exits: the end is
    seen within the exit's own second (server time), and monitoring starts no timer."""
    fleet = sim_fleet(sqlite_store)
    busy = idle_samples(90.0)
    exit_at: list[float] = []

    def probe(inp: ProbeInput, n: int) -> ProbeResult:
        if n >= 4:  # the script exits while the 4th probe waits: it answers at once
            exit_at.append(activity.info().current_attempt_scheduled_time.timestamp())
            return ProbeResult(state="exited", exit_code=0, leftovers=False)
        return busy(inp, n)

    hosts = ScriptedHosts(probe=probe, long_poll=True)
    async with workers(time_env.client, sqlite_store, task_queue, hosts, [fleet]):
        handle = await start_job(
            time_env.client,
            task_queue,
            job(utilization_policy={"min_gpu_utilization": 50, "time_window": "10m"}),
        )
        result = await job_result(handle)
        history = await handle.fetch_history()
        closed = (await handle.describe()).close_time
    assert result.status == JobStatus.DONE
    # Seen within seconds of the exit, not at the end of the probe's tick (minutes): the
    # server's clock runs with real time while the workers are busy, so a loaded machine
    # stretches the seconds, never to a tick.
    assert closed is not None and closed.timestamp() - exit_at[0] < 20
    assert not any(e.HasField("timer_started_event_attributes") for e in history.events)
    probes = [
        e.activity_task_scheduled_event_attributes
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
        and e.activity_task_scheduled_event_attributes.activity_type.name == "probe_process"
    ]
    assert len(probes) == 4
    # A lost agent is noticed by its heartbeats, not at the end of a (long) tick.
    assert all(p.heartbeat_timeout.seconds == 30 for p in probes)
    assert all(p.start_to_close_timeout.seconds > 60 for p in probes)


async def test_a_stop_cancels_the_waiting_probe(sqlite_store: Store, task_queue: str) -> None:
    """A stop request does not wait for the probe's tick: the probe is cancelled, the job
    stopped and compensated at once. On a server of its own: the time-skipping server's clock
    stays stuck after a cancelled activity, which would hang every later test."""
    time_env = await WorkflowEnvironment.start_time_skipping(
        data_converter=DATA_CONVERTER,
        test_server_existing_path=str(Path(sys.executable).parent / "temporal-test-server"),
    )
    try:
        await _stop_during_a_probe(time_env, sqlite_store, task_queue)
    finally:
        await time_env.shutdown()


async def _stop_during_a_probe(
    time_env: WorkflowEnvironment, sqlite_store: Store, task_queue: str
) -> None:
    fleet = sim_fleet(sqlite_store)
    waiting = asyncio.Event()
    hosts = ScriptedHosts(probe=lambda inp, n: ProbeResult(state="running"))

    async def hang(seconds: float) -> None:
        """An agent waiting for an exit that never comes, until the probe is cancelled (an
        abandoned probe would hold the test server's clock until its timeout)."""
        waiting.set()
        while True:
            activity.heartbeat()
            await asyncio.sleep(0.05)

    hosts.wait = hang  # type: ignore[method-assign]
    hosts.long_poll = True
    async with workers(time_env.client, sqlite_store, task_queue, hosts, [fleet]):
        handle = await start_job(time_env.client, task_queue, job())
        await asyncio.wait_for(waiting.wait(), 30)
        await handle.signal("stop")
        await _wait_status(handle, JobStatus.STOPPED)
        result = await job_result(handle)
    assert (result.status, result.reason) == (JobStatus.STOPPED, TerminationReason.STOPPED_BY_USER)
    assert [s.job_id for s in hosts.stopped] == [result.job_id]
    assert allocations_of(sqlite_store, result.job_id) == []


async def test_a_failed_node_ends_the_job_without_waiting_for_the_others(
    sqlite_store: Store, task_queue: str
) -> None:
    """Node 1 fails while node 0's probe still waits for its tick: the job ends failed at once
    (node 0's probe is cancelled, its process stopped). On a server of its own, as above."""
    time_env = await WorkflowEnvironment.start_time_skipping(
        data_converter=DATA_CONVERTER,
        test_server_existing_path=str(Path(sys.executable).parent / "temporal-test-server"),
    )
    try:
        fleet = sim_fleet(
            sqlite_store,
            hosts=[{"name": f"h{i}", "gpus": [{"name": "A100", "memory": "80GB"}]} for i in (1, 2)],
        )
        hosts = ScriptedHosts(
            probe=lambda inp, n: (
                ProbeResult(state="exited", exit_code=3)
                if inp.rank == 1
                else ProbeResult(state="running")
            ),
            long_poll=True,
        )

        async def hang(seconds: float) -> None:
            while True:
                activity.heartbeat()
                await asyncio.sleep(0.05)

        hosts.wait = hang  # type: ignore[method-assign]
        async with workers(time_env.client, sqlite_store, task_queue, hosts, [fleet]):
            handle = await start_job(time_env.client, task_queue, job(nodes=2))
            result = await asyncio.wait_for(job_result(handle), 30)
            described = await handle.describe()
    finally:
        await time_env.shutdown()
    assert (result.status, result.message) == (JobStatus.FAILED, "node 1 exited with code 3")
    assert described.close_time is not None
    assert (described.close_time - described.start_time).total_seconds() < 5  # server time
    assert sorted(s.rank for s in hosts.stopped) == [0, 1]
    assert allocations_of(sqlite_store, result.job_id) == []


async def test_a_job_that_did_not_end_done_fails_its_workflow(
    time_env: WorkflowEnvironment, sqlite_store: Store, task_queue: str
) -> None:
    """In Temporal's list a failed, terminated or stopped job reads as Failed, with its reason
    as the error type and its JobResult as details; a done job completes."""
    fleet = sim_fleet(sqlite_store)
    hosts = ScriptedHosts(
        probe=lambda inp, n: ProbeResult(
            state="exited", exit_code=3 if inp.job_id.startswith("job-broken") else 0
        )
    )
    async with workers(time_env.client, sqlite_store, task_queue, hosts, [fleet]):
        done = await start_job(time_env.client, task_queue, job("fine"))
        broken = await start_job(time_env.client, task_queue, job("broken"))
        with pytest.raises(WorkflowFailureError) as caught:
            await broken.result()
        done_result = await done.result()
        assert (await done.describe()).status == WorkflowExecutionStatus.COMPLETED
        assert (await broken.describe()).status == WorkflowExecutionStatus.FAILED
    assert isinstance(done_result, JobResult) and done_result.status == JobStatus.DONE
    cause = caught.value.cause
    assert isinstance(cause, ApplicationError)
    assert cause.type == "process_failed" and cause.non_retryable
    assert cause.message == "failed: node 0 exited with code 3"
    carried = JobResult.model_validate(cause.details[0])
    assert (carried.status, carried.exit_codes) == (JobStatus.FAILED, {0: 3})


@pytest.mark.parametrize("runner", [checked_workflow_runner, workflow_runner])
@pytest.mark.parametrize(
    "name",
    ["done", "failed", "idle", "nocapacity", "long-run1", "long-run2"],
)
async def test_histories_of_the_previous_version_replay(
    name: str, runner: Callable[[], WorkflowRunner]
) -> None:
    """Histories recorded by the workflow before long polls and failing endings (cfb0f95): a
    done job, a failed one, an idle one terminated, one without capacity, and a monitored job
    that continued as new (both runs). A running workflow must go on with the new code, in the
    sandbox the tests check it in and as control workers run it (without)."""
    data = gzip.decompress((HISTORIES / f"{name}.json.gz").read_bytes()).decode()
    history = WorkflowHistory.from_json(f"job-{name}", data)
    replayer = Replayer(
        workflows=[JobWorkflow],
        data_converter=DATA_CONVERTER,
        workflow_runner=runner(),
    )
    await replayer.replay_workflow(history)
