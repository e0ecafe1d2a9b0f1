"""A queue takes its nominal quota back from a borrower of its cohort, on the time-skipping
server (DESIGN.md, "Queues and admission"): the borrowing job chosen by the victim rules is
preempted, the owner's job runs on the GPU it freed, no GPU is held twice meanwhile, and a job
that is not preemptible is never the victim.

The server's clock runs at real pace and the running jobs end through their probes: the owner
waits in its queue until it is admitted, and a time skip could strand it there (see
test_queue_workflow)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from sqlmodel import select
from temporalio.client import WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from gpuflow.errors import NotFoundError
from gpuflow.services.capacity import allocations_of
from gpuflow.services.jobs import find_job, job_events
from gpuflow.services.queues import QueueUsage, apply_queue, list_queues
from gpuflow.specs.queue import ANY_MODEL, QueueSpec
from gpuflow.status import JobStatus, TerminationReason
from gpuflow.store.db import Store
from gpuflow.store.tables import AllocationRow, QueueEntryRow
from gpuflow.workflows.models import JobResult
from gpuflow.workflows.outcome import job_result
from tests.workflow.harness import job, sim_fleet, start_job
from tests.workflow.test_queue_workflow import _WallClockHosts, real_pace

TWO_GPUS = [{"name": "h1", "gpus": [{"name": "A100", "memory": "80GB", "count": 2}]}]
WAIT = {"on_events": ["no-capacity"], "duration": "1h"}


async def _until(check: Any, what: str, timeout: float = 30) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not await check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"never: {what}")
        await asyncio.sleep(0.05)


async def _status(store: Store, handle: WorkflowHandle[Any, Any]) -> str | None:
    def read() -> str | None:
        try:
            return find_job(store, handle.id).status
        except NotFoundError:  # its first record is not written yet
            return None

    return await asyncio.to_thread(read)


async def _runs(store: Store, handle: WorkflowHandle[Any, Any]) -> None:
    async def check() -> bool:
        return await _status(store, handle) == JobStatus.RUNNING

    await _until(check, f"{handle.id} runs")


async def _ended(store: Store, handle: WorkflowHandle[Any, Any]) -> JobResult:
    """The job's result once its record is final: a job that is never stopped fails the test
    within moments, instead of a wait on its result that lasts to the test's timeout."""

    async def check() -> bool:
        status = await _status(store, handle)
        return status is not None and JobStatus(status).is_final

    await _until(check, f"{handle.id} ends")
    return await job_result(handle)


async def _waits(store: Store, handle: WorkflowHandle[Any, Any], reason: str) -> None:
    def read() -> QueueEntryRow | None:
        with store.read() as session:
            return session.get(QueueEntryRow, handle.id)

    async def check() -> bool:
        entry = await asyncio.to_thread(read)
        return entry is not None and entry.state == "waiting" and entry.reason == reason

    await _until(check, f"{handle.id} waits ({reason})")


def _gpus(store: Store, handle: WorkflowHandle[Any, Any]) -> set[tuple[str, int]]:
    return {
        (row.host_id, gpu) for row in allocations_of(store, handle.id) for gpu in row.gpu_indices
    }


@dataclass
class Holders:
    """Every (host, GPU) -> the jobs that held it at the same moment, as often as the test
    could look: more than one job at once is a GPU given twice."""

    seen: list[dict[tuple[str, int], set[str]]] = field(default_factory=list)

    def twice(self) -> list[dict[tuple[str, int], set[str]]]:
        return [
            {gpu: jobs for gpu, jobs in look.items() if len(jobs) > 1}
            for look in self.seen
            if any(len(jobs) > 1 for jobs in look.values())
        ]

    def held_by(self, job_id: str) -> set[tuple[str, int]]:
        return {gpu for look in self.seen for gpu, jobs in look.items() if job_id in jobs}


@contextlib.asynccontextmanager
async def _watch_allocations(store: Store) -> AsyncIterator[Holders]:
    holders = Holders()

    def look() -> dict[tuple[str, int], set[str]]:
        with store.read() as session:
            rows = session.exec(select(AllocationRow)).all()
        held: dict[tuple[str, int], set[str]] = {}
        for row in rows:
            for gpu in row.gpu_indices:
                held.setdefault((row.host_id, gpu), set()).add(row.job_id)
        return held

    async def watch() -> None:
        while True:
            holders.seen.append(await asyncio.to_thread(look))
            await asyncio.sleep(0.02)

    task = asyncio.create_task(watch())
    try:
        yield holders
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        holders.seen.append(look())


def _usage(store: Store) -> dict[str, tuple[float, float, float]]:
    """Queue -> (used, borrowed, lent) GPUs, as `gpuflow queue list` shows them."""

    def total(amounts: dict[str, float]) -> float:
        return amounts.get(ANY_MODEL, 0.0)

    rows: list[QueueUsage] = list_queues(store)
    return {q.spec.name: (total(q.used), total(q.borrowed), total(q.lent)) for q in rows}


@contextlib.asynccontextmanager
async def _lab(
    env: WorkflowEnvironment, store: Store, task_queue: str
) -> AsyncIterator[tuple[Holders, _WallClockHosts]]:
    """One host of two GPUs, and the queues research and prod, one GPU of quota each, lending
    each other what they do not use; the allocations watched, the clock at real pace."""
    fleet = sim_fleet(store, hosts=TWO_GPUS)
    apply_queue(store, QueueSpec(name="research", gpus=1, cohort="lab"))
    apply_queue(store, QueueSpec(name="prod", gpus=1, cohort="lab"))
    async with (
        _watch_allocations(store) as holders,
        real_pace(env, store, task_queue, fleet) as hosts,
    ):
        yield holders, hosts


