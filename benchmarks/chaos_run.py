"""A chaos run (chaos.py): the sim fleet and the jobs, the kill loop that submits them in bursts
while it kills the control worker and the dev server, the wait for every job to end, and the
figures read after.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.chaos_evidence import (
    Sampler,
    job_commands,
    read_allocations,
    read_markers,
    read_only_engine,
    read_statuses,
)
from benchmarks.chaos_stack import Stack, job_processes, say

FLEET = "chaos"
GPUS = {"chaos-a": 4, "chaos-b": 2}
BURST = sum(GPUS.values()) + 2
"""Jobs submitted at once: more than the fleet holds, so some wait for capacity."""
FINAL = {"done", "failed", "terminated", "stopped"}


def fleet_spec() -> Any:
    from gpuflow.specs import FleetSpec

    hosts = [
        {
            "name": name,
            "cpus": 32,
            "memory": "256GB",
            "gpus": [{"name": "A100", "memory": "80GB", "count": n}],
        }
        for name, n in GPUS.items()
    ]
    return FleetSpec.model_validate({"type": "fleet", "name": FLEET, "kind": "sim", "hosts": hosts})


@dataclass
class Options:
    kills: int
    server_kills: int
    jobs: int
    seed: int
    job_seconds: tuple[float, float]
    uptime: tuple[float, float]
    deadline: float
    sample_interval: float


def kill_schedule(kills: int, server_kills: int) -> list[str]:
    """The order of the kills: server kills evenly among the worker kills."""
    events = ["worker"] * kills
    for k in reversed(range(server_kills)):
        events.insert(round((k + 1) * kills / (server_kills + 1)), "server")
    return events


def job_specs(opts: Options, marks: Path, rng: random.Random) -> list[Any]:
    from gpuflow.specs import JobSpec

    return [
        JobSpec.model_validate(
            {
                "name": f"chaos-{i}",
                "commands": job_commands(marks, rng.uniform(*opts.job_seconds)),
                "resources": {"gpu": 2 if i % 4 == 3 else 1},
                "fleets": [FLEET],
                "retry": True,
            }
        )
        for i in range(opts.jobs)
    ]


@dataclass
class Chaos:
    """One run: the stack, the client that submits, the sampler, and what happened."""

    stack: Stack
    opts: Options
    client: Any
    sampler: Sampler
    rng: random.Random
    job_ids: list[str] = field(default_factory=list)
    kills: int = 0
    server_kills: int = 0
    hot_kills: int = 0
    """Kills that came while some job held GPUs."""
    server_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    """No submit while the server is down: a retried start could create the job twice."""

    async def submit(self, batch: list[Any]) -> None:
        for spec in batch:
            async with self.server_lock:
                self.job_ids.append((await self.client.submit(spec)).id)

    async def kill_loop(self, specs: list[Any]) -> None:
        events = kill_schedule(self.opts.kills, self.opts.server_kills)
        # Bursts spread over the loop, so kills land while jobs wait, start, run and end.
        bursts = [specs[i : i + BURST] for i in range(0, len(specs), BURST)]
        due: dict[int, list[Any]] = defaultdict(list)
        for b, batch in enumerate(bursts):
            due[b * len(events) // len(bursts)].extend(batch)
        submitting = []
        for e, event in enumerate(events):
            if e in due:
                submitting.append(asyncio.create_task(self.submit(due.pop(e))))
            t_ready = time.monotonic()
            await asyncio.to_thread(self.stack.wait_worker)
            ready_s = time.monotonic() - t_ready
            await asyncio.sleep(self.rng.uniform(*self.opts.uptime))
            self.hot_kills += self.sampler.held_now > 0
            if event == "worker":
                self.stack.kill_worker()
                self.kills += 1
                self.stack.start_worker()
            else:
                await self.kill_server()
            say(
                f"{event} kill {e + 1}/{len(events)} (worker up after {ready_s:.1f}s); "
                f"{len(self.job_ids)}/{self.opts.jobs} submitted, "
                f"{self.sampler.held_now} allocations held"
            )
        for batch in due.values():  # no kills at all: submit everything now
            submitting.append(asyncio.create_task(self.submit(batch)))
        await asyncio.gather(*submitting)

    async def kill_server(self) -> None:
        async with self.server_lock:
            self.stack.kill_server()
            self.server_kills += 1
            outage = self.rng.uniform(0.5, 3.0)
            say(f"dev server killed; restarting in {outage:.1f}s")
            await asyncio.sleep(outage)
            await asyncio.to_thread(self.stack.start_server)

    async def wait_for_jobs(self, engine: Any) -> None:
        """Until every job's status is final or the deadline passes."""
        deadline = time.monotonic() + self.opts.deadline
        while time.monotonic() < deadline:
            await asyncio.to_thread(self.stack.wait_worker)  # one that exited is restarted
            statuses = await asyncio.to_thread(read_statuses, engine)
            left = [j for j in self.job_ids if statuses.get(j, ("?", 0))[0] not in FINAL]
            if not left:
                return
            say(f"waiting for {len(left)} job(s) to end")
            await asyncio.sleep(5)

    async def figures(self, engine: Any, started: float) -> dict[str, Any]:
        statuses = await asyncio.to_thread(read_statuses, engine)
        leftover = await asyncio.to_thread(read_allocations, engine)

        def status(job_id: str) -> str:
            return statuses.get(job_id, ("?", 0))[0]

        leaked = sum(1 for row in leftover if status(row[0]) in FINAL | {"?"})
        lost = 0
        for job_id in self.job_ids:
            try:
                handle = self.client.temporal.get_workflow_handle(job_id)
                closed = (await handle.describe()).close_time
            except Exception:  # the workflow vanished
                closed = None
            lost += status(job_id) not in FINAL or closed is None
        twice, overlaps, unended = read_markers(self.stack.home / "marks", self.stack.home)
        return {
            "kills": self.kills,
            "server_kills": self.server_kills,
            "jobs": len(self.job_ids),
            "done": sum(1 for j in self.job_ids if status(j) == "done"),
            "lost": lost,
            "started_twice": twice,
            "double_allocations": len(self.sampler.conflicts) + overlaps,
            "leaked_allocations": leaked,
            "seconds": round(time.monotonic() - started, 1),
            "details": {
                "seed": self.opts.seed,
                "allocation_samples": self.sampler.samples,
                "sample_errors": self.sampler.errors,
                "table_double_allocations": len(self.sampler.conflicts),
                "marker_overlaps": overlaps,
                "runs_without_end_marker": unended,
                "kills_while_gpus_held": self.hot_kills,
                "most_allocations_held": self.sampler.held_most,
                "worker_starts": self.stack.worker_starts,
                "worker_exits": self.stack.worker_exits,
                "retried_jobs": sum(1 for j in self.job_ids if statuses.get(j, ("?", 1))[1] > 1),
                "statuses": dict(Counter(status(j) for j in self.job_ids)),
                "allocations_left": len(leftover),
                "job_processes_left": len(job_processes(self.stack.home)),
            },
        }


