"""Jobs and their events: what `gpuflow ps` shows. Workflow state stays the truth of progress;
these rows are written by idempotent bookkeeping activities."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import and_, func, or_
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import defer
from sqlmodel import Session, col, select

from gpuflow.errors import GpuflowError, NotFoundError
from gpuflow.specs.job import DEFAULT_QUEUE
from gpuflow.status import NO_GPUS, HostState, JobStatus, TerminationReason
from gpuflow.store.db import Store
from gpuflow.store.tables import HostRow, JobEventRow, JobRow


def record_job(store: Store, *, job_id: str, name: str, spec: dict[str, Any]) -> JobRow:
    """Insert the job once (a repeated call keeps the first row); the job's row."""
    with store.session() as session:
        row = session.get(JobRow, job_id)
        if row is not None:
            return row
        row = JobRow(id=job_id, name=name, status=JobStatus.PENDING, spec=spec)
        session.add(row)
        try:
            session.commit()
        except IntegrityError:  # the job's workflow wrote it first
            session.rollback()
            return find_job(store, job_id)
        return row


def recorded_in(session: Session, *, job_id: str, event_key: str) -> bool:
    """Whether the job's record of this key was written."""
    found = select(JobEventRow.id).where(JobEventRow.job_id == job_id, JobEventRow.key == event_key)
    return session.exec(found).first() is not None


_READ_JOBS = "gpuflow_read_jobs"


def unrecorded_in(session: Session, records: Sequence[tuple[str, str]]) -> list[bool]:
    """For several (job id, event key)s, in their order: whether it is the first of them not
    written yet (`recorded_in` for each, and a repeat within them counts as written), with two
    statements: the jobs' rows (their specs left unloaded) are read into the session, so a
    `record_status_in` of each reads nothing more."""
    ids = list(dict.fromkeys(job_id for job_id, _ in records))
    if not ids:
        return []
    unloaded = defer(JobRow.spec)  # type: ignore[arg-type]
    rows = session.exec(select(JobRow).options(unloaded).where(col(JobRow.id).in_(ids))).all()
    # held by the session (its identity map holds objects weakly) until it ends
    session.info.setdefault(_READ_JOBS, []).extend(rows)
    keys = list(dict.fromkeys(key for _, key in records))
    found = select(JobEventRow.job_id, JobEventRow.key).where(
        col(JobEventRow.job_id).in_(ids), col(JobEventRow.key).in_(keys)
    )
    written = {(job_id, key) for job_id, key in session.exec(found)}
    first: list[bool] = []
    for record in records:
        first.append(record not in written)
        written.add(record)
    return first


def record_status_in(
    session: Session,
    *,
    job_id: str,
    name: str,
    spec: dict[str, Any] | None,
    status: JobStatus,
    event_key: str,
    attempt: int | None = None,
    reason: str | None = None,
    message: str = "",
    fleet: str | None = None,
    hosts: list[str] | None = None,
    gpus: str | None = None,
    at: datetime | None = None,
    waiting_for_capacity: bool = False,
    unrecorded: bool = False,
) -> None:
    """Create the job's row if needed, set its status and add the event, inside the caller's
    transaction (which commits); a repeated call (same event key) changes nothing.
    `unrecorded`: the caller knows this record was not written yet (`unrecorded_in`)."""
    if not unrecorded and recorded_in(session, job_id=job_id, event_key=event_key):
        return  # this very record was written: a later one must not be undone by its repeat
    # The spec is written once and never read back here: leave it unloaded.
    unloaded = [defer(JobRow.spec)]  # type: ignore[arg-type]
    job = session.get(JobRow, job_id, options=unloaded)
    if job is None:
        job = JobRow(id=job_id, name=name, status=JobStatus.PENDING, spec=spec or {})
        session.add(job)
        session.flush()
    _apply_status(
        session,
        job,
        status=status,
        attempt=attempt,
        reason=reason,
        message=message,
        fleet=fleet,
        hosts=hosts,
        gpus=gpus,
        at=at,
    )
    # Read after the status is applied: a job that ended (or ignored a late pending record
    # because it had ended) waits for nothing.
    job.waiting_for_capacity = waiting_for_capacity and job.status == JobStatus.PENDING
    session.add(job)
    session.add(JobEventRow(job_id=job_id, key=event_key, kind=status.value, message=message))


