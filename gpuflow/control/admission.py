"""Control activities of the queue: a job entering it (or asking what became of it), leaving
it, and the admission pass. Each is one placement transaction; each is idempotent."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Any

from temporalio import activity
from temporalio.client import Client

from gpuflow.control.admission_wake import wake_admission
from gpuflow.control.records import record_in
from gpuflow.metrics import store as metrics
from gpuflow.services.admission import SpecCache, run_pass_in
from gpuflow.services.queue_entries import enqueue_in, enter_at_submit_in, look_in, withdraw_in
from gpuflow.specs.job import JobSpec
from gpuflow.store.db import Store
from gpuflow.workflows.queue_models import (
    EnqueueInput,
    PassInput,
    PassResult,
    QueueVerdict,
    WithdrawInput,
)


def enter_at_submit(
    store: Store, *, job_id: str, run_id: str, spec: JobSpec, warm: bool = True
) -> QueueVerdict:
    """The submit's part of placing (the API runs it once the job's workflow started): the job's
    first record and its queue entry in one placement transaction, admitted there when nobody
    waits. The caller wakes the admission loop when the verdict is to wait."""
    started = time.perf_counter()
    with store.placement_transaction() as session:
        at = datetime.now(UTC)
        verdict = enter_at_submit_in(
            session, job_id=job_id, run_id=run_id, spec=spec, at=at, warm=warm
        )
        if verdict.placement is not None:
            metrics.observe_admitted(session, job_id, 1, verdict.placement.fleet)
    if verdict.placement is not None:
        metrics.observe_placement(time.perf_counter() - started, verdict.placement)
    return verdict


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

    @activity.defn(name="enqueue_job")
    async def enqueue_job(self, inp: EnqueueInput) -> QueueVerdict:
        """Enter the queue, or learn what became of the entry; asks for a pass while waiting."""

        def write() -> QueueVerdict:
            # Entered already (at submit, or by an earlier ask): a read says what became of it;
            # its `submitted` record was written with the entry.
            with self.store.read() as session:
                known = look_in(session, job_id=inp.job_id, attempt=inp.attempt)
            if known is not None:
                return known
            with self.store.placement_transaction() as session:
                if inp.before is not None:
                    record_in(session, inp.before)
                verdict = enqueue_in(session, inp, warm=self.warm)
                if verdict.placement is not None:
                    metrics.observe_admitted(
                        session, inp.job_id, inp.attempt, verdict.placement.fleet
                    )
                return verdict

        started = time.perf_counter()
        verdict = await asyncio.to_thread(write)
        if verdict.placement is not None:
            metrics.observe_placement(time.perf_counter() - started, verdict.placement)
        if verdict.placement is None and verdict.refused is None:
            await wake_admission(self.temporal, self.task_queue)
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

        def run() -> PassResult:
            with self.store.placement_transaction() as session:
                outcome = run_pass_in(
                    session, reservation=inp.reservation, specs=self._specs, warm=self.warm
                )
                for job in outcome.admitted:
                    metrics.observe_admitted(session, job.job_id, job.attempt, job.placement.fleet)
            return PassResult(
                admitted=outcome.admitted,
                preempted=outcome.preempted,
                refused=outcome.refused,
                held=outcome.held,
                reservation=outcome.reservation,
                waiting=outcome.waiting,
            )

        started = time.perf_counter()
        result = await asyncio.to_thread(run)
        took = time.perf_counter() - started
        for job in result.admitted:  # each was placed by this pass
            metrics.observe_placement(took, job.placement)
        return result

    def activities(self) -> list[Any]:
        return [self.enqueue_job, self.withdraw_job, self.admission_pass]
