"""The question a submit asks of the queue for a job that does not fit and may not wait ("could
a running job of its queue be preempted for it?") is answered right and by an index, not by a
walk over every admitted job of the queue."""

from __future__ import annotations

from typing import Any

from sqlalchemy import event, text

from gpuflow.services.queue_entries import victims_possible
from gpuflow.store.db import Store
from gpuflow.store.tables import PREEMPTIBLE_ENTRIES, QueueEntryRow


def _entries(store: Store, count: int, **fields: Any) -> None:
    with store.session() as session:
        for n in range(count):
            values = {"queue": "default", "state": "admitted", **fields}
            name = "-".join(str(v) for v in (*values.values(), n))
            session.add(QueueEntryRow(job_id=name, attempt=1, name=name, **values))
        session.commit()


def test_victims_possible_answers_by_queue_priority_and_preemptible(store: Store) -> None:
    _entries(store, 50, priority=10)
    _entries(store, 3, priority=5, preemptible=True, state="waiting")
    _entries(store, 2, priority=5, preemptible=True, queue="other")
    with store.read() as session:
        assert not victims_possible(session, "default", 100)  # nothing of it preemptible
    _entries(store, 1, priority=5, preemptible=True)
    with store.read() as session:
        assert victims_possible(session, "default", 6)
        assert not victims_possible(session, "default", 5)  # not of a lower priority
        assert not victims_possible(session, "empty", 100)  # default has no quota to be over
    # A queue with a quota may be over it (its cohort left, say): the full pass looks.
    from gpuflow.services.queues import apply_queue
    from gpuflow.specs import QueueSpec

    apply_queue(store, QueueSpec(name="other", gpus=1))
    with store.read() as session:
        assert victims_possible(session, "empty", 100)
        assert victims_possible(session, "other", 100)  # its own, of priority 5
        assert not victims_possible(session, "other", 5)  # default, unlimited, is never over


def test_victims_possible_reads_by_the_preemptible_index(store: Store) -> None:
    """A database made before the index gets it from `init`; the statement the function runs
    is planned on it (SQLite's plan names it; PostgreSQL's, with scans of the table off)."""
    with store.engine.begin() as connection:
        connection.execute(text(f"DROP INDEX {PREEMPTIBLE_ENTRIES}"))
    store.init()
    _entries(store, 2000)
    if not store.is_sqlite:  # the planner's statistics, as autovacuum keeps them
        with store.engine.begin() as connection:
            connection.execute(text("ANALYZE queue_entries"))
    statements: list[tuple[str, Any]] = []

    def seen(conn: Any, cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        statements.append((statement, parameters))

    event.listen(store.read_engine, "before_cursor_execute", seen)
    try:
        with store.read() as session:
            assert not victims_possible(session, "default", 100)
    finally:
        event.remove(store.read_engine, "before_cursor_execute", seen)
    [(statement, parameters)] = [s for s in statements if "queue_entries" in s[0]]
    with store.engine.connect() as connection:
        raw = connection.connection.dbapi_connection
        assert raw is not None
        cursor = raw.cursor()
        if store.is_sqlite:
            cursor.execute(f"EXPLAIN QUERY PLAN {statement}", parameters)
            plan = " ".join(str(row[-1]) for row in cursor.fetchall())
            assert f"INDEX {PREEMPTIBLE_ENTRIES}" in plan, plan
        else:
            cursor.execute("SET enable_seqscan = off")
            cursor.execute(f"EXPLAIN {statement}", parameters)
            plan = " ".join(str(row[0]) for row in cursor.fetchall())
            assert PREEMPTIBLE_ENTRIES in plan, plan
