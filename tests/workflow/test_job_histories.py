"""JobWorkflow's histories on the time-skipping server: what one records, continue-as-new of a
long job, deterministic replay, and how small a busy job's history stays."""

from __future__ import annotations

import pytest
from temporalio import activity
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer

from gpuflow.payloads import DATA_CONVERTER
from gpuflow.status import JobStatus
from gpuflow.store.db import Store
from gpuflow.workflows import checked_workflow_runner
from gpuflow.workflows.job import JobWorkflow
from gpuflow.workflows.models import ProbeInput, ProbeResult
from gpuflow.workflows.outcome import job_result
from tests.workflow.harness import ScriptedHosts, idle_samples, job, sim_fleet, start_job, workers

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_a_job_records_one_patch_marker_and_its_name_in_its_result(
    time_env: WorkflowEnvironment, sqlite_store: Store, task_queue: str
) -> None:
    """One marker stands for all the job workflow's patches (job_state.PATCHES_2026_12): a
    job's history has it once, not one per patch, and so one TemporalChangeVersion upsert
    (the SDK adds one per patch marker); its replays are checked in
    test_histories_replay_deterministically and those of histories with the single patches in
    test_job_robustness."""
    fleet = sim_fleet(sqlite_store)
    async with workers(time_env.client, sqlite_store, task_queue, ScriptedHosts(), [fleet]):
        handle = await start_job(time_env.client, task_queue, job("named"))
        result = await job_result(handle)
    assert (result.status, result.name) == (JobStatus.DONE, "named")
    history = await handle.fetch_history()
    patches = [
        e.marker_recorded_event_attributes.details["patch-data"].payloads[0].data
        for e in history.events
        if e.HasField("marker_recorded_event_attributes")
        and e.marker_recorded_event_attributes.marker_name == "core_patch"
    ]
    assert patches == [b'{"id":"job-patches-2026-12","deprecated":false}']
    versions = [
        e.upsert_workflow_search_attributes_event_attributes.search_attributes.indexed_fields[
            "TemporalChangeVersion"
        ].data
        for e in history.events
        if e.HasField("upsert_workflow_search_attributes_event_attributes")
        and "TemporalChangeVersion"
        in e.upsert_workflow_search_attributes_event_attributes.search_attributes.indexed_fields
    ]
    assert versions == [b'["job-patches-2026-12"]']


async def test_long_job_continues_as_new_and_replays(
    time_env: WorkflowEnvironment, sqlite_store: Store, task_queue: str
) -> None:
    fleet = sim_fleet(sqlite_store)
    busy = idle_samples(80.0)

    def probe(inp: ProbeInput, n: int) -> ProbeResult:
        return ProbeResult(state="exited", exit_code=0) if n > 700 else busy(inp, n)

    hosts = ScriptedHosts(probe=probe)
    async with workers(time_env.client, sqlite_store, task_queue, hosts, [fleet]):
        handle = await start_job(
            time_env.client,
            task_queue,
            job(utilization_policy={"min_gpu_utilization": 50, "time_window": "1h"}),
        )
        result = await job_result(handle)
        first_run = time_env.client.get_workflow_handle(
            handle.id, run_id=handle.first_execution_run_id
        )
        first_history = await first_run.fetch_history()
        last_history = await time_env.client.get_workflow_handle(handle.id).fetch_history()
    assert result.status == JobStatus.DONE
    assert first_history.events[-1].HasField("workflow_execution_continued_as_new_event_attributes")
    assert len(first_history.events) < 5000
    assert len(hosts.started) == 1  # continuing as new never starts the process again
    replayer = Replayer(
        workflows=[JobWorkflow],
        data_converter=DATA_CONVERTER,
        workflow_runner=checked_workflow_runner(),
    )
    await replayer.replay_workflow(first_history)
    await replayer.replay_workflow(last_history)


async def test_histories_replay_deterministically(
    time_env: WorkflowEnvironment, sqlite_store: Store, task_queue: str
) -> None:
    fleet = sim_fleet(sqlite_store)
    hosts = ScriptedHosts(probe=idle_samples(1.0))
    async with workers(time_env.client, sqlite_store, task_queue, hosts, [fleet]):
        idle = await start_job(
            time_env.client,
            task_queue,
            job(utilization_policy={"min_gpu_utilization": 20, "time_window": "5m"}),
        )
        await job_result(idle)
        waiting = await start_job(
            time_env.client,
            task_queue,
            job(
                "big",
                resources={"gpu": "A100:8"},
                retry={"on_events": ["no-capacity"], "duration": "5m"},
            ),
        )
        await job_result(waiting)
    replayer = Replayer(
        workflows=[JobWorkflow],
        data_converter=DATA_CONVERTER,
        workflow_runner=checked_workflow_runner(),
    )
    for handle in (idle, waiting):
        await replayer.replay_workflow(await handle.fetch_history())


async def test_busy_job_history_stays_small(
    time_env: WorkflowEnvironment, sqlite_store: Store, task_queue: str
) -> None:
    """A busy job with a long window ticks slowly (no verdict can fire sooner), so an hour of
    monitoring costs under 300 history events."""
    fleet = sim_fleet(sqlite_store)
    busy = idle_samples(90.0)
    started: list[float] = []

    def probe(inp: ProbeInput, n: int) -> ProbeResult:
        now = activity.info().current_attempt_scheduled_time.timestamp()
        started.append(now)
        if now - started[0] >= 3 * 3600:
            return ProbeResult(state="exited", exit_code=0)
        return busy(inp, n)

    hosts = ScriptedHosts(probe=probe)
    async with workers(time_env.client, sqlite_store, task_queue, hosts, [fleet]):
        handle = await start_job(
            time_env.client,
            task_queue,
            job(utilization_policy={"min_gpu_utilization": 50, "time_window": "24h"}),
        )
        result = await job_result(handle)
        history = await handle.fetch_history()
    assert result.status == JobStatus.DONE
    hours = (started[-1] - started[0]) / 3600
    assert 2.9 < hours < 3.2
    assert len(history.events) / hours < 300
