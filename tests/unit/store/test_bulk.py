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
