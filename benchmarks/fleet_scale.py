"""The product's place step at fleet scale: the control worker's `place_job` and `release_job`
activities (gpuflow/control/activities.py), called with the inputs the job workflow sends (the
job's first record before placing, its `provisioning` record once placed, its ending with the
release), on a sim fleet of openb's GPU nodes, on a real SQLite file (or PostgreSQL with
`--database URL`). Only Temporal is left out: each call is timed as the activity runs it. The
job rows it writes feed the fleet's learned request mix, as in the product.

The fleet is applied with `apply_fleet` (1,213 hosts; `--hosts N` takes the first N). Jobs are
the openb `default` trace's pods as gpuflow jobs (benchmarks/placement.py's loader and
`job_of`), in a seeded order. First `--fill` jobs are taken, then `--steps` steps each take the
next job and release the oldest one held, so the fleet stays about as full: the cold path
(`ControlActivities(warm=False)`: the whole fleet read and indexed in every transaction, as
before #10), then the
warm path, on the same database in the same run. Reported per path: take and release median
and p99 in ms, and takes per second (1 / mean take).

    python benchmarks/fleet_scale.py
    python benchmarks/fleet_scale.py --hosts 300 --steps 200 --json out.json
    python benchmarks/fleet_scale.py --database postgresql://postgres@127.0.0.1:5432/test
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from collections import deque
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for path in (ROOT, ROOT / "benchmarks"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from placement import GPU_MEMORY_MIB, job_of, load_nodes, load_pods  # noqa: E402

from gpuflow.control.activities import ControlActivities  # noqa: E402
from gpuflow.services.fleets import apply_fleet  # noqa: E402
from gpuflow.specs import FleetSpec  # noqa: E402
from gpuflow.status import JobStatus, TerminationReason  # noqa: E402
from gpuflow.store.db import Store  # noqa: E402
from gpuflow.workflows.models import JobStatusInput, PlaceInput, ReleaseInput  # noqa: E402

_TRACE_DIRS = (ROOT.parent / "shared/data/openb", Path("/work/shared/data/openb"))


def fleet_spec(trace_dir: Path, hosts: int | None) -> FleetSpec:
    nodes = load_nodes(trace_dir / "openb_node_list_gpu_node.csv")[:hosts]
    return FleetSpec.model_validate(
        {
            "type": "fleet",
            "name": "openb",
            "kind": "sim",
            "hosts": [
                {
                    "name": node.name,
                    "cpus": node.cpu_milli // 1000,
                    "memory": f"{node.memory_mib}MB",
                    "gpus": [
                        {
                            "name": node.model,
                            "memory": f"{GPU_MEMORY_MIB.get(node.model, 32768)}MB",
                            "count": node.gpus,
                        }
                    ],
                }
                for node in nodes
            ],
        }
    )


def _ms(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {"median_ms": statistics.median(ordered) * 1000, "p99_ms": p99 * 1000}


def _record(job_id: str, job: Any, status: JobStatus, **fields: Any) -> JobStatusInput:
    return JobStatusInput(
        job_id=job_id,
        name=job.name,
        status=status,
        attempt=1,
        event_key=f"1:{status.value}:{fields.get('reason') or ''}",
        at=datetime.now(UTC),
        **fields,
    )


async def measure(
    store: Store, jobs: list[Any], *, warm: bool, fill: int, steps: int
) -> dict[str, Any]:
    activities = ControlActivities(store, warm=warm)
    held: deque[tuple[str, Any]] = deque()
    takes: list[float] = []
    releases: list[float] = []
    failed = 0
    tag = "warm" if warm else "cold"

    async def release(job_id: str, job: Any) -> float:
        ended = _record(job_id, job, JobStatus.DONE, reason=TerminationReason.DONE)
        started = time.perf_counter()
        await activities.release_job(ReleaseInput(job_id=job_id, record=ended))
        return time.perf_counter() - started

    for n in range(fill + steps):
        job = jobs[n % len(jobs)]
        job_id = f"job-{tag}-{n}"
        place = PlaceInput(
            job_id=job_id,
            attempt=1,
            spec=job,
            before=_record(job_id, job, JobStatus.PENDING, spec=job, message="submitted"),
            placed=_record(job_id, job, JobStatus.PROVISIONING),
        )
        started = time.perf_counter()
        result = await activities.place_job(place)
        took = time.perf_counter() - started
        if result.placement is not None:
            held.append((job_id, job))
        else:
            failed += 1
        if n < fill:
            continue
        takes.append(took)
        if held:
            releases.append(await release(*held.popleft()))
    while held:
        await release(*held.popleft())
    return {
        "take": _ms(takes),
        "release": _ms(releases),
        "takes_per_s": len(takes) / sum(takes),
        "unschedulable": failed,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=None, help="the first N openb nodes")
    parser.add_argument("--database", default=None, help="a PostgreSQL URL (default: SQLite)")
    parser.add_argument("--fill", type=int, default=300, help="jobs taken before measuring")
    parser.add_argument("--steps", type=int, default=300, help="take + release steps measured")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--trace-dir", type=Path, default=None)
    parser.add_argument("--json", type=Path, help="write the results here as JSON")
    args = parser.parse_args(argv)
    trace_dir = args.trace_dir or next((d for d in _TRACE_DIRS if d.exists()), _TRACE_DIRS[0])
    spec = fleet_spec(trace_dir, args.hosts)
    pods = load_pods(trace_dir / "openb_pod_list_default.csv")
    random.Random(args.seed).shuffle(pods)
    jobs = [job_of(pod) for pod in pods[: args.fill + args.steps]]
    with tempfile.TemporaryDirectory() as home:
        store = Store(args.database or f"sqlite:///{Path(home) / 'gpuflow.db'}").init()
        try:
            apply_fleet(store, spec)
            results = {
                "hosts": len(spec.hosts),
                "database": "postgresql" if args.database else "sqlite",
                "cold": asyncio.run(
                    measure(store, jobs, warm=False, fill=args.fill, steps=args.steps)
                ),
                "warm": asyncio.run(
                    measure(store, jobs, warm=True, fill=args.fill, steps=args.steps)
                ),
            }
        finally:
            store.dispose()
    results["take_speedup"] = results["warm"]["takes_per_s"] / results["cold"]["takes_per_s"]
    print(f"{results['hosts']} hosts on {results['database']}")
    for path in ("cold", "warm"):
        r = results[path]
        print(
            f"  {path}: take {r['take']['median_ms']:.1f} / {r['take']['p99_ms']:.1f} ms "
            f"(median / p99), release {r['release']['median_ms']:.1f} / "
            f"{r['release']['p99_ms']:.1f} ms, {r['takes_per_s']:.1f} takes/s, "
            f"{r['unschedulable']} unschedulable"
        )
    print(f"  warm / cold takes per second: {results['take_speedup']:.1f}x")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
