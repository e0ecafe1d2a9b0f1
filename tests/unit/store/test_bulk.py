"""Rows written many at a time (gpuflow/store/bulk.py) are the rows the ORM would write: the
columns left out take the model's defaults and factories, and autoincrement keys are the
database's, on SQLite and PostgreSQL; on PostgreSQL several rows in one statement."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import event
from sqlmodel import select

from gpuflow.store.bulk import ARRAYS_FROM, insert_new_rows, insert_rows
from gpuflow.store.db import Store
from gpuflow.store.tables import AllocationRow, JobEventRow, JobRow


def test_rows_take_the_model_defaults(store: Store) -> None:
    with store.session() as session:
        session.add(JobEventRow(job_id="orm", key="k", kind="pending", message="m"))
        insert_rows(
            session,
            JobEventRow,
            [
                {"job_id": f"bulk-{n}", "key": "k", "kind": "pending", "message": "m"}
                for n in range(3)
            ],
        )
        insert_rows(
            session,
            AllocationRow,
            [{"job_id": "bulk-0", "attempt": 1, "rank": 0, "fleet": "f", "host_id": "h"}],
        )
        session.commit()
    with store.read() as session:
        events = session.exec(select(JobEventRow).order_by(JobEventRow.id)).all()
        allocation = session.exec(select(AllocationRow)).one()
    # the pending ORM row is flushed first: the writes keep the caller's order
    assert [e.job_id for e in events] == ["orm", "bulk-0", "bulk-1", "bulk-2"]
    assert len({e.id for e in events}) == 4 and all(e.ts is not None for e in events)
    assert allocation.gpu_indices == [] and allocation.blocks == [] and allocation.node == {}
    assert allocation.cpus == 0 and allocation.scorer == "" and allocation.created_at is not None
    assert allocation.gpu_fraction is None


def test_nothing_to_write_writes_nothing(sqlite_store: Store) -> None:
    with sqlite_store.session() as session:
        insert_rows(session, JobEventRow, [])
        session.commit()
    with sqlite_store.read() as session:
        assert session.exec(select(JobEventRow)).all() == []


@pytest.mark.parametrize("attempt", [1, "1"])
def test_returning_gives_each_row_its_id_in_order(store: Store, attempt: object) -> None:
    """The ids the database gave the rows, in the order of the rows (not of the ids: rows of
    another transaction may be numbered between them on PostgreSQL), also when a key column's
    value comes back as another type than it was given ("1" as 1)."""
    rows = [
        {"job_id": f"r-{n}", "attempt": attempt, "rank": n, "fleet": "f", "host_id": f"h{n % 3}"}
        for n in (5, 1, 4, 2)
    ]
    with store.session() as session:
        ids = insert_rows(session, AllocationRow, rows, returning="id")
        session.commit()
    with store.read() as session:
        found = {a.job_id: a.id for a in session.exec(select(AllocationRow))}
    assert ids == [found[row["job_id"]] for row in rows] and len(set(ids)) == 4
    with store.session() as session:
        assert insert_rows(session, AllocationRow, [], returning="id") == []


def test_a_column_of_mixed_plain_values_is_written_as_its_type(store: Store) -> None:
    """An int in a float column (a model default of 0) beside floats, None beside values."""
    rows: list[dict[str, Any]] = [
        {"job_id": "m", "attempt": 1, "rank": 0, "fleet": "f", "host_id": "h", "cpus": 2.5},
        {"job_id": "m", "attempt": 1, "rank": 1, "fleet": "f", "host_id": "h", "cpus": 0},
        {"job_id": "m", "attempt": 1, "rank": 2, "fleet": "f", "host_id": "h", "cpus": 1},
        {"job_id": "m", "attempt": 1, "rank": 3, "fleet": "f", "host_id": "h", "cpus": 4.0},
    ]
    assert len(rows) >= ARRAYS_FROM  # as arrays on PostgreSQL
    for row, fraction in zip(rows, [None, 0.5, 1, None], strict=True):
        row["gpu_fraction"] = fraction
    with store.session() as session:
        insert_rows(session, AllocationRow, rows)
        session.commit()
    with store.read() as session:
        found = session.exec(select(AllocationRow).order_by(AllocationRow.rank)).all()
    assert [(a.cpus, a.gpu_fraction) for a in found] == [
        (2.5, None),
        (0.0, 0.5),
        (1.0, 1.0),
        (4.0, None),
    ]


def test_postgresql_writes_several_rows_in_one_statement(postgres_store: Store) -> None:
    """From ARRAYS_FROM rows, one statement that the server runs once for all of them
    (psycopg's executemany runs one per row); fewer rows are written as before."""
    seen: list[tuple[str, bool, bool]] = []

    def count(_c: Any, _cursor: Any, statement: str, _p: Any, _x: Any, many: bool) -> None:
        seen.append((statement.split()[0], "unnest" in statement, many))

    def allocations(ranks: list[int]) -> list[dict[str, Any]]:
        return [
            {"job_id": "a", "attempt": 1, "rank": n, "fleet": "f", "host_id": "h"} for n in ranks
        ]

    event.listen(postgres_store.engine, "before_cursor_execute", count)
    try:
        with postgres_store.session() as session:
            session.connection()
            seen.clear()
            rows = [{"job_id": f"e{n}", "key": "k", "kind": "p", "message": "m"} for n in range(40)]
            insert_rows(session, JobEventRow, rows)
            several = insert_rows(session, AllocationRow, allocations([7, 3, 5, 4]), returning="id")
            few = insert_rows(session, AllocationRow, allocations([1, 2][: ARRAYS_FROM - 2]))
            session.commit()
    finally:
        event.remove(postgres_store.engine, "before_cursor_execute", count)
    assert seen[:2] == [("INSERT", True, False), ("INSERT", True, False)]
    assert few == [] and all(not arrays for _, arrays, _ in seen[2:])
    with postgres_store.read() as session:
        ranks = {a.id: a.rank for a in session.exec(select(AllocationRow))}
    assert [ranks[i] for i in several] == [7, 3, 5, 4]


def test_a_value_not_of_its_column_s_type_is_written_as_the_driver_writes_it(
    postgres_store: Store,
) -> None:
    """1536.6 MiB in an integer column: PostgreSQL rounds it, as for a row written alone; arrays
    would have to make it an int first (1536), so such rows go the driver's way."""
    rows = [
        {"job_id": "r", "attempt": 1, "rank": n, "fleet": "f", "host_id": "h", "memory_mib": m}
        for n, m in enumerate([1536.6, 2048, 512, 1024])
    ]
    assert len(rows) >= ARRAYS_FROM
    with postgres_store.session() as session:
        insert_rows(session, AllocationRow, rows)
        session.commit()
    with postgres_store.read() as session:
        found = session.exec(select(AllocationRow).order_by(AllocationRow.rank)).all()
    assert [a.memory_mib for a in found] == [1537, 2048, 512, 1024]


@pytest.mark.parametrize("count", [2, ARRAYS_FROM + 3])
def test_new_rows_leave_the_taken_keys_as_they_are(store: Store, count: int) -> None:
    """`insert_new_rows` writes the rows whose key is free, in one statement (arrays on
    PostgreSQL from ARRAYS_FROM rows), leaves a row whose key is taken as it was, and says
    which it wrote."""

    def job(n: int, message: str) -> dict[str, Any]:
        return {
            "id": f"job-n{n}-000000",
            "name": f"n{n}",
            "status": "pending",
            "spec": {"name": f"n{n}", "commands": ["true"]},
            "attempt": 1,
            "message": message,
        }

    with store.session() as session:
        insert_rows(session, JobRow, [job(0, "before"), job(2, "before")])
        session.commit()
    statements: list[str] = []

    def seen(_c: Any, _cursor: Any, statement: str, *_: Any) -> None:
        statements.append(statement.split()[0])

    event.listen(store.engine, "before_cursor_execute", seen)
    try:
        with store.session() as session:
            written = insert_new_rows(session, JobRow, [job(n, "new") for n in range(count)])
            session.commit()
    finally:
        event.remove(store.engine, "before_cursor_execute", seen)
    assert written == {f"job-n{n}-000000" for n in range(count) if n not in (0, 2)}
    assert statements.count("INSERT") == 1 and "SELECT" not in statements
    with store.read() as session:
        messages = {row.id: row.message for row in session.exec(select(JobRow))}
    assert messages == {
        f"job-n{n}-000000": "before" if n in (0, 2) else "new" for n in range(max(count, 3))
    }
    with store.session() as session:
        assert insert_new_rows(session, JobRow, []) == set()
        assert insert_new_rows(session, JobRow, [job(1, "again")]) == set()
        session.commit()
