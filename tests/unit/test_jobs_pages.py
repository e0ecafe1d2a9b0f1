"""The jobs' listing in pages, on SQLite and PostgreSQL: the client reads JOBS_PER_PAGE jobs at a
time, each page older than the last (submission time, then id, so jobs submitted in the same
instant are neither lost nor repeated), up to a limit or all of them. Before, the listing was the
newest 200 jobs whatever there were: `gpuflow ps` left the rest out without a word, and
`gpuflow down` neither stopped nor reported running jobs past the newest 200."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import WorkflowExecutionStatus

from gpuflow.client import Client
from gpuflow.control.api import ApiActivities
from gpuflow.errors import SpecError
from gpuflow.services.jobs import list_jobs
from gpuflow.status import JobStatus
from gpuflow.store.bulk import insert_rows
from gpuflow.store.db import Store
from gpuflow.store.tables import JobRow
from gpuflow.workflows.api import JOBS_PER_PAGE, LISTED_MESSAGE_CHARS, JobsRequest
from tests.unit.test_fleet_pages import CountingApi

pytestmark = pytest.mark.asyncio(loop_scope="session")

JOBS = 2 * JOBS_PER_PAGE + 203


class NoOpenWorkflows:
    """A Temporal client whose visibility lists no open workflow."""

    def list_workflows(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        async def none() -> AsyncIterator[Any]:
            for _ in ():
                yield _

        return none()


class OpenWorkflows:
    """A Temporal client whose visibility lists these open JobWorkflows (id, start), within
    the StartTime bounds a query gives, as the server does; it keeps the queries."""

    def __init__(self, started: dict[str, datetime]) -> None:
        self.started = started
        self.queries: list[str] = []

    def list_workflows(self, query: str, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        self.queries.append(query)
        bounds = {
            op: datetime.fromisoformat(at.replace("Z", "+00:00"))
            for op, at in re.findall(r"StartTime (>=|<=) '([^']+)'", query)
        }

        async def listed() -> AsyncIterator[Any]:
            for job_id, at in self.started.items():
                if (">=" in bounds and at < bounds[">="]) or ("<=" in bounds and at > bounds["<="]):
                    continue
                yield _Open(job_id, at)

        return listed()


class _Open:
    def __init__(self, job_id: str, start_time: datetime) -> None:
        self.id, self.start_time = job_id, start_time
        self.status = WorkflowExecutionStatus.RUNNING

    async def memo_value(self, key: str, default: Any) -> Any:
        return {"name": self.id.split("-")[1]}


def _jobs(store: Store) -> None:
    """JOBS jobs, ten submitted in each instant, a third of them ended."""
    start = datetime(2026, 11, 1, tzinfo=UTC)
    statuses = [JobStatus.RUNNING, JobStatus.PENDING, JobStatus.DONE]
    rows = [
        {
            "id": f"job-j{k:05d}-abcdef",
            "name": f"j{k:05d}",
            "status": statuses[k % 3].value,
            "spec": {"name": f"j{k:05d}", "commands": ["x"]},
            "attempt": 1,
            "submitted_at": start + timedelta(seconds=k // 10),
        }
        for k in range(JOBS)
    ]
    with store.session() as session:
        insert_rows(session, JobRow, rows)
        session.commit()


def _client(store: Store, tmp_path: Path, temporal: Any = None) -> tuple[Client, CountingApi]:
    temporal = temporal or NoOpenWorkflows()
    activities = ApiActivities(store, temporal, home=tmp_path)
    api = CountingApi(activities, "jobs")
    return Client(temporal=None, api=api), api  # type: ignore[arg-type]


async def test_every_job_is_listed_a_page_at_a_time(store: Store, tmp_path: Path) -> None:
    _jobs(store)
    client, api = _client(store, tmp_path)

    listed = await client.jobs(include_finished=True)
    assert api.pages == [JOBS_PER_PAGE, JOBS_PER_PAGE, JOBS - 2 * JOBS_PER_PAGE]
    whole = list_jobs(store, include_finished=True, limit=10 * JOBS)
    assert [j.id for j in listed] == [row.id for row in whole]
    assert len({j.id for j in listed}) == JOBS
    assert [j.id for j in listed[:3]] == [
        f"job-j{k:05d}-abcdef" for k in (JOBS - 1, JOBS - 2, 1200)
    ]

    active = await client.jobs()
    assert len(active) == JOBS - len(range(2, JOBS, 3))
    assert all(j.status != JobStatus.DONE for j in active)


async def test_a_limit_reads_only_the_pages_it_needs(store: Store, tmp_path: Path) -> None:
    _jobs(store)
    client, api = _client(store, tmp_path)
    newest = await client.jobs(include_finished=True, limit=JOBS_PER_PAGE + 5)
    assert api.pages == [JOBS_PER_PAGE, 5]
    assert [j.id for j in newest] == [
        row.id for row in list_jobs(store, include_finished=True, limit=JOBS_PER_PAGE + 5)
    ]
    with pytest.raises(SpecError, match="at least 1"):
        await client.jobs(limit=0)


async def test_a_control_worker_without_pages_is_read_once(
    sqlite_store: Store, tmp_path: Path
) -> None:
    _jobs(sqlite_store)
    client, api = _client(sqlite_store, tmp_path)
    activities = api.activities
    answer = activities.jobs

    async def newest_200(req: JobsRequest) -> Any:  # what a control worker before pages did
        return await answer(JobsRequest(include_finished=req.include_finished))

    activities.jobs = newest_200  # type: ignore[method-assign]
    listed = await client.jobs(include_finished=True, limit=JOBS)
    assert len(listed) == 200
    assert api.pages == [200]  # a short page: the last; nothing asked again
    listed = await client.jobs(include_finished=True, limit=150)
    assert len(listed) == 150


async def test_a_listing_cuts_long_messages_and_get_has_them_whole(
    sqlite_store: Store, tmp_path: Path
) -> None:
    """A waiting job's message holds a line per host that does not fit (up to 1,000): 500 of
    them in one page would pass Temporal's payload limit."""
    _jobs(sqlite_store)
    reasons = "; ".join(f"node-{i:04d}: needs 8 free GPUs, has 3" for i in range(900))
    with sqlite_store.session() as session:
        row = session.get(JobRow, "job-j00001-abcdef")
        assert row is not None
        row.message = "waiting: " + reasons
        session.add(row)
        session.commit()
    client, _ = _client(sqlite_store, tmp_path)
    listed = {j.id: j for j in await client.jobs()}
    cut = listed["job-j00001-abcdef"].message
    whole = (await client.get("job-j00001-abcdef")).message
    assert whole == "waiting: " + reasons
    more = len(whole) - LISTED_MESSAGE_CHARS
    assert cut == whole[:LISTED_MESSAGE_CHARS] + f"… ({more:,} more characters)"