def _apply_status(
    session: Session,
    job: JobRow,
    *,
    status: JobStatus,
    attempt: int | None,
    reason: str | None,
    message: str | None,
    fleet: str | None,
    hosts: list[str] | None,
    gpus: str | None,
    at: datetime | None,
) -> None:
    """Set the job's status on its row (already read: its spec is left unloaded)."""
    if attempt is not None and attempt > job.attempt and job.hosts:
        # The hosts of the attempt that ends here are kept: its output stays on them.
        job.earlier_hosts = {**(job.earlier_hosts or {}), str(job.attempt): list(job.hosts)}
    if JobStatus(job.status).is_final and not status.is_final:
        if attempt is None or attempt <= job.attempt:
            return  # a late record of an attempt that ended: the ending stands
        # The job retries (`retry`): its row follows the new attempt, which may be stopped,
        # waits in its queue and is listed by `ps` as not ended.
        job.termination_reason = None
        job.finished_at = None
        job.fleet, job.hosts, job.gpus = None, [], None  # where it ran; the attempt is placed anew
    at = at or datetime.now(UTC)
    job.status = status
    if attempt is not None:
        job.attempt = attempt
    if reason is not None or status.is_final:
        job.termination_reason = reason
    if message is not None or status.is_final:
        job.message = message
    if fleet is not None:
        job.fleet = fleet
    if hosts is not None:
        job.hosts = hosts
    if gpus is not None:
        job.gpus = gpus
    if status == JobStatus.RUNNING and job.started_at is None:
        job.started_at = at
    if status.is_final:
        job.finished_at = job.finished_at or at
    session.add(job)


def record_reconciled_in(
    session: Session,
    *,
    job_id: str,
    attempt: int,
    reason: TerminationReason,
    message: str,
    event_message: str,
) -> None:
    """What reconciliation did to one attempt of a job, inside the caller's transaction: a job
    that had not ended ends now (`reason`, `message`), and its events say why. A repeated call
    changes nothing."""
    job = session.get(JobRow, job_id, options=[defer(JobRow.spec)])  # type: ignore[arg-type]
    if job is not None and not JobStatus(job.status).is_final:
        _apply_status(
            session,
            job,
            status=reason.status,
            attempt=None,
            reason=reason.value,
            message=message,
            fleet=None,
            hosts=None,
            gpus=None,
            at=None,
        )
        job.waiting_for_capacity = False
        session.add(job)
    key = f"{attempt}:reconciled"
    exists = session.exec(
        select(JobEventRow).where(JobEventRow.job_id == job_id, JobEventRow.key == key)
    ).first()
    if exists is None:
        kind = job.status if job is not None else reason.status.value
        session.add(JobEventRow(job_id=job_id, key=key, kind=kind, message=event_message))


def jobs_waiting_for_capacity(store: Store, *, limit: int = 500) -> list[str]:
    """Ids of the jobs that wait for capacity (the ones freed or added capacity should wake)."""
    with store.read() as session:
        return jobs_waiting_for_capacity_in(session, limit=limit)


def jobs_waiting_for_capacity_in(session: Session, *, limit: int = 500) -> list[str]:
    rows = session.exec(
        select(JobRow.id)
        .where(col(JobRow.waiting_for_capacity), col(JobRow.status) == JobStatus.PENDING)
        .limit(limit)
    )
    return list(rows)


def list_jobs(
    store: Store,
    *,
    include_finished: bool = False,
    limit: int = 200,
    before: tuple[datetime, str] | None = None,
    queue: str | None = None,
) -> list[JobRow]:
    """The newest jobs (not ended, unless `include_finished`), newest first (submission time,
    then id), older than `before` (a submission time and id) when given: a page of a listing;
    of one queue (the one the job names) when `queue` is given."""
    with store.read() as session:
        submitted, job_id = col(JobRow.submitted_at), col(JobRow.id)
        query = select(JobRow).order_by(submitted.desc(), job_id.desc()).limit(limit)
        if queue is not None:
            named = col(JobRow.spec)["queue"].as_string()
            if queue == DEFAULT_QUEUE:  # a spec recorded before queues names none
                query = query.where(or_(named == queue, named.is_(None)))
            else:
                query = query.where(named == queue)
        if not include_finished:
            finals = [s.value for s in JobStatus if s.is_final]
            query = query.where(col(JobRow.status).not_in(finals))
        if before is not None:
            at, last = before
            query = query.where(or_(submitted < at, and_(submitted == at, job_id < last)))
        return list(session.exec(query))


