"""`gpuflow apply` follows its jobs until they are over: a row that reads final while the job's
workflow is still open (an attempt ended and `retry` runs it again) is not the end."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from rich.console import Console
from temporalio.client import WorkflowExecutionStatus

from gpuflow.cli import follow
from gpuflow.errors import GpuflowError
from gpuflow.status import JobStatus


class _Job:
    """The job as the client reads it, poll after poll: its row, and whether it is open;
    `attempts`: its attempt at each poll (1 throughout when not given), and `events` the
    statuses it recorded, each with the poll from which on it is read."""

    def __init__(
        self,
        steps: list[tuple[JobStatus, str | None, bool]],
        attempts: list[int] | None = None,
        events: list[tuple[int, str, str]] | None = None,
    ) -> None:
        self.steps = steps
        self.attempts = attempts or [1] * len(steps)
        self.events = events or []
        self.polls = 0

    def now(self) -> tuple[JobStatus, str | None, bool]:
        return self.steps[min(self.polls, len(self.steps) - 1)]


class _Client:
    def __init__(self, job: _Job, *, placed: bool = False) -> None:
        self.job = job
        self.placed = placed
        self.temporal = self

    async def get(self, job_id: str) -> Any:
        status, reason, _ = self.job.now()
        attempt = self.job.attempts[min(self.job.polls, len(self.job.attempts) - 1)]
        self.job.polls += 1
        hosts = ["box"] if self.placed else []
        return SimpleNamespace(
            name="train",
            status=status,
            reason=reason,
            message="",
            hosts=hosts,
            fleet="lab",
            attempt=attempt,
        )

    async def events(self, job_id: str, *, most: int) -> Any:
        recorded = [(s, m) for poll, s, m in self.job.events if poll < self.job.polls]
        events = [SimpleNamespace(status=s, message=m) for s, m in recorded[-most:]]
        return SimpleNamespace(events=events, total=len(recorded))

    async def progress(self, job_id: str) -> Any:
        if not self.placed:
            raise GpuflowError("no progress here")
        status, _, _ = self.job.steps[min(self.job.polls - 1, len(self.job.steps) - 1)]
        node = SimpleNamespace(host_name="box", gpu_indices=[0, 1])
        placement = SimpleNamespace(nodes=[node])
        return SimpleNamespace(status=status, message="", placement=placement, simulated=True)

    def get_workflow_handle(self, job_id: str) -> Any:
        return self

    async def describe(self) -> Any:
        _, _, open_ = self.job.steps[min(self.job.polls - 1, len(self.job.steps) - 1)]
        running = WorkflowExecutionStatus.RUNNING
        return SimpleNamespace(status=running if open_ else WorkflowExecutionStatus.COMPLETED)


def test_a_job_preempted_and_requeued_is_followed_to_its_real_end(monkeypatch: Any) -> None:
    real_sleep = asyncio.sleep
    monkeypatch.setattr(follow.asyncio, "sleep", lambda _s: real_sleep(0))
    job = _Job(
        [
            (JobStatus.RUNNING, None, True),
            (JobStatus.TERMINATED, "preempted", True),  # attempt 1 ended; the job retries
            (JobStatus.PENDING, None, True),
            (JobStatus.RUNNING, None, True),
            (JobStatus.DONE, "done", False),
        ]
    )
    console = Console(width=80, record=True, force_terminal=False)
    ok = asyncio.run(follow.follow_jobs(console, _Client(job), ["job-train"]))
    assert ok
    assert job.polls == 5
    text = console.export_text()
    assert "terminated (preempted)" in text and text.count("train: running") == 2


def test_an_attempt_that_ended_between_two_polls_is_shown_as_recorded(monkeypatch: Any) -> None:
    """Preempted and requeued between two polls: the follow saw `running` then `pending` of
    attempt 2, and said nothing of the preemption (nor of a failed attempt retried at once)."""
    real_sleep = asyncio.sleep
    monkeypatch.setattr(follow.asyncio, "sleep", lambda _s: real_sleep(0))
    job = _Job(
        [
            (JobStatus.RUNNING, None, True),
            (JobStatus.PENDING, None, True),
            (JobStatus.PENDING, None, True),
            (JobStatus.DONE, "done", False),
        ],
        attempts=[1, 2, 3, 3],
        events=[
            (0, "pending", "waiting in queue default"),
            (0, "running", "running on 1 node(s)"),
            (1, "terminated", "preempted for job-high-1"),
            (1, "pending", "attempt 2: waiting in queue default"),
            (2, "running", "running on 1 node(s)"),
            (2, "failed", "node 0 exited with code 3"),
            (2, "pending", "attempt 3: retrying after process_failed"),
            (3, "done", "all processes exited with code 0"),
        ],
    )
    console = Console(width=80, record=True, force_terminal=False)
    asyncio.run(follow.follow_jobs(console, _Client(job), ["job-train"]))
    lines = [" ".join(line.split()) for line in console.export_text().splitlines()]
    preempted = lines.index("train: terminated preempted for job-high-1")
    failed = lines.index("train: failed node 0 exited with code 3")
    assert lines.index("train: running") < preempted < failed < lines.index("train: done")


def test_a_job_that_ended_is_shown_where_it_ran_as_while_it_ran(monkeypatch: Any) -> None:
    real_sleep = asyncio.sleep
    monkeypatch.setattr(follow.asyncio, "sleep", lambda _s: real_sleep(0))
    job = _Job([(JobStatus.RUNNING, None, True), (JobStatus.DONE, "done", False)])
    console = Console(width=80, record=True, force_terminal=False)
    assert asyncio.run(follow.follow_jobs(console, _Client(job, placed=True), ["job-train"]))
    final = console.export_text().splitlines()[-2:]
    assert "box:0,1 simulated" in " ".join(final)
    assert "box (lab)" not in console.export_text()


def test_a_job_whose_workflow_never_closes_is_not_followed_forever(monkeypatch: Any) -> None:
    """Its row reads done, its workflow stays open (its control worker went away before it
    closed): following ends FINAL_OPEN_S after the row ended, not never."""
    real_sleep = asyncio.sleep
    monkeypatch.setattr(follow.asyncio, "sleep", lambda _s: real_sleep(0.01))
    monkeypatch.setattr(follow, "FINAL_OPEN_S", 0.05)
    job = _Job([(JobStatus.DONE, "done", True)])
    console = Console(width=80, record=True, force_terminal=False)
    assert asyncio.run(follow.follow_jobs(console, _Client(job), ["job-train"]))
    assert 2 < job.polls < 50
