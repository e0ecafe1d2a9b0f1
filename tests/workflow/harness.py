"""Shared set-up for workflow tests: a sim fleet in a real store, the real control activities,
and scripted host activities registered under the agent's activity names."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from temporalio import activity
from temporalio.api.testservice.v1 import SleepRequest
from temporalio.client import Client, WorkflowHandle
from temporalio.service import RPCError
from temporalio.worker import Worker

from gpuflow.control.activities import ControlActivities
from gpuflow.services.fleets import apply_fleet
from gpuflow.specs import FleetSpec, JobSpec
from gpuflow.store.db import Store
from gpuflow.utilization import GpuSample
from gpuflow.workflows import checked_workflow_runner
from gpuflow.workflows.admission import AdmissionWorkflow
from gpuflow.workflows.job import JobWorkflow
from gpuflow.workflows.models import (
    JobInput,
    LogChunk,
    LogsInput,
    ProbeInput,
    ProbeResult,
    ProcessHandle,
    StartProcessInput,
    StopProcessInput,
    StopProcessResult,
)
from gpuflow.workflows.queue_models import admission_workflow_id

HEARTBEAT_STEP_S = 20.0
"""Server seconds a scripted long poll skips between heartbeats (under PROBE_HEARTBEAT)."""


def sim_fleet(
    store: Store,
    *,
    hosts: list[dict[str, Any]] | None = None,
    name: str | None = None,
    scorer: str = "binpack",
) -> FleetSpec:
    spec = FleetSpec.model_validate(
        {
            "type": "fleet",
            "name": name or f"f{uuid.uuid4().hex[:8]}",
            "kind": "sim",
            "scorer": scorer,
            "hosts": hosts
            or [{"name": "h1", "gpus": [{"name": "A100", "memory": "80GB", "count": 2}]}],
        }
    )
    apply_fleet(store, spec)
    return spec


@dataclass
class ScriptedHosts:
    """Host activities whose behaviour the test sets. `probe` decides each probe's answer."""

    probe: Callable[[ProbeInput, int], ProbeResult] = field(
        default=lambda inp, n: (
            ProbeResult(state="exited", exit_code=0) if n >= 2 else ProbeResult(state="running")
        )
    )
    at_start: Callable[[StartProcessInput], ProbeResult | None] = field(default=lambda inp: None)
    """The exit a start reports (a script that ended within the start's wait), or None."""
    long_poll: bool = False
    """Answer 'running' as an agent does, at the end of the probe's wait (skipping the
    time-skipping server's clock by `wait_s`). False answers at once, as an agent of an older
    version did (it waited 5 s at most); the workflow then waits out the tick on a timer.
    Only for jobs that are not stopped mid-probe: a skip cut short leaves the test server's
    clock stuck."""
    started: list[StartProcessInput] = field(default_factory=list)
    stopped: list[StopProcessInput] = field(default_factory=list)
    probes: dict[tuple[str, int, int], int] = field(default_factory=dict)
    client: Client | None = None
    """Set by `workers`: the time-skipping server's client whose clock a long poll skips."""

    def activities(self) -> list[Any]:
        @activity.defn(name="start_process")
        async def start_process(inp: StartProcessInput) -> ProcessHandle:
            again = any(
                s.job_id == inp.job_id and s.attempt == inp.attempt and s.node.rank == inp.node.rank
                for s in self.started
            )
            if not again:
                self.started.append(inp)
            return ProcessHandle(
                job_id=inp.job_id,
                attempt=inp.attempt,
                rank=inp.node.rank,
                pid=4242,
                log_path="/dev/null",
                already_running=again,
                exited=self.at_start(inp),
            )

        @activity.defn(name="probe_process")
        async def probe_process(inp: ProbeInput) -> ProbeResult:
            key = (inp.job_id, inp.attempt, inp.rank)
            self.probes[key] = self.probes.get(key, 0) + 1
            answer = self.probe(inp, self.probes[key])
            if answer.state == "running" and inp.wait_s > 0:
                await self.wait(inp.wait_s)
            return answer

        @activity.defn(name="stop_process")
        async def stop_process(inp: StopProcessInput) -> StopProcessResult:
            self.stopped.append(inp)
            return StopProcessResult(was_running=True, signal="TERM")

        @activity.defn(name="read_logs")
        async def read_logs(inp: LogsInput) -> LogChunk:
            return LogChunk(data="", next_offset=0)

        return [start_process, probe_process, stop_process, read_logs]

    async def wait(self, seconds: float) -> None:
        """A probe's wait for an exit that does not come, in server time."""
        if not self.long_poll or self.client is None:
            return
        # In steps under the probe's heartbeat timeout, each after a heartbeat (flushed at
        # once: see the host workers' throttle), as an agent's wait heartbeats.
        while seconds > 0:
            step = min(seconds, HEARTBEAT_STEP_S)
            activity.heartbeat()
            await asyncio.sleep(0.01)
            request = SleepRequest()
            request.duration.FromTimedelta(timedelta(seconds=step))
            await self.client.test_service.unlock_time_skipping_with_sleep(request)
            seconds -= step


