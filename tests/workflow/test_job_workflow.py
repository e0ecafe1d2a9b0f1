"""JobWorkflow on the time-skipping server: every ending, retries, fallbacks, compensation."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
from temporalio import activity
from temporalio.client import WorkflowFailureError
from temporalio.testing import WorkflowEnvironment

from gpuflow.services.capacity import allocations_of
from gpuflow.services.jobs import find_job, job_events
from gpuflow.status import JobStatus, TerminationReason
from gpuflow.store.db import Store
from gpuflow.utilization import GpuSample
from gpuflow.workflows.models import JobProgress, ProbeInput, ProbeResult
from gpuflow.workflows.outcome import job_result
from tests.workflow.harness import ScriptedHosts, idle_samples, job, sim_fleet, start_job, workers

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def _wait_status(handle, status: JobStatus, timeout: float = 30) -> JobProgress:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        progress = await handle.query("progress", result_type=JobProgress)
        if progress.status == status:
            return progress
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"still {progress.status}, wanted {status}")
        await asyncio.sleep(0.1)


async def test_job_runs_to_done_and_releases_its_gpus(
    time_env: WorkflowEnvironment, sqlite_store: Store, task_queue: str
) -> None:
    fleet = sim_fleet(sqlite_store)
    hosts = ScriptedHosts()
    async with workers(time_env.client, sqlite_store, task_queue, hosts, [fleet]):
        handle = await start_job(time_env.client, task_queue, job())
        result = await job_result(handle)
    assert result.status == JobStatus.DONE
    assert result.reason == TerminationReason.DONE
    assert result.exit_codes == {0: 0}
    assert len(hosts.started) == 1
    started = hosts.started[0]
    assert started.node.host_name == "h1" and len(started.node.gpu_indices) == 1
    assert allocations_of(sqlite_store, result.job_id) == []
    row = find_job(sqlite_store, result.job_id)
    assert row.status == "done" and row.started_at is not None and row.finished_at is not None
    events = job_events(sqlite_store, result.job_id)
    assert [(e.kind, e.message) for e in events] == [
        ("pending", "submitted"),
        ("provisioning", f"placed on h1 (fleet {fleet.name})"),
        ("running", "running on 1 node(s)"),
        ("done", "all processes exited with code 0"),
    ]


async def test_only_processes_that_may_be_left_are_stopped(
    time_env: WorkflowEnvironment, sqlite_store: Store, task_queue: str
) -> None:
    """A script that exited with its process group empty has nothing to stop; one whose group
    outlived it is stopped at finalize like any other ending."""
    fleet = sim_fleet(sqlite_store)
    hosts = ScriptedHosts(
        probe=lambda inp, n: ProbeResult(
            state="exited", exit_code=0, leftovers=inp.job_id.startswith("job-leaky")
        )
    )
    async with workers(time_env.client, sqlite_store, task_queue, hosts, [fleet]):
        clean = await job_result(await start_job(time_env.client, task_queue, job("clean")))
        leaky = await job_result(await start_job(time_env.client, task_queue, job("leaky")))
    assert clean.status == leaky.status == JobStatus.DONE
    assert [s.job_id for s in hosts.stopped] == [leaky.job_id]
    assert allocations_of(sqlite_store, clean.job_id) == []
    assert allocations_of(sqlite_store, leaky.job_id) == []


async def test_no_capacity_without_retry_fails_with_per_host_reasons(
    time_env: WorkflowEnvironment, sqlite_store: Store, task_queue: str
) -> None:
    fleet = sim_fleet(sqlite_store)
    async with workers(time_env.client, sqlite_store, task_queue, ScriptedHosts(), [fleet]):
        handle = await start_job(
            time_env.client, task_queue, job(resources={"gpu": "A100:4"}, fleets=[fleet.name])
        )
        result = await job_result(handle)
    assert result.status == JobStatus.FAILED
    assert result.reason == TerminationReason.NO_CAPACITY
    assert result.message == "no capacity: h1: has 2 GPUs, job needs 4 GPUs"
    assert find_job(sqlite_store, result.job_id).status == "failed"


async def test_waits_for_capacity_then_runs_when_another_job_stops(
    time_env: WorkflowEnvironment, sqlite_store: Store, task_queue: str
) -> None:
    fleet = sim_fleet(sqlite_store)
    hosts = ScriptedHosts(probe=lambda inp, n: ProbeResult(state="running"))
    async with workers(time_env.client, sqlite_store, task_queue, hosts, [fleet]):
        first = await start_job(
            time_env.client, task_queue, job("first", resources={"gpu": "A100:2"})
        )
        await _wait_status(first, JobStatus.RUNNING)
        second = await start_job(
            time_env.client,
            task_queue,
            job(
                "second",
                resources={"gpu": "A100:2"},
                retry={"on_events": ["no-capacity"], "duration": "1h"},
            ),
        )
        progress = await _wait_status(second, JobStatus.PENDING)
        await asyncio.sleep(0.5)
        progress = await second.query("progress", result_type=JobProgress)
        assert progress.waiting_reasons == ["h1: 0 of 2 GPUs free, job needs 2"]
        await first.signal("stop")
        first_result = await job_result(first)
        assert first_result.status == JobStatus.STOPPED
        await _wait_status(second, JobStatus.RUNNING)
        await second.signal("stop")
        second_result = await job_result(second)
    assert second_result.status == JobStatus.STOPPED
    assert [s.job_id for s in hosts.stopped] == [first_result.job_id, second_result.job_id]


async def test_no_capacity_gives_up_when_retry_duration_is_spent(
    time_env: WorkflowEnvironment, sqlite_store: Store, task_queue: str
) -> None:
    fleet = sim_fleet(sqlite_store)
    async with workers(time_env.client, sqlite_store, task_queue, ScriptedHosts(), [fleet]):
        handle = await start_job(
            time_env.client,
            task_queue,
            job(
                resources={"gpu": "H100:1"}, retry={"on_events": ["no-capacity"], "duration": "10m"}
            ),
        )
        result = await job_result(handle)
    assert result.reason == TerminationReason.NO_CAPACITY
    assert "h1:" in result.message and "H100" in result.message
    history = await handle.fetch_history()
    waits = [
        e.timer_started_event_attributes.start_to_fire_timeout.ToTimedelta()
        for e in history.events
        if e.HasField("timer_started_event_attributes")
    ]
    assert sum(waits, timedelta()) >= timedelta(minutes=9)  # its retry duration, on timers


async def test_falls_back_to_the_next_fleet_in_order(
    time_env: WorkflowEnvironment, sqlite_store: Store, task_queue: str
) -> None:
    small = sim_fleet(
        sqlite_store, hosts=[{"name": "l4", "gpus": [{"name": "L4", "memory": "24GB"}]}]
    )
    big = sim_fleet(sqlite_store)
    hosts = ScriptedHosts()
    async with workers(time_env.client, sqlite_store, task_queue, hosts, [small, big]):
        handle = await start_job(
            time_env.client,
            task_queue,
            job(resources={"gpu": "40GB..:1"}, fleets=[small.name, big.name]),
        )
        result = await job_result(handle)
    assert result.status == JobStatus.DONE
    assert hosts.started[0].node.fleet == big.name


async def test_failed_process_is_retried_only_on_error_event(
    time_env: WorkflowEnvironment, sqlite_store: Store, task_queue: str
) -> None:
    fleet = sim_fleet(sqlite_store)
    hosts = ScriptedHosts(probe=lambda inp, n: ProbeResult(state="exited", exit_code=3))
    async with workers(time_env.client, sqlite_store, task_queue, hosts, [fleet]):
        retried = await start_job(
            time_env.client, task_queue, job(retry={"on_events": ["error"], "max_attempts": 3})
        )
        retried_result = await job_result(retried)
        not_retried = await start_job(
            time_env.client, task_queue, job("other", retry={"on_events": ["interruption"]})
        )
        not_retried_result = await job_result(not_retried)
    assert retried_result.status == JobStatus.FAILED
    assert retried_result.reason == TerminationReason.PROCESS_FAILED
    assert retried_result.attempts == 3
    assert retried_result.message == "node 0 exited with code 3"
    assert not_retried_result.attempts == 1
    assert len([s for s in hosts.started if s.job_id == retried_result.job_id]) == 3
    assert allocations_of(sqlite_store, retried_result.job_id) == []


async def test_idle_gpu_is_terminated_and_never_retried(
    time_env: WorkflowEnvironment, sqlite_store: Store, task_queue: str
) -> None:
    fleet = sim_fleet(sqlite_store)
    hosts = ScriptedHosts(probe=idle_samples(5.0))
    async with workers(time_env.client, sqlite_store, task_queue, hosts, [fleet]):
        handle = await start_job(
            time_env.client,
            task_queue,
            job(utilization_policy={"min_gpu_utilization": 50, "time_window": "10m"}, retry=True),
        )
        result = await job_result(handle)
    gpu = hosts.started[0].node.gpu_indices[0]
    assert result.status == JobStatus.TERMINATED
    assert result.reason == TerminationReason.GPU_UNDERUTILIZED
    assert result.message == f"GPU {gpu} utilization stayed below 50% for 10m"
    assert result.attempts == 1
    assert [s.job_id for s in hosts.stopped] == [result.job_id]
    assert allocations_of(sqlite_store, result.job_id) == []


async def test_a_gpu_read_idle_a_quiet_tick_after_busy_gets_its_whole_window(
    time_env: WorkflowEnvironment, sqlite_store: Store, task_queue: str
) -> None:
    """While its GPU reads busy the monitor looks once a window; the first idle reading after
    such a tick says nothing of when the GPU fell idle. The job was terminated 10 s after
    that reading (idle since the busy one, it said); now its window counts from one reading
    interval before it."""
    fleet = sim_fleet(sqlite_store)
    readings: list[tuple[int, float, float]] = []

    def probe(inp: ProbeInput, n: int) -> ProbeResult:
        # As an agent answers a long poll: at the end of its wait, with a reading taken then.
        at = activity.info().current_attempt_scheduled_time.timestamp() + inp.wait_s
        util = 96.0 if n <= 2 else 0.0
        readings.append((n, at, util))
        sample = GpuSample(gpu=0, ts=at, utilization=util, memory_used_mib=1, memory_total_mib=2)
        return ProbeResult(state="running", samples=[sample])

    hosts = ScriptedHosts(probe=probe, long_poll=True)
    policy = {"min_gpu_utilization": 30, "time_window": "1m"}
    async with workers(time_env.client, sqlite_store, task_queue, hosts, [fleet]):
        handle = await start_job(time_env.client, task_queue, job(utilization_policy=policy))
        result = await job_result(handle)
    assert result.reason == TerminationReason.GPU_UNDERUTILIZED
    ended = find_job(sqlite_store, result.job_id).finished_at
    assert ended is not None
    (before,) = [at for n, at, _ in readings if n == 2]
    first_idle = min(at for _, at, util in readings if util == 0)
    assert first_idle - before >= 50  # a quiet tick: the GPU read busy at its start
    idle_for = ended.timestamp() - first_idle
    assert 45 <= idle_for <= 75, readings


async def test_busy_gpu_keeps_running_past_the_window(
    time_env: WorkflowEnvironment, sqlite_store: Store, task_queue: str
) -> None:
    fleet = sim_fleet(sqlite_store)
    busy = idle_samples(90.0)

    def probe(inp: ProbeInput, n: int) -> ProbeResult:
        return ProbeResult(state="exited", exit_code=0) if n > 40 else busy(inp, n)

    hosts = ScriptedHosts(probe=probe)
    async with workers(time_env.client, sqlite_store, task_queue, hosts, [fleet]):
        handle = await start_job(
            time_env.client,
            task_queue,
            job(utilization_policy={"min_gpu_utilization": 50, "time_window": "1m"}),
        )
        result = await job_result(handle)
    assert result.status == JobStatus.DONE


async def test_a_host_whose_probes_fail_is_lost_within_a_tick_not_three(
    time_env: WorkflowEnvironment, sqlite_store: Store, task_queue: str
) -> None:
    """A probe that failed (its agent gone: not taken up within PROBE_UNTAKEN) is followed by
    the next at once, not at the next tick: the job was shown running for 10 minutes."""
    from temporalio.exceptions import ApplicationError

    fleet = sim_fleet(sqlite_store)
    failed_at: list[float] = []

    def probe(inp: ProbeInput, n: int) -> ProbeResult:
        if n <= 1:
            return ProbeResult(state="running")
        failed_at.append(activity.info().current_attempt_scheduled_time.timestamp())
        raise ApplicationError("the agent is gone")

    hosts = ScriptedHosts(probe=probe, long_poll=True)
    async with workers(time_env.client, sqlite_store, task_queue, hosts, [fleet]):
        handle = await start_job(time_env.client, task_queue, job())
        result = await job_result(handle)
    assert result.reason == TerminationReason.HOST_LOST
    ended = find_job(sqlite_store, result.job_id).finished_at
    assert ended is not None
    assert ended.timestamp() - failed_at[0] < 60, failed_at  # three ticks were 6 minutes


async def test_max_duration_terminates_with_compensation(
    time_env: WorkflowEnvironment, sqlite_store: Store, task_queue: str
) -> None:
    fleet = sim_fleet(sqlite_store)
    hosts = ScriptedHosts(probe=lambda inp, n: ProbeResult(state="running"))
    async with workers(time_env.client, sqlite_store, task_queue, hosts, [fleet]):
        handle = await start_job(time_env.client, task_queue, job(max_duration="2h"))
        result = await job_result(handle)
        history = await handle.fetch_history()
    # The Temporal UI shows how the job ended, not gpuflow's Python frames (payloads.py).
    (ended,) = [
        e for e in history.events if e.HasField("workflow_execution_failed_event_attributes")
    ]
    failure = ended.workflow_execution_failed_event_attributes.failure
    assert failure.message == "terminated: ran longer than max_duration 2h"
    assert failure.application_failure_info.type == "max_duration_exceeded"
    assert failure.stack_trace == ""
    assert result.reason == TerminationReason.MAX_DURATION_EXCEEDED
    assert result.status == JobStatus.TERMINATED
    assert result.message == "ran longer than max_duration 2h"
    assert len(hosts.stopped) == 1
    assert allocations_of(sqlite_store, result.job_id) == []


async def test_cancel_still_compensates(
    time_env: WorkflowEnvironment, sqlite_store: Store, task_queue: str
) -> None:
    fleet = sim_fleet(sqlite_store)
    hosts = ScriptedHosts(probe=lambda inp, n: ProbeResult(state="running"))
    async with workers(time_env.client, sqlite_store, task_queue, hosts, [fleet]):
        handle = await start_job(time_env.client, task_queue, job())
        await _wait_status(handle, JobStatus.RUNNING)
        await handle.cancel()
        with pytest.raises(WorkflowFailureError):
            await job_result(handle)
    assert len(hosts.stopped) == 1
    assert allocations_of(sqlite_store, handle.id) == []
    assert find_job(sqlite_store, handle.id).status == "stopped"


def _real_host_fleet(store: Store) -> Any:
    """A sim fleet whose host h1 counts as real: simulated hosts need no provisioning."""
    from gpuflow.store.tables import HostRow

    fleet = sim_fleet(store)
    with store.session() as session:
        row = session.get(HostRow, f"{fleet.name}/h1")
        assert row is not None
        row.simulated = False
        session.add(row)
        session.commit()
    return fleet


async def test_failed_provisioning_releases_without_waiting_for_an_agent(
    time_env: WorkflowEnvironment, sqlite_store: Store, task_queue: str
) -> None:
    from gpuflow.control.activities import ControlActivities

    fleet = _real_host_fleet(sqlite_store)
    hosts = ScriptedHosts()

    async def unreachable(host: object) -> str:
        return "host h1 (root@10.0.0.1:22): connection refused; check the host"

    async with workers(
        time_env.client,
        sqlite_store,
        task_queue,
        hosts,
        [fleet],
        control=ControlActivities(
            sqlite_store, ensure_agent=unreachable, temporal=time_env.client, task_queue=task_queue
        ),
    ):
        handle = await start_job(time_env.client, task_queue, job())
        result = await job_result(handle)
    assert result.reason == TerminationReason.PROVISIONING_FAILED
    assert "connection refused" in result.message
    assert hosts.started == [] and hosts.stopped == []
    assert allocations_of(sqlite_store, result.job_id) == []


async def test_a_stop_while_hosts_are_provisioned_ends_the_job_stopped_at_once(
    time_env: WorkflowEnvironment, sqlite_store: Store, task_queue: str
) -> None:
    """`stop` waited for the provisioning (an SSH login of up to 10 s, 3 attempts), and a
    failed one ended the job `failed (provisioning_failed)`, as if nobody had stopped it."""
    from gpuflow.control.activities import ControlActivities

    fleet = _real_host_fleet(sqlite_store)
    hosts = ScriptedHosts()
    login = asyncio.Event()

    async def slow_login(host: object) -> str:
        await login.wait()  # an SSH login that hangs
        return "host h1 (root@10.0.0.1:22): no SSH login within 10 s"

    try:
        async with workers(
            time_env.client,
            sqlite_store,
            task_queue,
            hosts,
            [fleet],
            control=ControlActivities(
                sqlite_store,
                ensure_agent=slow_login,
                temporal=time_env.client,
                task_queue=task_queue,
            ),
        ):
            handle = await start_job(time_env.client, task_queue, job())
            await _wait_status(handle, JobStatus.PROVISIONING)
            await handle.signal("stop")
            result = await asyncio.wait_for(job_result(handle), 20)  # not the login's end
    finally:
        login.set()
    assert (result.status, result.reason) == (JobStatus.STOPPED, TerminationReason.STOPPED_BY_USER)
    assert result.message == "stopped while its hosts were provisioned"
    assert hosts.started == [] and allocations_of(sqlite_store, result.job_id) == []


async def test_resource_alternatives_are_tried_on_every_fleet_before_the_next(
    time_env: WorkflowEnvironment, sqlite_store: Store, task_queue: str
) -> None:
    """The first option (H100) is tried on both fleets before the A100 alternative, so the job
    lands on the second fleet's H100 although the first fleet has a free A100."""
    a100 = sim_fleet(sqlite_store)
    h100 = sim_fleet(
        sqlite_store, hosts=[{"name": "h9", "gpus": [{"name": "H100", "memory": "80GB"}]}]
    )
    spec = job(
        resources={"gpu": "H100:1"},
        alternatives=[{"gpu": "A100:1"}],
        fleets=[a100.name, h100.name],
    )
    async with workers(time_env.client, sqlite_store, task_queue, ScriptedHosts(), [a100, h100]):
        result = await job_result(await start_job(time_env.client, task_queue, spec))
        assert result.status == JobStatus.DONE
        assert find_job(sqlite_store, result.job_id).hosts == ["h9"]

        fallback = job("fallback", resources={"gpu": "A100:8"}, alternatives=[{"gpu": "A100:2"}])
        placed = await job_result(await start_job(time_env.client, task_queue, fallback))
        assert placed.status == JobStatus.DONE
        row = find_job(sqlite_store, placed.job_id)
        assert row.hosts == ["h1"] and row.gpus == "2xA100"

        nothing = job(
            "nothing",
            resources={"gpu": "A100:8"},
            alternatives=[{"gpu": "H100:4"}],
            fleets=[a100.name],
        )
        failed = await job_result(await start_job(time_env.client, task_queue, nothing))
    assert failed.reason == TerminationReason.NO_CAPACITY
    assert failed.message == (
        "no capacity: option 1 (A100:8): h1: has 2 GPUs, job needs 8 GPUs; "
        "option 2 (H100:4): h1: has A100 GPUs, job needs H100"
    )