async def test_open_workflows_without_rows_are_listed_once_where_they_belong(
    store: Store, tmp_path: Path
) -> None:
    """A job whose workflow is open and has no row yet is listed by its start, on the page whose
    span holds it: one older than the first page's oldest row used to be put on the first page,
    and the next page started below it, skipping the rows between."""
    _jobs(store)
    start = datetime(2026, 11, 1, tzinfo=UTC)
    at = {  # seconds after the first row's instant (rows: ten per second, 0..120)
        "job-newest-000001": 500.0,  # newer than every row: the first page
        "job-pageone-000002": 100.5,  # within the first page (rows 1203..704)
        "job-pagetwo-000003": 60.5,  # older than the first page's oldest row
        "job-oldest-000004": -5.0,  # older than every row: the last page
    }
    started = {job_id: start + timedelta(seconds=s) for job_id, s in at.items()}
    temporal = OpenWorkflows(started)
    client, api = _client(store, tmp_path, temporal)

    listed = await client.jobs(include_finished=True)
    rows = list_jobs(store, include_finished=True, limit=10 * JOBS)
    assert len(listed) == JOBS + len(started)
    assert len({j.id for j in listed}) == len(listed)
    assert {j.id for j in listed} == {row.id for row in rows} | set(started)
    keys = [(j.submitted_at, j.id) for j in listed]
    assert keys == sorted(keys, reverse=True)
    assert listed[0].id == "job-newest-000001"
    assert listed[-1].id == "job-oldest-000004"
    # each page holds the open workflows of its span beside its rows
    assert api.pages == [JOBS_PER_PAGE + 2, JOBS_PER_PAGE + 1, JOBS - 2 * JOBS_PER_PAGE + 1]

    # each page asked visibility for the workflows started within its own span only
    first, middle, last = temporal.queries
    assert "StartTime >=" in first and "StartTime <=" not in first
    assert "StartTime >=" in middle and "StartTime <=" in middle
    assert "StartTime >=" not in last and "StartTime <=" in last

    newest = await client.jobs(include_finished=True, limit=JOBS_PER_PAGE)
    assert {"job-newest-000001", "job-pageone-000002"} <= {j.id for j in newest}
    assert "job-pagetwo-000003" not in {j.id for j in newest}
