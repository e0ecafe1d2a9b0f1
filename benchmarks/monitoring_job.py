"""One job of the monitoring benchmark (monitoring.py) from submit to close: the real JobWorkflow
and control activities on a fresh sim fleet and SQLite store, the host agent replaced by
scripted activities whose probe is a long poll over a scripted GPU, all in the time-skipping
server's clock; and what the server recorded of the run.
"""

from __future__ import annotations

import tempfile
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from temporalio import activity
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from gpuflow.services.jobs import find_job
from gpuflow.store.db import Store
from gpuflow.utilization import GpuSample
from gpuflow.workflows.models import JobResult, ProbeInput, ProbeResult
from gpuflow.workflows.outcome import job_result
from tests.workflow.harness import ScriptedHosts, job, sim_fleet, start_job, workers

THRESHOLD = 50
"""The jobs' `min_gpu_utilization`."""
BUSY, IDLE = 90.0, 0.0


@dataclass
class GpuScript:
    """One job's GPU and process, in server time.

    Probes are long polls, as the agent's are: each waits up to its tick (skipping the server's
    clock) and answers at once when the process exits, else at the tick with one sample per GPU
    stamped with the server time. The GPU is busy until the first sample at least `idle_after`
    seconds past the first probe; that sample still reads busy and the GPU goes idle right after
    it (`idle_at`), the worst phase for detection. Never idle if None. The process exits 0 at
    `exit_after` seconds past the first probe (`exit_at`), in the middle of a wait.
    """

    idle_after: float | None = None
    exit_after: float | None = None
    first_probe: float | None = None
    idle_at: float | None = None
    exit_at: float | None = None
    probes: int = 0

    async def probe(self, inp: ProbeInput, hosts: ScriptedHosts) -> ProbeResult:
        now = activity.info().current_attempt_scheduled_time.timestamp()
        if self.first_probe is None:
            self.first_probe = now
        self.probes += 1
        if self.exit_after is not None:
            self.exit_at = self.first_probe + self.exit_after
            if self.exit_at <= now + inp.wait_s:
                await hosts.wait(max(self.exit_at - now, 0.0))
                return ProbeResult(state="exited", exit_code=0, leftovers=False)
        await hosts.wait(inp.wait_s)
        at = now + inp.wait_s
        util = BUSY
        if self.idle_at is not None and at > self.idle_at:
            util = IDLE
        elif (
            self.idle_at is None
            and self.idle_after is not None
            and at >= self.first_probe + self.idle_after
        ):
            self.idle_at = at
        return ProbeResult(
            state="running",
            samples=[
                GpuSample(
                    gpu=g, ts=at, utilization=util, memory_used_mib=1000, memory_total_mib=81920
                )
                for g in inp.gpu_indices
            ],
        )


@dataclass
class LongPollHosts(ScriptedHosts):
    """Scripted host activities whose probe is the script's long poll."""

    script: GpuScript = field(default_factory=GpuScript)

    def activities(self) -> list[Any]:
        @activity.defn(name="probe_process")
        async def probe_process(inp: ProbeInput) -> ProbeResult:
            return await self.script.probe(inp, self)

        start, _, *rest = super().activities()
        return [start, probe_process, *rest]


@dataclass
class Run:
    """One job's outcome as the server recorded it."""

    result: JobResult
    started_at: datetime
    closed_at: datetime
    history_sizes: list[int]
    finished_at: datetime | None
    wall_s: float
    probes: int

    @property
    def hours(self) -> float:
        return (self.closed_at - self.started_at).total_seconds() / 3600


async def history_sizes(client: Client, workflow_id: str, first_run_id: str) -> list[int]:
    """Events of each run of a continue-as-new chain, first run first."""
    sizes = []
    run_id: str | None = first_run_id
    while run_id:
        history = await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
        sizes.append(len(history.events))
        last = history.events[-1]
        run_id = None
        if last.HasField("workflow_execution_continued_as_new_event_attributes"):
            run_id = last.workflow_execution_continued_as_new_event_attributes.new_execution_run_id
    return sizes


async def run_job(env: WorkflowEnvironment, script: GpuScript, window: str | None) -> Run:
    """One 1-GPU job on a fresh sim fleet and store, from submit to close; no utilization
    policy when `window` is None."""
    client = env.client
    with tempfile.TemporaryDirectory(prefix="gpuflow-monitoring-") as scratch:
        store = Store(f"sqlite:///{Path(scratch) / 'gpuflow.db'}").init()
        try:
            fleet = sim_fleet(store)
            hosts = LongPollHosts(script=script, long_poll=True)
            task_queue = f"tq-{uuid.uuid4().hex[:8]}"
            wall = time.perf_counter()
            async with workers(client, store, task_queue, hosts, [fleet]):
                policy = (
                    None
                    if window is None
                    else {"min_gpu_utilization": THRESHOLD, "time_window": window}
                )
                handle = await start_job(client, task_queue, job(utilization_policy=policy))
                result = await job_result(handle)
            wall_s = time.perf_counter() - wall
            assert handle.first_execution_run_id is not None
            first = await client.get_workflow_handle(
                handle.id, run_id=handle.first_execution_run_id
            ).describe()
            last = await client.get_workflow_handle(handle.id).describe()
            assert last.close_time is not None
            sizes = await history_sizes(client, handle.id, handle.first_execution_run_id)
            row = find_job(store, result.job_id)
            finished_at = row.finished_at if row is not None else None
        finally:
            store.dispose()
    return Run(
        result=result,
        started_at=first.start_time,
        closed_at=last.close_time,
        history_sizes=sizes,
        finished_at=finished_at,
        wall_s=wall_s,
        probes=script.probes,
    )