async def test_a_queue_takes_its_quota_back_from_the_latest_preemptible_borrower(
    time_env: WorkflowEnvironment, sqlite_store: Store, task_queue: str
) -> None:
    client = time_env.client
    async with _lab(time_env, sqlite_store, task_queue) as (holders, hosts):
        early = await start_job(
            client, task_queue, job("early", queue="research", preemptible=True)
        )
        await _runs(sqlite_store, early)
        # Same GPUs and priority as `early`, started later: the victim rules pick it.
        late = await start_job(client, task_queue, job("late", queue="research", preemptible=True))
        await _runs(sqlite_store, late)
        borrowed_gpus = _gpus(sqlite_store, late)
        assert _usage(sqlite_store)["research"] == (2.0, 1.0, 0.0)  # prod's idle GPU
        assert _usage(sqlite_store)["prod"] == (0.0, 0.0, 1.0)

        owner = await start_job(client, task_queue, job("owner", queue="prod", retry=WAIT))
        late_result = await _ended(sqlite_store, late)
        await _runs(sqlite_store, owner)
        assert _gpus(sqlite_store, owner) == borrowed_gpus  # the GPU the borrower gave back
        assert await _status(sqlite_store, early) == JobStatus.RUNNING
        assert _usage(sqlite_store)["research"] == (1.0, 0.0, 0.0)
        assert _usage(sqlite_store)["prod"] == (1.0, 0.0, 0.0)
        # Only the borrower was stopped; the other research job runs on (every job's
        # compensation stops its processes too, so this is read before the others end).
        assert [(s.job_id, s.attempt) for s in hosts.stopped] == [(late.id, 1)]

        hosts.ended.update({"early", "owner"})
        early_result, owner_result = await job_result(early), await job_result(owner)

    assert (late_result.status, late_result.reason) == (
        JobStatus.TERMINATED,
        TerminationReason.PREEMPTED,
    )
    assert late_result.message == f"preempted for {owner.id}"
    assert any(
        e.kind == "terminated" and f"preempted for {owner.id}" in e.message
        for e in job_events(sqlite_store, late.id)
    )
    assert [(r.status, r.attempts) for r in (early_result, owner_result)] == [
        (JobStatus.DONE, 1)
    ] * 2
    assert [s.job_id for s in hosts.started] == [early.id, late.id, owner.id]
    assert holders.twice() == []
    assert holders.held_by(owner.id) == borrowed_gpus
    assert holders.held_by(early.id).isdisjoint(borrowed_gpus)
    for handle in (early, late, owner):
        assert allocations_of(sqlite_store, handle.id) == []


async def test_a_borrower_that_is_not_preemptible_is_never_preempted(
    time_env: WorkflowEnvironment, sqlite_store: Store, task_queue: str
) -> None:
    """The owner waits for capacity instead, and gets the first GPU a borrower gives back."""
    client = time_env.client
    async with _lab(time_env, sqlite_store, task_queue) as (holders, hosts):
        early = await start_job(client, task_queue, job("early", queue="research"))
        await _runs(sqlite_store, early)
        late = await start_job(client, task_queue, job("late", queue="research"))
        await _runs(sqlite_store, late)
        assert _usage(sqlite_store)["research"] == (2.0, 1.0, 0.0)
        late_gpus = _gpus(sqlite_store, late)

        owner = await start_job(client, task_queue, job("owner", queue="prod", retry=WAIT))
        await _waits(sqlite_store, owner, "no_capacity")
        assert hosts.stopped == []
        hosts.ended.add("late")
        late_result = await job_result(late)
        await _runs(sqlite_store, owner)
        assert _gpus(sqlite_store, owner) == late_gpus
        hosts.ended.update({"early", "owner"})
        results = [await job_result(h) for h in (early, owner)]

    assert [(r.status, r.attempts) for r in (late_result, *results)] == [(JobStatus.DONE, 1)] * 3
    assert [s.job_id for s in hosts.started] == [early.id, late.id, owner.id]
    assert holders.twice() == []


async def test_the_owner_passes_over_a_later_borrower_that_is_not_preemptible(
    time_env: WorkflowEnvironment, sqlite_store: Store, task_queue: str
) -> None:
    """The most recently started borrower is not preemptible: the preemptible job started
    before it is the victim."""
    client = time_env.client
    async with _lab(time_env, sqlite_store, task_queue) as (holders, hosts):
        early = await start_job(
            client, task_queue, job("early", queue="research", preemptible=True)
        )
        await _runs(sqlite_store, early)
        keeper = await start_job(client, task_queue, job("keeper", queue="research"))
        await _runs(sqlite_store, keeper)
        early_gpus = _gpus(sqlite_store, early)

        owner = await start_job(client, task_queue, job("owner", queue="prod", retry=WAIT))
        early_result = await _ended(sqlite_store, early)
        await _runs(sqlite_store, owner)
        assert _gpus(sqlite_store, owner) == early_gpus
        assert await _status(sqlite_store, keeper) == JobStatus.RUNNING
        assert [s.job_id for s in hosts.stopped] == [early.id]
        hosts.ended.update({"keeper", "owner"})
        results = [await job_result(h) for h in (keeper, owner)]

    assert (early_result.status, early_result.reason) == (
        JobStatus.TERMINATED,
        TerminationReason.PREEMPTED,
    )
    assert [(r.status, r.attempts) for r in results] == [(JobStatus.DONE, 1)] * 2
    assert holders.twice() == []
