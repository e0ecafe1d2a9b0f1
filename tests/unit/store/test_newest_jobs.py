"""A fleet's newest jobs read from the first rows of the index for every fleet (`newest_few`)
are those the filtered read gives (`newest_ids`), whatever the fleets' shares, ties of
submission time, pending jobs without a fleet or the table's size; on SQLite and PostgreSQL."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import event
from sqlalchemy.engine import Engine

from gpuflow.services import newest_jobs
from gpuflow.services.newest_jobs import MAX_SPREAD, newest_few, newest_ids
from gpuflow.status import JobStatus
from gpuflow.store.bulk import insert_rows
from gpuflow.store.db import Store
from gpuflow.store.tables import JobRow

START = datetime(2026, 1, 1, tzinfo=UTC)
STATUSES = [JobStatus.PENDING, JobStatus.DONE, JobStatus.RUNNING, JobStatus.FAILED]


def _jobs(
    store: Store, rng: random.Random, count: int, fleets: list[str | None], *, day: int = 0
) -> None:
    rows = []
    for n in range(count):
        rows.append(
            {
                "id": f"job-{rng.randrange(10**9):09d}-{n}",
                "name": "x",
                "status": rng.choice(STATUSES).value,
                "spec": {},
                "attempt": 1,
                "message": "",
                "fleet": rng.choice(fleets),
                # ties on purpose: the id breaks them
                "submitted_at": START + timedelta(days=day, seconds=rng.randrange(count // 3 + 1)),
            }
        )
    with store.session() as session:
        insert_rows(session, JobRow, rows)
        session.commit()


@pytest.fixture(autouse=True)
def _no_spread_between_tests() -> Any:
    newest_jobs._SPREAD.clear()
    yield
    newest_jobs._SPREAD.clear()


@pytest.mark.parametrize("seed", range(3))
def test_the_index_read_gives_the_filtered_reads_ids(store: Store, seed: int) -> None:
    rng = random.Random(seed)
    fleets: list[str | None] = ["a", "a", "a", "b", None, "c"][: 3 + seed]
    _jobs(store, rng, 600, fleets)
    for _ in range(12):
        fleet = rng.choice(["a", "b", "c"])
        count = rng.choice([1, 7, 50, 200, 700])
        with store.read() as session:
            assert newest_few(session, fleet, count) == newest_ids(session, fleet, count)
        _jobs(store, rng, 40, fleets)  # more come between reads


def test_one_fleet_reads_as_many_rows_as_ids_and_a_small_share_the_filtered_read(
    store: Store,
) -> None:
    rng = random.Random(7)
    _jobs(store, rng, 400, ["a"])
    statements: list[str] = []

    def seen(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        if statement.lower().startswith("select"):  # not SQLite's BEGIN
            statements.append(statement.lower())

    event.listen(Engine, "before_cursor_execute", seen)
    try:
        with store.read() as session:
            first = newest_few(session, "a", 100)
        assert len(first) == 100 and len(statements) == 1 and "where" not in statements[0]
        _jobs(store, rng, 4000, ["b"] * 99 + ["a"], day=1)  # "a": 1% of the newest
        for _ in range(4):
            statements.clear()
            with store.read() as session:
                assert newest_few(session, "a", 100) == newest_ids(session, "a", 100)
        with store.read() as session:
            key = (str(session.get_bind().engine.url), "a")
        assert newest_jobs._SPREAD[key] > MAX_SPREAD
        # past the bound, only the filtered read (and the test's own)
        assert sum("where" in statement for statement in statements) == 2
        assert len(statements) == 2
    finally:
        event.remove(Engine, "before_cursor_execute", seen)
