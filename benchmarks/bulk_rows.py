"""Where an INSERT of several rows on PostgreSQL is cheaper as one statement over arrays than as
psycopg's executemany: what `ARRAYS_FROM` in gpuflow/store/bulk.py rests on.

For each table a group of submits writes (gpuflow/services/group_entry.py: the job rows, their
`submitted` records, their allocations) and each row count N, `insert_rows` runs both ways,
alternately, in a transaction of its own on a fresh database (the rows as a group writes them:
a job with a spec of about a kilobyte of JSON; an allocation with its node as placed, its ids
returned); the median time of the call is printed for each way, the transaction's commit left
out.

    python benchmarks/bulk_rows.py
    python benchmarks/bulk_rows.py --rows 1,4,32 --repeat 50
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for path in (ROOT, ROOT / "benchmarks"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from fleet_db import POSTGRESQL, fresh_database  # noqa: E402
from sqlmodel import SQLModel  # noqa: E402

from gpuflow.store import bulk  # noqa: E402
from gpuflow.store.db import Store  # noqa: E402
from gpuflow.store.tables import AllocationRow, JobEventRow, JobRow  # noqa: E402

SPEC: dict[str, Any] = {
    "name": "train",
    "commands": ["python train.py --epochs 3"],
    "resources": {"gpu": "A100:1", "cpus": 8, "memory": "32GB"},
    "env": {f"SETTING_{k}": "x" * 40 for k in range(12)},
}
"""About a kilobyte of JSON, as a job's dumped spec is."""

Rows = Callable[[str, int], tuple[type[SQLModel], list[dict[str, Any]], str | None]]


def _events(tag: str, n: int) -> tuple[type[SQLModel], list[dict[str, Any]], str | None]:
    rows = [
        {"job_id": f"{tag}-{i}", "key": "submitted", "kind": "pending", "message": "submitted"}
        for i in range(n)
    ]
    return JobEventRow, rows, None


def _jobs(tag: str, n: int) -> tuple[type[SQLModel], list[dict[str, Any]], str | None]:
    rows = [
        {"id": f"{tag}-{i}", "name": "train", "status": "pending", "spec": SPEC, "message": "s"}
        for i in range(n)
    ]
    return JobRow, rows, None


def _allocations(tag: str, n: int) -> tuple[type[SQLModel], list[dict[str, Any]], str | None]:
    node = {"rank": 0, "host_id": "h", "fleet": "f", "gpu_indices": [0], "simulated": True}
    rows = [
        {
            "job_id": f"{tag}-{i}",
            "attempt": 1,
            "rank": 0,
            "fleet": "f",
            "host_id": "h",
            "gpu_indices": [i % 8],
            "cpus": 8.0,
            "memory_mib": 32768,
            "node": node,
            "score": 1.0,
            "scorer": "fragmentation",
        }
        for i in range(n)
    ]
    return AllocationRow, rows, "id"


TABLES: dict[str, Rows] = {"job_events": _events, "jobs": _jobs, "allocations": _allocations}


def _always(connection: Any, rows: Any) -> bool:
    return True


def _never(connection: Any, rows: Any) -> bool:
    return False


def measure(store: Store, make: Rows, n: int, repeat: int) -> tuple[float, float]:
    """Median ms of `insert_rows` as arrays and as executemany, for n rows."""
    found: dict[bool, list[float]] = {True: [], False: []}
    fit = bulk._arrays_fit
    try:
        for k in range(repeat):
            for arrays in (True, False):
                setattr(  # noqa: B010 (a stand-in, put back below)
                    bulk,
                    "_arrays_fit",
                    (lambda c, r: c.dialect.name == "postgresql")
                    if arrays
                    else (lambda c, r: False),
                )
                model, rows, returning = make(f"{n}-{k}-{arrays}", n)
                with store.session() as session:
                    session.connection()
                    begun = time.perf_counter()
                    bulk.insert_rows(session, model, rows, returning=returning)
                    found[arrays].append(time.perf_counter() - begun)
                    session.commit()
    finally:
        setattr(bulk, "_arrays_fit", fit)  # noqa: B010
    return statistics.median(found[True]) * 1000, statistics.median(found[False]) * 1000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--postgresql", default=POSTGRESQL, help="a server to make a database on")
    parser.add_argument("--rows", default="1,2,3,4,6,8,16,32", help="row counts")
    parser.add_argument("--repeat", type=int, default=120, help="calls per way and row count")
    args = parser.parse_args(argv)
    counts = [int(n) for n in args.rows.split(",")]
    print(f"{'table':12} {'rows':>4} {'arrays ms':>10} {'executemany ms':>15}  cheaper")
    with fresh_database("postgresql", args.postgresql) as url:
        store = Store(url).init()
        try:
            for table, make in TABLES.items():
                for n in counts:
                    arrays, rows = measure(store, make, n, args.repeat)
                    cheaper = "arrays" if arrays < rows else "executemany"
                    print(f"{table:12} {n:>4} {arrays:>10.3f} {rows:>15.3f}  {cheaper}")
        finally:
            store.dispose()
    print(f"(store/bulk.py ARRAYS_FROM = {bulk.ARRAYS_FROM})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
