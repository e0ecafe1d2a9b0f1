"""Control activities of the queue: a job entering it (or asking what became of it), leaving
it, and the admission pass. Each is one placement transaction; each is idempotent."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from temporalio import activity
from temporalio.client import Client

from gpuflow.control.admission_wake import ask_for_pass, wake_admission
from gpuflow.control.batches import Batches
from gpuflow.control.records import record_in
from gpuflow.metrics import store as metrics
from gpuflow.services.admission import SpecCache, run_pass_in
from gpuflow.services.group_entry import Submitted, enter_group_in
from gpuflow.services.queue_entries import enqueue_in, look_all_in, retold_in, withdraw_in
from gpuflow.specs.job import JobSpec
from gpuflow.store.db import Store
from gpuflow.workflows.queue_models import (
    AdmittedJob,
    EnqueueInput,
    PassInput,
    PassResult,
    QueueVerdict,
    WithdrawInput,
)

log = logging.getLogger(__name__)

MAX_GROUP = 64
"""Submits entered in one placement transaction at most: a group holds the placement lock (and
the admission loop) for its whole length, about a millisecond or two per job."""


def enter_at_submit(
    store: Store, *, job_id: str, run_id: str, spec: JobSpec, warm: bool = True
) -> QueueVerdict:
    """The submit's part of placing (the API runs it once the job's workflow started): the job's
    first record and its queue entry in one placement transaction, admitted there when nobody
    waits. The caller wakes the admission loop when the verdict is to wait."""
    found = enter_all_at_submit(store, [Submitted(job_id, run_id, spec)], warm=warm)[0]
    if isinstance(found, Exception):
        raise found
    return found


def enter_all_at_submit(
    store: Store, jobs: Sequence[Submitted], *, warm: bool = True
) -> list[QueueVerdict | Exception]:
    """`enter_at_submit` for several jobs in one placement transaction (group commit), in their
    order: each sees the ones before it, as if each had its own transaction, and the lock, the
    counters, the fleets' mix and the commit are paid once. When the group fails, each job is
    entered alone, so one job's error is its own."""
    if len(jobs) > 1:
        try:
            return list(_enter_group(store, jobs, warm))
        except Exception as exc:
            log.warning("a group of %d submits failed (%s): entering each alone", len(jobs), exc)
    found: list[QueueVerdict | Exception] = []
    for job in jobs:
        try:
            found.extend(_enter_group(store, [job], warm))
        except Exception as exc:  # this job's own error, for its submit to raise
            found.append(exc)
    return found


def _enter_group(store: Store, jobs: Sequence[Submitted], warm: bool) -> list[QueueVerdict]:
    started = time.perf_counter()
    with store.placement_transaction() as session:
        verdicts = enter_group_in(session, jobs, warm=warm)
        for job, verdict in zip(jobs, verdicts, strict=True):
            if verdict.placement is not None:
                metrics.observe_admitted(session, job.job_id, 1, verdict.placement.fleet)
    took = time.perf_counter() - started
    for verdict in verdicts:
        if verdict.placement is not None:
            metrics.observe_placement(took, verdict.placement)
    return verdicts


MAX_LOOKS = 256
"""First steps' reads answered by one read transaction at most."""
MAX_DECIDED = 1024
"""Decided submits whose first step has not come yet, kept at most (the oldest go first: a
first step that runs on another control worker reads its verdict there)."""


class GroupCommit:
    """Submits of one control worker entered in groups (batches.py: those that arrive while a
    group's transaction runs are the next group, at most MAX_GROUP, in arrival order). Alone, a
    submit is entered at once; under load the placement lock is taken once per group.

    A submit decided as it entered (admitted, or refused) keeps its verdict here until its
    workflow's first step in this worker takes it (`decided`): what a read of the entry would
    say then, since an admitted entry changes only by its own workflow's steps and a refused one
    never, so the step needs no read transaction. A verdict to wait is not kept: a pass may
    have admitted the job since."""

    def __init__(self, store: Store, *, warm: bool = True) -> None:
        self.store = store
        self.warm = warm
        self._batches: Batches[Submitted, QueueVerdict] = Batches(self._serve, MAX_GROUP)
        self._entering: dict[str, asyncio.Future[QueueVerdict]] = {}
        """Job id -> the answer its submit awaits, until it has it."""
        self._decided: OrderedDict[str, QueueVerdict] = OrderedDict()
        """Job id -> its submit's verdict, admitted or refused, until its first step takes it
        (at most MAX_DECIDED: a first step that never comes here must not hold memory)."""

    @property
    def groups(self) -> int:
        """Transactions run (for tests and the benchmark)."""
        return self._batches.batches

    def _serve(self, jobs: Sequence[Submitted]) -> list[QueueVerdict | Exception]:
        return enter_all_at_submit(self.store, jobs, warm=self.warm)

    def entering(self, job_id: str) -> asyncio.Future[QueueVerdict] | None:
        """The answer a submit of this job waits for, while it waits (its workflow's first
        step, started eagerly, may come before the group has entered it)."""
        return self._entering.get(job_id)

    async def enter(self, job: Submitted) -> QueueVerdict:
        future = self._batches.submit(job)
        self._entering[job.job_id] = future
        future.add_done_callback(lambda done: self._forget(job.job_id, done))
        return await future

    def decided(self, job_id: str) -> QueueVerdict | None:
        """The verdict of the job's submit in this worker, admitted or refused, once: for its
        workflow's first step (see the class docstring)."""
        return self._decided.pop(job_id, None)

    def _forget(self, job_id: str, future: asyncio.Future[QueueVerdict]) -> None:
        if self._entering.get(job_id) is not future:
            return
        del self._entering[job_id]
        if future.cancelled() or future.exception() is not None:
            return
        verdict = future.result()
        if verdict.placement is not None or verdict.refused is not None:
            self._decided[job_id] = verdict
            while len(self._decided) > MAX_DECIDED:
                self._decided.popitem(last=False)