async def run(stack: Stack, opts: Options) -> dict[str, Any]:
    from gpuflow.client import Client
    from gpuflow.config import TemporalConfig
    from gpuflow.workflows.fleet import PING_INTERVAL

    started = time.monotonic()
    rng = random.Random(opts.seed)
    say(f"dev server on {stack.address}, home {stack.home}")
    await asyncio.to_thread(stack.start_server)
    client = await Client.connect(config=TemporalConfig(address=stack.address, embedded=True))
    stack.start_worker()
    await client.apply_fleet(fleet_spec())  # answered by the control worker: start it first
    await asyncio.to_thread(stack.wait_worker)
    sampler = Sampler(read_only_engine(stack.database_url), opts.sample_interval)
    sampler.start()
    say(f"control worker up; {opts.kills} + {opts.server_kills} kills, {opts.jobs} jobs")
    chaos = Chaos(stack=stack, opts=opts, client=client, sampler=sampler, rng=rng)
    engine = read_only_engine(stack.database_url)
    try:
        await chaos.kill_loop(job_specs(opts, stack.home / "marks", rng))
        await chaos.wait_for_jobs(engine)
        health_s = PING_INTERVAL.total_seconds() + 5
        say(f"jobs ended (or the deadline passed); one health interval more ({health_s:.0f}s)")
        await asyncio.sleep(health_s)
        sampler.stop()
        return await chaos.figures(engine, started)
    finally:
        sampler.stop()
        engine.dispose()
        await client.close()
