"""`logs --follow` of a job that retried while it was followed: the rest of the attempt it was
reading, from that attempt's own host, then the next attempt's output from its start (the
follow went on reading the new attempt's log at the old one's offset: the first attempt's last
lines and the next one's first bytes were lost)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import TracebackType
from typing import Any

import pytest

from gpuflow.client import logs as client_logs
from gpuflow.client.logs import LogCalls
from gpuflow.client.models import JobInfo, Progress
from gpuflow.scheduler.model import NodePlacement, Placement
from gpuflow.status import JobStatus
from gpuflow.workflows.api import HostQueueResult
from gpuflow.workflows.models import LogChunk, LogsInput

pytestmark = pytest.mark.asyncio(loop_scope="session")


@dataclass
class _Moment:
    attempt: int
    status: JobStatus
    logs: dict[int, str]
    """Each attempt's log as written by then."""


@dataclass
class _Job(LogCalls):
    """A job whose state moves one moment on at every `get`; attempt N runs on host qN."""

    moments: list[_Moment]
    step: int = -1
    asked: list[tuple[str, int | None, int]] = field(default_factory=list)

    @property
    def now(self) -> _Moment:
        return self.moments[min(self.step, len(self.moments) - 1)]

    async def get(self, job: str) -> JobInfo:
        self.step += 1
        return JobInfo(
            id="job-flaky-1",
            name="flaky",
            status=self.now.status,
            attempt=self.now.attempt,
            hosts=[f"h{self.now.attempt}"],
            submitted_at=datetime.now(UTC),
        )

    async def progress(self, job: str) -> Progress:
        node = NodePlacement(
            rank=0,
            host_id=f"h{self.now.attempt}",
            host_name=f"h{self.now.attempt}",
            fleet="sim",
            task_queue=f"q{self.now.attempt}",
            gpu_indices=[],
        )
        running = self.now.status == JobStatus.RUNNING
        return Progress(
            job_id="job-flaky-1",
            name="flaky",
            status=self.now.status,
            attempt=self.now.attempt,
            placement=Placement(fleet="sim", nodes=[node]) if running else None,
        )

    def read(self, queue: str, logs: LogsInput) -> LogChunk:
        attempt = logs.attempt or max(self.now.logs)  # unpinned: the host's newest
        self.asked.append((queue, logs.attempt, logs.offset))
        if queue != f"q{attempt}":  # a host that did not run it has no log of it
            return LogChunk(data="", next_offset=logs.offset, attempt=attempt)
        text = self.now.logs.get(attempt, "")
        return LogChunk(data=text[logs.offset :], next_offset=len(text), attempt=attempt)


@dataclass
class _Api:
    async def call(self, name: str, request: Any, result_type: Any, **_: Any) -> Any:
        assert name == "host_queue"
        return HostQueueResult(task_queue=f"q{request.attempt}")


@dataclass
class _Temporal:
    """The job's workflow runs until the job is done."""

    job: _Job

    def get_workflow_handle(self, job_id: str) -> _Temporal:
        return self

    async def describe(self) -> Any:
        from types import SimpleNamespace

        from temporalio.client import WorkflowExecutionStatus

        done = self.job.now.status == JobStatus.DONE
        running = WorkflowExecutionStatus.RUNNING
        return SimpleNamespace(status=WorkflowExecutionStatus.COMPLETED if done else running)


class _Reader:
    job: _Job

    def __init__(self, temporal: Any, *, job_id: str) -> None:
        pass

    async def __aenter__(self) -> _Reader:
        return self

    async def __aexit__(
        self, *exc: type[BaseException] | BaseException | TracebackType | None
    ) -> None:
        pass

    async def read(self, queue: str, logs: LogsInput) -> LogChunk:
        return self.job.read(queue, logs)


def _moments() -> Iterator[_Moment]:
    yield _Moment(1, JobStatus.RUNNING, {1: "one-a\n"})
    yield _Moment(1, JobStatus.RUNNING, {1: "one-a\n"})
    # Attempt 1 ended: its row reads final for a moment, its workflow runs on to retry it.
    yield _Moment(1, JobStatus.FAILED, {1: "one-a\n"})
    # Attempt 1 wrote its last line and failed; attempt 2 started on another host and wrote.
    yield _Moment(2, JobStatus.RUNNING, {1: "one-a\none-b\n", 2: "two-a\n"})
    yield _Moment(2, JobStatus.RUNNING, {1: "one-a\none-b\n", 2: "two-a\ntwo-b\n"})
    yield _Moment(2, JobStatus.DONE, {1: "one-a\none-b\n", 2: "two-a\ntwo-b\n"})


async def test_a_followed_job_that_retried_shows_both_attempts_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    job = _Job(moments=list(_moments()))
    job._api = _Api()  # type: ignore[assignment]
    job.temporal = _Temporal(job)  # type: ignore[assignment]
    _Reader.job = job
    monkeypatch.setattr(client_logs, "LogReader", _Reader)
    chunks = [chunk async for chunk in job.logs("flaky", follow=True, poll_s=0)]
    assert "".join(chunks) == "one-a\none-b\ntwo-a\ntwo-b\n"
    # attempt 1's rest from its own host, from where the follow had left it
    assert ("q1", 1, len("one-a\n")) in job.asked