PLACED = (JobStatus.PROVISIONING, JobStatus.RUNNING)
"""Statuses of a job that holds hosts."""


def hosts_not_ready_in(session: Session, rows: Sequence[JobRow]) -> dict[str, dict[str, str]]:
    """For the placed jobs among `rows`: each of their hosts that is not ready, by name, with
    its state and why (`not_ready (agent not answering)`), by job id; one read for them all."""
    placed = [row for row in rows if row.status in PLACED and row.fleet and row.hosts]
    if not placed:
        return {}
    fleets = {row.fleet for row in placed}
    names = {name for row in placed for name in row.hosts}
    found = session.exec(
        select(HostRow.fleet, HostRow.name, HostRow.state, HostRow.state_detail).where(
            col(HostRow.fleet).in_(fleets),
            col(HostRow.name).in_(names),
            col(HostRow.state) != HostState.READY,
        )
    ).all()
    states = {
        (fleet, name): f"{state} ({detail})" if detail else state
        for fleet, name, state, detail in found
    }
    out: dict[str, dict[str, str]] = {}
    for row in placed:
        for name in row.hosts:
            state = states.get((row.fleet or "", name))
            if state is not None:
                out.setdefault(row.id, {})[name] = state
    return out


def find_job(store: Store, ref: str) -> JobRow:
    """A job by workflow id, or by name (`find_job_in`)."""
    with store.read() as session:
        return find_job_in(session, ref)


AMBIGUOUS_SHOWN = 5
"""Ids an ambiguous name's refusal lists."""


def find_job_in(session: Session, ref: str) -> JobRow:
    """A job by workflow id, or by name: the one job of that name not ended, else the newest
    of them. Several not ended are refused with their ids (a `stop` by name must not pick one
    the user did not mean)."""
    job = session.get(JobRow, ref)
    if job is not None:
        return job
    finals = [s.value for s in JobStatus if s.is_final]
    newest = col(JobRow.submitted_at).desc()
    named = select(JobRow).where(JobRow.name == ref)
    live = list(
        session.exec(
            named.where(col(JobRow.status).not_in(finals))
            .order_by(newest)
            .limit(AMBIGUOUS_SHOWN + 1)
        )
    )
    if len(live) > 1:
        shown = ", ".join(f"{row.id} ({row.status})" for row in live[:AMBIGUOUS_SHOWN])
        more = " and more" if len(live) > AMBIGUOUS_SHOWN else ""
        raise GpuflowError(f"several jobs named {ref!r} have not ended: {shown}{more}; give an id")
    job = live[0] if live else session.exec(named.order_by(newest)).first()
    if job is None:
        raise NotFoundError(f"no job named {ref!r} (see `gpuflow ps -a`)")
    return job


def job_events(store: Store, job_id: str) -> list[JobEventRow]:
    with store.read() as session:
        return list(
            session.exec(
                select(JobEventRow)
                .where(JobEventRow.job_id == job_id)
                .order_by(col(JobEventRow.ts), col(JobEventRow.id))
            )
        )


def newest_events(store: Store, ref: str, most: int) -> tuple[str, list[JobEventRow], int]:
    """The job (by id, or the newest of that name), its newest `most` events oldest first, and
    how many it has in all; NotFoundError when no job has that id or name."""
    with store.read() as session:
        job_id = find_job_in(session, ref).id
        of_job = JobEventRow.job_id == job_id
        total = session.exec(select(func.count()).select_from(JobEventRow).where(of_job)).one()
        newest = (
            select(JobEventRow)
            .where(of_job)
            .order_by(col(JobEventRow.ts).desc(), col(JobEventRow.id).desc())
            .limit(most)
        )
        return job_id, list(reversed(session.exec(newest).all())), int(total)


def gpu_summary(placement: Any) -> str:
    """A placement's GPUs in a few words, e.g. `2xA100` or `0.5xT4` (what `ps` shows)."""
    parts = []
    for node in placement.nodes:
        if not node.gpu_indices:
            continue
        names = sorted(set(node.gpu_names)) or ["GPU"]
        if node.gpu_fraction is not None:
            parts.append(f"{node.gpu_fraction:g}x{names[0]}")
        else:
            parts.append(f"{len(node.gpu_indices)}x{'/'.join(names)}")
    return ", ".join(parts) if parts else NO_GPUS
