"""The job throughput benchmark's load (job_throughput.py): items started in a burst, one at a
time, or at a steady rate, and the jobs phase, which runs `true` jobs through the control worker
and the client the CLI uses.

Temporal's sandbox imports this module afresh for every baseline workflow, as it does
job_throughput.py: keep its top level to stdlib, import the rest inside functions.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

from benchmarks.throughput_figures import GPUS_PER_HOST, CpuMeter, Phase

T = TypeVar("T")


def as_utc(value: datetime) -> datetime:
    # SQLite hands datetimes back without a zone; gpuflow writes them in UTC.
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


async def run_burst(
    n: int, concurrency: int, one: Callable[[int, asyncio.Semaphore], Awaitable[T]]
) -> list[T]:
    gate = asyncio.Semaphore(concurrency)
    return list(await asyncio.gather(*(one(i, gate) for i in range(n))))


async def run_alone(
    first: int, count: int, one: Callable[[int, asyncio.Semaphore], Awaitable[T]]
) -> list[T]:
    return [await one(first + k, asyncio.Semaphore(1)) for k in range(count)]


async def run_paced(
    first: int, count: int, rate: float, one: Callable[[int, asyncio.Semaphore], Awaitable[T]]
) -> list[T]:
    """`count` items started `1 / rate` seconds apart, whether or not earlier ones are done."""
    loop = asyncio.get_running_loop()
    t0 = loop.time()

    async def at(k: int) -> T:
        await asyncio.sleep(max(0.0, t0 + k / rate - loop.time()))
        return await one(first + k, asyncio.Semaphore(1))

    return list(await asyncio.gather(*(at(k) for k in range(count))))


async def measure_jobs(
    home: Path,
    address: str,
    server_pid: int,
    *,
    n: int,
    concurrency: int,
    hosts: int,
    solo: int,
    paced: int,
    rate: float,
) -> Phase:
    from gpuflow.client import Client
    from gpuflow.config import TemporalConfig
    from gpuflow.control.embedded import control_plane
    from gpuflow.services.fleets import apply_fleet
    from gpuflow.services.jobs import find_job
    from gpuflow.specs import FleetSpec, JobSpec
    from gpuflow.status import JobStatus
    from gpuflow.store.db import Store

    config = TemporalConfig(address=address, embedded=True)
    database_url = f"sqlite:///{home / 'gpuflow.db'}"
    store = await asyncio.to_thread(lambda: Store(database_url).init())
    fleet = FleetSpec.model_validate(
        {
            "type": "fleet",
            "name": "bench",
            "kind": "sim",
            "hosts": [
                {
                    "name": f"sim-{i:03d}",
                    "cpus": 64,
                    "memory": "512GB",
                    "gpus": [
                        {
                            "name": "A100",
                            "memory": "80GB",
                            "count": GPUS_PER_HOST,
                            "compute_capability": "8.0",
                        }
                    ],
                }
                for i in range(hosts)
            ],
        }
    )
    await asyncio.to_thread(apply_fleet, store, fleet)
    client = await Client.connect(config=config)
    meter = CpuMeter(server_pid)
    try:
        async with control_plane(config, store, home=home, local_agent=False):

            async def one(
                i: int, gate: asyncio.Semaphore
            ) -> tuple[str, datetime, float, float, float]:
                spec = JobSpec(
                    name=f"bench-{i}", commands=["true"], resources={"gpu": 1}, fleets=["bench"]
                )
                async with gate:
                    t0, submitted = time.perf_counter(), datetime.now(UTC)
                    info = await client.submit(spec)
                    t_submitted = time.perf_counter()
                result = await client.wait(info.id)
                if result.status != JobStatus.DONE:
                    raise RuntimeError(
                        f"job {info.id} ended {result.status.value}: {result.message}"
                    )
                return info.id, submitted, t0, t_submitted, time.perf_counter()

            # Warm-up: the first sandbox import of JobWorkflow and the first process start.
            await run_alone(n + solo, 1, one)
            meter.start()
            runs = await run_burst(n, concurrency, one)
            meter.stop()
            alone = await run_alone(n, solo, one)
            steady = await run_paced(n + solo + 1, paced, rate, one)

        async def timestamps(job_id: str, submitted: datetime) -> tuple[float, float]:
            row = await asyncio.to_thread(find_job, store, job_id)
            if row.started_at is None or row.finished_at is None:
                raise RuntimeError(f"job {job_id} has no started_at/finished_at in the store")
            return (
                (as_utc(row.started_at) - submitted).total_seconds() * 1000,
                (row.finished_at - row.started_at).total_seconds() * 1000,
            )

        burst = [await timestamps(r[0], r[1]) for r in runs]
        first = min(r[2] for r in runs)
        last = max(r[4] for r in runs)
        return Phase(
            per_s=n / (last - first),
            to_running_ms=[ms for ms, _ in burst],
            alone_ms=[(await timestamps(r[0], r[1]))[0] for r in alone],
            paced_ms=[(await timestamps(r[0], r[1]))[0] for r in steady],
            cpu=meter,
            submit_call_ms=[(r[3] - r[2]) * 1000 for r in runs],
            running_to_done_ms=[ms for _, ms in burst],
        )
    finally:
        await client.close()
        await asyncio.to_thread(store.dispose)
