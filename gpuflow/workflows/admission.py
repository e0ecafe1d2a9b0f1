"""AdmissionWorkflow: the admission loop, one per namespace (id `gpuflow-admission`).

Asks for a pass (a job entering its queue, capacity released, a host back, a queue or fleet
applied) arrive as `wake` signals; asks that arrive during a pass are answered by the next one,
so a burst of releases costs one pass, not one per release. Each pass is one activity
(admission_pass) that decides and commits in one placement transaction; then the loop tells
exactly the jobs concerned: the admitted ones their placement, the refused ones why, the newly
held ones why they wait (once), and the victims of a preemption to stop. Nobody else is woken:
waiting costs nothing.

Being one workflow id makes passes one at a time with any number of control workers; a loop
killed with its worker goes on where its history stops. It keeps no timer: an idle loop costs
nothing. An ask that was lost is made again: every waiting job asks again on its own schedule
(phases.ADMISSION_CHECK), and asking starts the loop if it is not running.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

from gpuflow.workflows import contract

with workflow.unsafe.imports_passed_through():
    from gpuflow.workflows.queue_models import (
        Admission,
        AdmissionState,
        PassInput,
        PassResult,
        Preemption,
        Refusal,
    )

PASSES_PER_RUN = 200
"""Passes after which the loop continues as new (about 10 events each)."""
PASS_TIMEOUT = timedelta(minutes=2)


@workflow.defn(name="AdmissionWorkflow")
class AdmissionWorkflow:
    def __init__(self) -> None:
        self._asked = False

    @workflow.signal
    def wake(self) -> None:
        """Something that admission reads changed: pass again."""
        self._asked = True

    @workflow.run
    async def run(self, state: AdmissionState) -> None:
        self._asked = True  # a (re)started loop passes at once: it may have missed asks
        for _ in range(PASSES_PER_RUN):
            await workflow.wait_condition(lambda: self._asked)
            self._asked = False
            result: PassResult = await workflow.execute_activity(
                contract.admission_pass,
                PassInput(reservation=state.reservation),
                summary="admission pass",
                start_to_close_timeout=PASS_TIMEOUT,
                retry_policy=RetryPolicy(maximum_interval=timedelta(seconds=10)),
            )
            state.reservation = result.reservation
            await _tell(result)
            if workflow.info().is_continue_as_new_suggested():
                break
        await workflow.wait_condition(workflow.all_handlers_finished)
        workflow.continue_as_new(state)


async def _tell(result: PassResult) -> None:
    """Signal the jobs the pass decided on; a job that ended meanwhile is fine (its entry went
    with its release, or its next ask finds its verdict)."""
    sends = [
        _signal(job.job_id, "admitted", Admission(attempt=job.attempt, placement=job.placement))
        for job in result.admitted
    ]
    sends += [
        _signal(job.job_id, "refused", Refusal(attempt=job.attempt, reasons=job.reasons))
        for job in result.refused
    ]
    sends += [
        _signal(job.job_id, "waiting", Refusal(attempt=job.attempt, reasons=job.reasons))
        for job in result.held
    ]
    sends += [
        _signal(job.job_id, "preempt", Preemption(attempt=job.attempt, for_job=job.for_job))
        for job in result.preempted
    ]
    await asyncio.gather(*sends, return_exceptions=True)


async def _signal(job_id: str, name: str, payload: object) -> None:
    await workflow.get_external_workflow_handle(job_id).signal(name, payload)


__all__ = ["AdmissionWorkflow"]