async def test_a_job_that_ends_within_its_start_needs_no_probe(
    time_env: WorkflowEnvironment, sqlite_store: Store, task_queue: str
) -> None:
    """The start waits briefly for the script: an exit seen there ends the job at once (no
    probe, no timer), with the same verdicts as a probe's: 0 is done, anything else failed."""
    fleet = sim_fleet(sqlite_store)
    hosts = ScriptedHosts(
        at_start=lambda inp: ProbeResult(
            state="exited", exit_code=3 if "broken" in inp.job_id else 0, leftovers=False
        )
    )
    async with workers(time_env.client, sqlite_store, task_queue, hosts, [fleet]):
        quick = await start_job(time_env.client, task_queue, job("quick"))
        done = await job_result(quick)
        broken = await job_result(await start_job(time_env.client, task_queue, job("broken")))
    assert (done.status, done.exit_codes) == (JobStatus.DONE, {0: 0})
    assert (broken.status, broken.reason) == (JobStatus.FAILED, TerminationReason.PROCESS_FAILED)
    assert broken.message == "node 0 exited with code 3"
    assert hosts.probes == {} and hosts.stopped == []
    assert all(s.wait_s > 0 for s in hosts.started)
    history = await quick.fetch_history()
    assert not any(e.HasField("timer_started_event_attributes") for e in history.events)
    row = find_job(sqlite_store, done.job_id)
    assert row.started_at is not None and row.status == "done"
    assert allocations_of(sqlite_store, done.job_id) == []
