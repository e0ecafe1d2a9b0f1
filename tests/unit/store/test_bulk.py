"""Rows written many at a time (gpuflow/store/bulk.py) are the rows the ORM would write: the
columns left out take the model's defaults and factories, and autoincrement keys are the
database's, on SQLite and PostgreSQL."""

from __future__ import annotations

from sqlmodel import select

from gpuflow.store.bulk import insert_rows
from gpuflow.store.db import Store
from gpuflow.store.tables import AllocationRow, JobEventRow


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


def test_returning_gives_each_row_its_id_in_order(store: Store) -> None:
    """The ids the database gave the rows, in the order of the rows (not of the ids: rows of
    another transaction may be numbered between them on PostgreSQL)."""
    rows = [
        {"job_id": f"r-{n}", "attempt": 1, "rank": n, "fleet": "f", "host_id": f"h{n % 3}"}
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
