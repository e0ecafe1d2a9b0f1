"""The database side of benchmarks/fleet_scale.py and admission_scale.py: openb's nodes as a sim
fleet, a fresh database of either kind, a job's record, the over-allocation count, and ANALYZE
run beside a benchmark as autovacuum would."""

from __future__ import annotations

import tempfile
import threading
import uuid
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from openb import GPU_MEMORY_MIB, Node

from gpuflow.specs import FleetSpec
from gpuflow.status import JobStatus
from gpuflow.store.db import Store
from gpuflow.store.tables import AllocationRow, HostRow
from gpuflow.workflows.models import JobStatusInput

ROOT = Path(__file__).resolve().parent.parent
_TRACE_DIRS = (ROOT.parent / "shared/data/openb", Path("/work/shared/data/openb"))
POSTGRESQL = "postgresql://postgres@127.0.0.1:5432/test"
EPSILON = 1e-6


def fleet_spec(nodes: list[Node]) -> FleetSpec:
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


def record_of(job_id: str, job: Any, status: JobStatus, **fields: Any) -> JobStatusInput:
    return JobStatusInput(
        job_id=job_id,
        name=job.name,
        status=status,
        attempt=1,
        event_key=f"1:{status.value}:{fields.get('reason') or ''}",
        at=datetime.now(UTC),
        **fields,
    )


@contextmanager
def fresh_database(kind: str, postgresql: str) -> Iterator[str]:
    """The URL of an empty database of this kind, removed afterwards."""
    if kind == "sqlite":
        with tempfile.TemporaryDirectory() as home:
            yield f"sqlite:///{Path(home) / 'gpuflow.db'}"
        return
    import psycopg

    name = f"fleet_scale_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgresql, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"{postgresql.rsplit('/', 1)[0]}/{name}"
    finally:
        with psycopg.connect(postgresql, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def over_allocations(store: Store) -> int:
    """GPUs held beyond one whole GPU, and hosts whose CPUs or memory are held beyond theirs."""
    with store.read() as session:
        rows = session.connection().execute(
            AllocationRow.__table__.select()  # type: ignore[attr-defined]
        )
        gpus: dict[tuple[str, int], float] = defaultdict(float)
        cpus: dict[str, float] = defaultdict(float)
        memory: dict[str, int] = defaultdict(int)
        for row in rows.mappings():
            for index in row["gpu_indices"]:
                gpus[row["host_id"], index] += row["gpu_fraction"] or 1.0
            cpus[row["host_id"]] += row["cpus"]
            memory[row["host_id"]] += row["memory_mib"]
        hosts = {
            host.id: host
            for host in session.connection().execute(
                HostRow.__table__.select()  # type: ignore[attr-defined]
            )
        }
    over = sum(used > 1 + EPSILON for used in gpus.values())
    over += sum(cpus[h] > hosts[h].cpus + EPSILON for h in cpus)
    return int(over + sum(memory[h] > hosts[h].memory_mib for h in memory))


@contextmanager
def analyzed(url: str, every_s: float | None) -> Iterator[None]:
    """With `every_s` on PostgreSQL: ANALYZE the database every `every_s` seconds from a
    connection of its own while the block runs, as autovacuum does on a server that has run for
    a while (its first pass comes after a minute, so a fresh database's planner knows nothing
    of the tables during a run of seconds)."""
    if every_s is None or url.startswith("sqlite"):
        yield
        return
    import psycopg

    stop = threading.Event()

    def loop() -> None:
        with psycopg.connect(url.replace("postgresql+psycopg", "postgresql"), autocommit=True) as c:
            while not stop.wait(every_s):
                c.execute("ANALYZE")

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
