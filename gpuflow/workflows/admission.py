"""AdmissionWorkflow: the admission loop, one per namespace (id `gpuflow-admission`).

Asks for a pass (a job entering its queue, capacity released, a host back, a queue or fleet
applied) arrive as `wake` signals; asks that arrive during a pass are answered by the next one,
so a burst of releases costs one pass, not one per release. Each pass is one activity
(admission_pass) that decides and commits in one placement transaction; then the loop tells
exactly the jobs concerned: the admitted ones their placement, the refused ones why, the newly
held ones why they wait (once), and the victims of a preemption to stop. Nobody else is woken:
waiting costs nothing.

The pass and the telling are local activities of the worker that runs the loop: an admitted
job hears of its placement as soon as the pass has committed it, with no task queue round trip
before the pass and no workflow task between its commit and the signals (about 100 ms of a
job's start on a busy machine, when a low-priority job admitted just before a high-priority one
arrives would start after it). A job the worker could not tell is told by the loop's own signal
command.

Being one workflow id makes passes one at a time with any number of control workers; a loop
killed with its worker goes on where its history stops. The step that enters a job to wait
asks for a pass until the ask is delivered (control/admission_wake.py `ask_for_pass`); any
other ask that was lost costs a wait, not a job: while jobs wait, the loop passes at least
every SAFETY_PASS on its own (one timer for all of them; an idle loop keeps none and costs
nothing). A verdict that was lost is told again: a
pass whose result the loop did not record (its worker died before) runs again with the same
`pass_id`, and tells again what its lost run committed. A job asks again only rarely
(phases.ADMISSION_CHECK), for a loop that is gone: asking starts the loop if it is not running.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

from gpuflow.workflows import contract

with workflow.unsafe.imports_passed_through():
    from gpuflow.workflows.queue_models import (
        AdmissionState,
        PassInput,
        PassResult,
        TellResult,
        news_of,
    )

PASSES_PER_RUN = 200
"""Passes after which the loop continues as new (about 10 events each)."""
PASS_TIMEOUT = timedelta(minutes=2)
PASS_RETRY = RetryPolicy(maximum_interval=timedelta(seconds=10))
TELL_TIMEOUT = timedelta(seconds=30)
"""Signals to the jobs of one pass, sent side by side; those not sent by then are sent by the
loop's own commands."""
SAFETY_PASS = timedelta(seconds=60)
"""While jobs wait, the longest the loop goes without a pass: what a lost ask (a wake the server
did not take) costs. It was each waiting job's own check before, one ask per job per minute."""
HOLD_SIGNAL = "hold"
"""The signal that holds the loop or lets it go (workflows/handles.py `hold_admission`)."""
PATCH_SAFETY = "admission-safety-pass"
"""The loop's own pass while jobs wait, and passes with an id; before, a loop kept no timer and
every waiting job asked again each minute (histories from then replay that way)."""
PATCH_LOCAL_PASS = "admission-local-pass"
"""The pass and the telling are local activities; before, the pass was an activity task and the
loop signalled each job itself (histories from then replay that way)."""


@workflow.defn(name="AdmissionWorkflow")
class AdmissionWorkflow:
    def __init__(self) -> None:
        self._asked = False
        self._held: bool | None = None
        """Set by the `hold` signal; None until then (the state carried over says)."""
        self._tick_task: asyncio.Task[None] | None = None
        """The SAFETY_PASS timer, while it runs (it is never cancelled: see `_tick`)."""

    @workflow.signal
    def wake(self) -> None:
        """Something that admission reads changed: pass again."""
        self._asked = True

    @workflow.signal(name=HOLD_SIGNAL)
    def hold(self, held: bool) -> None:
        """Hold the loop (no pass runs; asks wait) or let it go on. `gpuflow down` holds it
        before stopping running jobs, so the capacity they free does not start waiting jobs
        just before the stack goes down; `gpuflow up` lets it go."""
        self._held = held
        held_by = "held (gpuflow down, or Client.hold_admission)"
        workflow.set_current_details(held_by if held else "")

    @workflow.query
    def held(self) -> bool:
        """Whether the loop is held (`gpuflow ps` says so: the reasons it shows are then the
        last pass's)."""
        return bool(self._held)

    @workflow.run
    async def run(self, state: AdmissionState) -> None:
        self._asked = True  # a (re)started loop passes at once: it may have missed asks
        if self._held is None:
            self._held = state.held
        safety = workflow.patched(PATCH_SAFETY)
        for _ in range(PASSES_PER_RUN):
            await workflow.wait_condition(lambda: self._asked and not self._held)
            self._asked = False
            local = workflow.patched(PATCH_LOCAL_PASS)
            ask = PassInput(reservation=state.reservation)
            if safety:
                ask.pass_id = str(workflow.uuid4())  # the same in a replay of this pass
            result = await _pass(ask, local=local)
            state.reservation = result.reservation
            if result.more:  # it left some for the next pass (older results never do)
                self._asked = True
            ticking = self._tick_task is not None and not self._tick_task.done()
            if safety and result.waiting and not ticking:
                self._tick_task = asyncio.create_task(self._tick())
            await _tell(result, only=await _tell_from_worker(result) if local else None)
            if workflow.info().is_continue_as_new_suggested():
                break
        await workflow.wait_condition(workflow.all_handlers_finished)
        state.held = bool(self._held)
        workflow.continue_as_new(state)

    async def _tick(self) -> None:
        """Pass again after SAFETY_PASS. The timer is left to fire, never cancelled when an ask
        comes first: one fires at most every SAFETY_PASS, and a loop cancelling a timer that
        the time-skipping test server fired meanwhile would be stranded there
        (temporalio/sdk-java#3088)."""
        await workflow.sleep(SAFETY_PASS, summary="pass while jobs wait")
        self._asked = True


async def _pass(ask: PassInput, *, local: bool) -> PassResult:
    if local:
        found: PassResult = await workflow.execute_local_activity(
            contract.admission_pass,
            ask,
            summary="admission pass",
            start_to_close_timeout=PASS_TIMEOUT,
            retry_policy=PASS_RETRY,
        )
        return found
    return await workflow.execute_activity(
        contract.admission_pass,
        ask,
        summary="admission pass",
        start_to_close_timeout=PASS_TIMEOUT,
        retry_policy=PASS_RETRY,
    )


async def _tell_from_worker(result: PassResult) -> set[str]:
    """Tell the jobs the pass decided on from the worker, at once; the jobs left to tell."""
    jobs = {job_id for job_id, _, _ in news_of(result)}
    if not jobs:
        return set()
    try:
        told: TellResult = await workflow.execute_local_activity(
            contract.tell_jobs,
            result,
            summary=f"tell {len(jobs)} job(s)",
            start_to_close_timeout=TELL_TIMEOUT,
            retry_policy=RetryPolicy(maximum_attempts=1),  # the loop's commands are the retry
        )
    except (ActivityError, ApplicationError):  # a failed local activity raises its own error
        return jobs
    return set(told.untold)


async def _tell(result: PassResult, *, only: set[str] | None = None) -> None:
    """Signal the jobs the pass decided on (`only` these, when given); a job that ended
    meanwhile is fine (its entry went with its release, or its next ask finds its verdict)."""
    sends = [
        _signal(job_id, name, payload)
        for job_id, name, payload in news_of(result)
        if only is None or job_id in only
    ]
    await asyncio.gather(*sends, return_exceptions=True)


async def _signal(job_id: str, name: str, payload: object) -> None:
    await workflow.get_external_workflow_handle(job_id).signal(name, payload)


__all__ = ["AdmissionWorkflow"]
