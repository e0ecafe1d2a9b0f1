"""What the API's activity modules (gpuflow/control/api.py, api_queues.py) share: a user error
fails a request in one line, and a job's row becomes the record `ps` reads, with its place in
its queue while it waits."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any, ParamSpec, TypeVar

from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory
from temporalio.service import RPCError, RPCStatusCode

from gpuflow.errors import GpuflowError
from gpuflow.services.queues import WaitingPlace
from gpuflow.specs.job import DEFAULT_QUEUE
from gpuflow.status import JobStatus
from gpuflow.store.db import Store
from gpuflow.store.tables import JobRow
from gpuflow.workflows.api import JOB_MEMO, JobRecord

P = ParamSpec("P")
R = TypeVar("R")


def one_line(fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
    """A user error (unknown fleet, no such job) fails the update at once with its one line and
    its type, for the client to raise again; anything else is retried. A user error is benign:
    the worker logs it at debug level, not as a failure with its traceback (the embedded
    stack's up.log held 15 lines for every refused request)."""

    @functools.wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return await fn(*args, **kwargs)
        except GpuflowError as exc:
            raise ApplicationError(
                str(exc),
                type=type(exc).__name__,
                non_retryable=True,
                category=ApplicationErrorCategory.BENIGN,
            ) from None

    return wrapper


def job_record(
    row: JobRow,
    place: WaitingPlace | None = None,
    *,
    message_chars: int | None = None,
    not_ready: dict[str, str] | None = None,
) -> JobRecord:
    """The job's record; `place`: where it waits in its queue (gpuflow/services/queues.py);
    `message_chars`: the message cut there (a listing's: see LISTED_MESSAGE_CHARS);
    `not_ready`: its hosts that are not ready (services/jobs.py `hosts_not_ready_in`)."""
    spec = row.spec or {}
    queue = place.queue if place else (str(spec.get("queue", DEFAULT_QUEUE)) if spec else None)
    message = row.message
    if message is not None and message_chars is not None and len(message) > message_chars:
        message = f"{message[:message_chars]}… ({len(message) - message_chars:,} more characters)"
    return JobRecord(
        id=row.id,
        name=row.name,
        status=row.status,
        reason=row.termination_reason,
        message=message,
        fleet=row.fleet,
        hosts=list(row.hosts),
        gpus=row.gpus,
        attempt=row.attempt,
        priority=int(spec.get("priority", 0)),
        preemptible=spec.get("preemptible") is True,
        submitted_at=row.submitted_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
        queue=queue,
        queue_position=place.position if place else None,
        queue_reason=place.reason if place else None,
        reserved_hosts=list(place.reserved_hosts) if place else [],
        reserved_start=place.reserved_start if place else None,
        hosts_not_ready=not_ready or {},
    )


def unrecorded_job(job_id: str, memo: dict[str, Any], started: datetime | None) -> JobRecord:
    """A job whose workflow is open but has no row yet, from its workflow's memo."""
    return JobRecord(
        id=job_id,
        name=str(memo.get("name", job_id)),
        status=JobStatus.PENDING.value,
        message="submitted",
        priority=int(memo.get("priority", 0)),
        submitted_at=started or datetime.now(UTC),
        queue=str(memo.get("queue", DEFAULT_QUEUE)),
    )


async def open_unrecorded(
    temporal: Client,
    store: Store,
    recorded: set[str],
    span: tuple[datetime | None, datetime | None] = (None, None),
) -> list[JobRecord]:
    """Open JobWorkflows without a row (submitted, not yet through their first place step);
    `span`: those started from, and up to, these times only (a page's, so that each page
    asks visibility for its own few, not for every open job)."""
    out: list[JobRecord] = []
    query = "WorkflowType = 'JobWorkflow' AND ExecutionStatus = 'Running'"
    # A millisecond wider than asked: visibility may keep finer times than a row's.
    if span[0] is not None:
        query += f" AND StartTime >= '{_rfc3339(span[0] - _MARGIN)}'"
    if span[1] is not None:
        query += f" AND StartTime <= '{_rfc3339(span[1] + _MARGIN)}'"
    try:
        async for wf in temporal.list_workflows(query, limit=500):
            if wf.id in recorded or wf.status != WorkflowExecutionStatus.RUNNING:
                continue
            if await asyncio.to_thread(_has_row, store, wf.id):
                continue  # recorded since the list was read
            out.append(unrecorded_job(wf.id, await wf.memo_value(JOB_MEMO, {}), wf.start_time))
    except RPCError as exc:
        if exc.status != RPCStatusCode.UNIMPLEMENTED:
            raise
        return []  # a server without visibility (the time-skipping test server)
    return out


_MARGIN = timedelta(milliseconds=1)


def _rfc3339(at: datetime) -> str:
    """A time as a visibility query takes it (UTC)."""
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _has_row(store: Store, job_id: str) -> bool:
    with store.read() as session:
        return session.get(JobRow, job_id) is not None
