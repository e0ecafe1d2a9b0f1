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


def _record_attempt(
    store: Store,
    status: JobStatus,
    attempt: int,
    reason: str | None,
    hosts: tuple[str, ...] = ("h",),
) -> None:
    running = status == JobStatus.RUNNING
    where = {"fleet": "f", "hosts": list(hosts), "gpus": "1xA100"} if running else {}
    with store.session() as session:
        record_status_in(
            session,
            job_id="job-a",
            name="a",
            spec={},
            status=status,
            event_key=f"{attempt}:{status.value}",
            attempt=attempt,
            reason=reason,
            **where,  # type: ignore[arg-type]
        )
        session.commit()


def test_a_job_that_retries_is_not_ended_while_its_next_attempt_runs(store: Store) -> None:
    """Each attempt's ending is recorded (and its GPUs released) before the next begins; the
    row follows the new attempt, so `ps` lists it and `stop` reaches it."""
    _record_attempt(store, JobStatus.RUNNING, 1, None)
    _record_attempt(store, JobStatus.TERMINATED, 1, "preempted")
    ended = find_job(store, "job-a")
    assert ended.status == JobStatus.TERMINATED and ended.finished_at is not None
    _record_attempt(store, JobStatus.PENDING, 2, None)
    row = find_job(store, "job-a")
    assert (row.status, row.attempt) == (JobStatus.PENDING, 2)
    assert row.termination_reason is None and row.finished_at is None
    assert (row.fleet, row.hosts, row.gpus) == (None, [], None)
    _record_attempt(store, JobStatus.RUNNING, 2, None)
    _record_attempt(store, JobStatus.DONE, 2, "done")
    row = find_job(store, "job-a")
    assert (row.status, row.attempt, row.termination_reason) == (JobStatus.DONE, 2, "done")


def test_a_late_record_of_an_ended_attempt_does_not_reopen_the_job(store: Store) -> None:
    _record_attempt(store, JobStatus.PENDING, 1, None)
    _record_attempt(store, JobStatus.TERMINATED, 1, "stopped_by_user")
    with store.session() as session:  # the same attempt's running record, arriving late
        record_status_in(
            session,
            job_id="job-a",
            name="a",
            spec={},
            status=JobStatus.RUNNING,
            event_key="1:running-late",
            attempt=1,
        )
        session.commit()
    row = find_job(store, "job-a")
    assert (row.status, row.termination_reason) == (JobStatus.TERMINATED, "stopped_by_user")


def test_each_earlier_attempts_hosts_are_kept_where_its_output_is(store: Store) -> None:
    """`logs --attempt N` reads an earlier attempt's output from the hosts it ran on, which
    the row's `hosts` no longer names once the next attempt is placed."""
    _record_attempt(store, JobStatus.RUNNING, 1, None, hosts=("h1", "h2"))
    _record_attempt(store, JobStatus.FAILED, 1, "error")
    _record_attempt(store, JobStatus.PENDING, 2, None)
    _record_attempt(store, JobStatus.FAILED, 2, "no_capacity")  # never placed: nothing kept
    _record_attempt(store, JobStatus.PENDING, 3, None)
    _record_attempt(store, JobStatus.RUNNING, 3, None, hosts=("h3",))
    _record_attempt(store, JobStatus.RUNNING, 3, None, hosts=("h3",))  # a repeat changes nothing
    row = find_job(store, "job-a")
    assert row.earlier_hosts == {"1": ["h1", "h2"]}
    assert (row.attempt, row.hosts) == (3, ["h3"])
