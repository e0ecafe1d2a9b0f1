"""The jobs' listing in pages, on SQLite and PostgreSQL: the client reads JOBS_PER_PAGE jobs at a
time, each page older than the last (submission time, then id, so jobs submitted in the same
instant are neither lost nor repeated), up to a limit or all of them. Before, the listing was the
newest 200 jobs whatever there were: `gpuflow ps` left the rest out without a word, and
`gpuflow down` neither stopped nor reported running jobs past the newest 200."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

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


def _client(store: Store, tmp_path: Path) -> tuple[Client, CountingApi]:
    activities = ApiActivities(store, NoOpenWorkflows(), home=tmp_path)  # type: ignore[arg-type]
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
