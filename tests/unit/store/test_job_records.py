"""A job's status record (gpuflow/services/jobs.py `record_status_in`), written three times per
job (submitted, running, ended): it reads the job's row once, without its spec (which may be
large), and a repeat of the same record changes nothing. On SQLite and PostgreSQL."""

from __future__ import annotations

from sqlalchemy import event

from gpuflow.services.jobs import find_job, job_events, record_status_in, unrecorded_in
from gpuflow.status import JobStatus
from gpuflow.store.db import Store
from gpuflow.store.tables import JobRow


def _record(store: Store, status: JobStatus, key: str) -> list[str]:
    """Write one record; the statements it ran."""
    statements: list[str] = []

    def seen(_c: object, _cur: object, statement: str, *_: object) -> None:
        statements.append(" ".join(statement.split()))

    event.listen(store.engine, "before_cursor_execute", seen)
    try:
        with store.session() as session:
            record_status_in(
                session,
                job_id="job-a",
                name="a",
                spec={"commands": ["x" * 10_000]},
                status=status,
                event_key=key,
            )
            session.commit()
    finally:
        event.remove(store.engine, "before_cursor_execute", seen)
    return statements


def test_a_record_reads_the_job_once_without_its_spec(store: Store) -> None:
    _record(store, JobStatus.PENDING, "1:pending")
    statements = _record(store, JobStatus.RUNNING, "1:running")
    reads = [s for s in statements if s.startswith("SELECT") and "FROM jobs" in s]
    assert len(reads) == 1
    assert "jobs.spec" not in reads[0]
    row = find_job(store, "job-a")
    assert row.status == JobStatus.RUNNING and row.started_at is not None
    assert row.spec == {"commands": ["x" * 10_000]}  # written with the first record, kept


def test_a_repeated_record_changes_nothing(store: Store) -> None:
    _record(store, JobStatus.PENDING, "1:pending")
    _record(store, JobStatus.DONE, "1:done")
    again = _record(store, JobStatus.DONE, "1:done")
    assert not [s for s in again if s.startswith(("INSERT", "UPDATE"))]
    assert [e.kind for e in job_events(store, "job-a")] == ["pending", "done"]


def test_records_known_unwritten_together_read_nothing_more(store: Store) -> None:
    """`unrecorded_in`: which of several records are new (a repeat among them is not), in two
    statements, after which each new record reads nothing and the group writes its rows."""
    _record(store, JobStatus.PENDING, "1:pending")
    with store.session() as session:
        session.add(JobRow(id="job-b", name="b", status=JobStatus.PENDING, spec={}))
        session.commit()
    statements: list[str] = []

    def seen(_c: object, _cur: object, statement: str, *_: object) -> None:
        statements.append(" ".join(statement.split()))

    asks = [("job-a", "1:pending"), ("job-a", "1:done"), ("job-b", "1:done"), ("job-a", "1:done")]
    event.listen(store.engine, "before_cursor_execute", seen)
    try:
        with store.session() as session:
            first = unrecorded_in(session, asks)
            assert first == [False, True, True, False]
            reads = [s for s in statements if s.startswith("SELECT")]
            assert len(reads) == 2 and not [s for s in reads if "jobs.spec" in s]
            with session.no_autoflush:
                for (job_id, key), new in zip(asks, first, strict=True):
                    if new:
                        record_status_in(
                            session,
                            job_id=job_id,
                            name=job_id[4:],
                            spec=None,
                            status=JobStatus.DONE,
                            event_key=key,
                            unrecorded=True,
                        )
            # the rows were read with the question: the records read nothing more
            assert [s for s in statements if s.startswith("SELECT")] == reads
            session.commit()
    finally:
        event.remove(store.engine, "before_cursor_execute", seen)
    assert [e.kind for e in job_events(store, "job-a")] == ["pending", "done"]
    assert [e.kind for e in job_events(store, "job-b")] == ["done"]
    assert find_job(store, "job-a").status == find_job(store, "job-b").status == JobStatus.DONE
    assert find_job(store, "job-a").spec == {"commands": ["x" * 10_000]}