class AdmissionActivities:
    def __init__(
        self,
        store: Store,
        *,
        temporal: Client | None = None,
        warm: bool = True,
        task_queue: str | None = None,
    ) -> None:
        self.store = store
        self.task_queue = task_queue
        self.temporal = temporal
        self.warm = warm
        self._specs: SpecCache = {}
        """Parsed specs of waiting jobs, kept between passes: a pass parses only newcomers."""
        self._looks: Batches[tuple[str, int], QueueVerdict | None] = Batches(
            self._look_all, MAX_LOOKS
        )
        """First steps' reads of what became of their entries, batched: under load, those that
        come together share one read transaction."""
        self.entries: GroupCommit | None = None
        """The API's group commit in this worker: a first step whose submit is still entering
        the job waits for that answer instead of taking the placement lock beside it."""

    def _look_all(self, asks: Sequence[tuple[str, int]]) -> list[QueueVerdict | None]:
        with self.store.read() as session:
            return look_all_in(session, asks)

    async def _join_submit(self, inp: EnqueueInput) -> QueueVerdict | None:
        """The verdict of the job's submit, when it is entering the job in this worker right
        now (what it writes is what this step would: the same `submitted` record and entry), or
        entered it already and decided it (`GroupCommit.decided`). None otherwise, or when that
        submit fails: the step reads what became of the entry, or enters the job itself."""
        if self.entries is None or inp.attempt != 1:
            return None
        pending = self.entries.entering(inp.job_id)
        if pending is None:
            return self.entries.decided(inp.job_id)
        try:
            verdict = await asyncio.shield(pending)
        except (Exception, asyncio.CancelledError):
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # this step itself is cancelled
            return None
        self.entries.decided(inp.job_id)  # this step has it: not kept for another
        return verdict

    @activity.defn(name="enqueue_job")
    async def enqueue_job(self, inp: EnqueueInput) -> QueueVerdict:
        """Enter the queue, or learn what became of the entry; asks for a pass while waiting."""

        def write() -> QueueVerdict:
            with self.store.placement_transaction() as session:
                if inp.before is not None:
                    record_in(session, inp.before)
                verdict = enqueue_in(session, inp, warm=self.warm)
                if verdict.placement is not None:
                    metrics.observe_admitted(
                        session, inp.job_id, inp.attempt, verdict.placement.fleet
                    )
                return verdict

        joined = await self._join_submit(inp)
        if joined is not None:
            return joined
        # Entered already (at submit, or by an earlier ask): a read says what became of it (its
        # `submitted` record was written with the entry; whoever placed it observed that).
        verdict = await self._looks.call((inp.job_id, inp.attempt))
        if verdict is None:
            started = time.perf_counter()
            verdict = await asyncio.to_thread(write)
            if verdict.placement is not None:
                metrics.observe_placement(time.perf_counter() - started, verdict.placement)
        if verdict.placement is None and verdict.refused is None:
            await ask_for_pass(self.temporal, self.task_queue)
        return verdict

    @activity.defn(name="withdraw_job")
    async def withdraw_job(self, inp: WithdrawInput) -> QueueVerdict:
        """Stop waiting; an attempt already admitted gets its placement back instead."""

        def write() -> QueueVerdict:
            with self.store.placement_transaction() as session:
                return withdraw_in(session, job_id=inp.job_id, attempt=inp.attempt)

        verdict = await asyncio.to_thread(write)
        if verdict.placement is None:
            # a reservation it held is free for the others
            await wake_admission(self.temporal, self.task_queue)
        return verdict

    @activity.defn(name="admission_pass")
    async def admission_pass(self, inp: PassInput) -> PassResult:
        """One pass: admit what fits in queue order, commit it, say whom to tell."""

        def run() -> tuple[PassResult, list[AdmittedJob]]:
            with self.store.placement_transaction() as session:
                again, refused_again = retold_in(session, inp.pass_id) if inp.pass_id else ([], [])
                outcome = run_pass_in(
                    session,
                    reservation=inp.reservation,
                    specs=self._specs,
                    warm=self.warm,
                    pass_id=inp.pass_id,
                )
                for job in outcome.admitted:
                    metrics.observe_admitted(session, job.job_id, job.attempt, job.placement.fleet)
            result = PassResult(
                admitted=[*again, *outcome.admitted],
                preempted=outcome.preempted,
                refused=[*refused_again, *outcome.refused],
                held=outcome.held,
                reservation=outcome.reservation,
                waiting=outcome.waiting,
                more=outcome.more,
            )
            return result, outcome.admitted

        started = time.perf_counter()
        result, placed = await asyncio.to_thread(run)
        took = time.perf_counter() - started
        for job in placed:  # placed by this run, not told again
            metrics.observe_placement(took, job.placement)
        return result

    def activities(self) -> list[Any]:
        return [self.enqueue_job, self.withdraw_job, self.admission_pass]