def idle_samples(
    util: float, gpus: list[int] | None = None
) -> Callable[[ProbeInput, int], ProbeResult]:
    """A probe that reports a running process whose GPUs sit at `util` percent."""

    def probe(inp: ProbeInput, n: int) -> ProbeResult:
        now = activity.info().current_attempt_scheduled_time.timestamp()
        return ProbeResult(
            state="running",
            samples=[
                GpuSample(
                    gpu=g, ts=now, utilization=util, memory_used_mib=100, memory_total_mib=81920
                )
                for g in (gpus or inp.gpu_indices)
            ],
        )

    return probe


@asynccontextmanager
async def workers(
    client: Client,
    store: Store,
    task_queue: str,
    hosts: ScriptedHosts,
    fleets: list[FleetSpec],
    control: ControlActivities | None = None,
) -> AsyncIterator[None]:
    control = control or ControlActivities(store, temporal=client, task_queue=task_queue)
    hosts.client = client
    async with AsyncExitStack() as stack:
        executor = stack.enter_context(ThreadPoolExecutor(max_workers=4))
        await stack.enter_async_context(
            Worker(
                client,
                task_queue=task_queue,
                workflows=[JobWorkflow, AdmissionWorkflow],
                workflow_runner=checked_workflow_runner(),
                activities=control.activities(),
                activity_executor=executor,
            )
        )
        for fleet in fleets:
            for host in fleet.hosts:
                await stack.enter_async_context(
                    Worker(
                        client,
                        task_queue=f"gpuflow-host-{fleet.name}/{host.name}",
                        activities=hosts.activities(),
                        # Heartbeats reach the server at once: a cancelled probe learns it
                        # at its next one, and a long poll's skipped time never outruns them.
                        default_heartbeat_throttle_interval=timedelta(milliseconds=5),
                        max_heartbeat_throttle_interval=timedelta(milliseconds=5),
                    )
                )
        stack.push_async_callback(_end_admission, client, task_queue)
        yield


async def _end_admission(client: Client, task_queue: str) -> None:
    """The admission loop never ends on its own: a loop left open would keep the shared
    time-skipping server's clock for later tests."""
    handle = client.get_workflow_handle(admission_workflow_id(task_queue))
    with contextlib.suppress(RPCError):
        # Idle, not in the middle of a pass or a workflow task: one cut off by a terminate stops
        # that clock too.
        idle = 0
        for _ in range(200):
            raw = (await handle.describe()).raw_description
            busy = raw.pending_activities or raw.HasField("pending_workflow_task")
            idle = 0 if busy else idle + 1
            if idle >= 3:
                break
            await asyncio.sleep(0.02)
        await handle.terminate()


async def start_job(client: Client, task_queue: str, spec: JobSpec) -> WorkflowHandle[Any, Any]:
    job_id = f"job-{spec.name}-{uuid.uuid4().hex[:6]}"
    return await client.start_workflow(
        JobWorkflow.run,
        JobInput(job_id=job_id, spec=spec, search_attributes=False),
        id=job_id,
        task_queue=task_queue,
    )


def job(name: str = "train", **fields: Any) -> JobSpec:
    data: dict[str, Any] = {
        "name": name,
        "commands": ["python train.py"],
        "resources": {"gpu": "A100:1"},
    }
    data.update(fields)
    return JobSpec.model_validate(data)
