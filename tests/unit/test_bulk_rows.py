"""benchmarks/bulk_rows.py measures both ways it says it does, and leaves the product's choice as
it found it."""

from __future__ import annotations

import sys
from pathlib import Path

from sqlalchemy import event
from sqlmodel import func, select

from gpuflow.store import bulk
from gpuflow.store.db import Store
from gpuflow.store.tables import AllocationRow

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bulk_rows


def test_each_way_writes_its_rows_as_it_says(postgres_store: Store) -> None:
    unnest: list[bool] = []

    def seen(*args: object) -> None:
        unnest.append("unnest" in str(args[2]))

    fit = bulk._arrays_fit
    event.listen(postgres_store.engine, "before_cursor_execute", seen)
    try:
        arrays, rows = bulk_rows.measure(postgres_store, bulk_rows._allocations, 5, 2)
    finally:
        event.remove(postgres_store.engine, "before_cursor_execute", seen)
    assert bulk._arrays_fit is fit
    assert arrays > 0 and rows > 0
    assert unnest.count(True) == 2 and unnest.count(False) >= 2  # alternately, twice each
    with postgres_store.read() as session:
        assert session.exec(select(func.count()).select_from(AllocationRow)).one() == 4 * 5
