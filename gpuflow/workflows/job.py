"""JobWorkflow: place → provision → run → monitor → finalize, one workflow per job.

Deterministic code only: time comes from `workflow.now()`, waits are durable timers, and every
effect is an activity. Retrying and falling back are steps here, not activity retries.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ApplicationError, FailureError, TemporalError

from gpuflow.workflows import contract, steps
from gpuflow.workflows.job_state import Ending, idle_rule, probe_again_now, retry_deadline
from gpuflow.workflows.phases import JobPhases

with workflow.unsafe.imports_passed_through():
    from gpuflow import utilization
    from gpuflow.specs.job import check_priority
    from gpuflow.status import JobStatus, TerminationReason, retrying
    from gpuflow.workflows import monitor, ui
    from gpuflow.workflows.models import (
        JobInput,
        JobProgress,
        JobResult,
        JobResume,
        ProbeResult,
        ReleaseInput,
    )
    from gpuflow.workflows.outcome import failure_of
    from gpuflow.workflows.queue_models import Admission, Preemption, Refusal


TICKS_PER_RUN = 300
"""Monitor ticks after which a run continues as new even if Temporal has not suggested it, so
history stays small (a few thousand events) on any server."""
EARLY_ANSWER = timedelta(seconds=1)
"""A long poll that answers 'running' this much before its tick did not wait (an agent of an
older version waits 5 s at most): the rest of the tick is waited on a timer, so a loop of
probes can never spin."""

PATCH_LONG_POLL = "probe-long-poll"
"""Probes wait up to a tick on the agent for an exit; no timer between them."""
PATCH_FAIL_UNLESS_DONE = "fail-unless-done"
"""A job that did not end `done` fails its workflow (the UI lists it as failed)."""
PATCH_QUEUE_ATTRIBUTE = "queue-search-attribute"
"""A job started without `GpuflowQueue` (the run of a Temporal Schedule created outside
gpuflow's client, or before queues) sets it at its first step."""


@workflow.defn(name="JobWorkflow")
class JobWorkflow(JobPhases):
    # ---- handlers ---------------------------------------------------------------------------

    @workflow.signal
    def stop(self) -> None:
        """Stop the job: processes stopped, GPUs released, status `stopped`."""
        self._stop_requested = True

    @workflow.signal
    def capacity_changed(self) -> None:
        """Capacity was freed or added: a job waiting for it tries again now."""
        self._capacity_changed = True

    @workflow.signal
    def admitted(self, admission: Admission) -> None:
        """The admission loop admitted the waiting attempt: its allocation is taken."""
        if admission.attempt == self._attempt and self._placement is None:
            self._admission = admission

    @workflow.signal
    def refused(self, refusal: Refusal) -> None:
        """The admission loop could not admit an attempt that may not wait."""
        if refusal.attempt == self._attempt and self._placement is None:
            self._refusal = refusal

    @workflow.signal
    def waiting(self, why: Refusal) -> None:
        """Why the attempt waits in its queue, as the admission loop found it."""
        if why.attempt == self._attempt and self._placement is None:
            self._waiting_reasons = list(why.reasons)

    @workflow.signal
    def preempt(self, preemption: Preemption) -> None:
        """Stop the running attempt for a job the admission loop chose over it."""
        if preemption.attempt == self._attempt and self._placement is not None:
            self._preempted_for = preemption.for_job

    @workflow.signal
    def set_priority(self, priority: int) -> None:
        """The job's new priority within its queue (the API changed its entry already): the
        attempts after this one enter their queue with it. A value that is not a priority
        (sent from outside gpuflow) is ignored: kept, it would fail every later step."""
        try:
            check_priority(priority)
        except ValueError as exc:
            workflow.logger.warning("job %s: set_priority ignored: %s", self._job_id, exc)
            return
        self._priority = priority
        self._upsert(status=self._status, priority=priority)

    @workflow.query
    def progress(self) -> JobProgress:
        return JobProgress(
            job_id=self._job_id,
            name=self._name,
            status=self._status,
            attempt=self._attempt,
            placement=self._placement,
            reason=self._reason,
            message=self._message,
            waiting_reasons=self._waiting_reasons,
            simulated=bool(self._placement and any(n.simulated for n in self._placement.nodes)),
        )

    @workflow.query
    def utilization_window(self) -> utilization.UtilizationState:
        return self._utilization

    # ---- main -------------------------------------------------------------------------------

    @workflow.run
    async def run(self, inp: JobInput) -> JobResult:
        if inp.submitted_at is None or not inp.job_id:
            inp = inp.model_copy(
                update={
                    "submitted_at": inp.submitted_at or workflow.info().start_time,
                    "job_id": inp.job_id or workflow.info().workflow_id,
                }
            )
        self._job_id = inp.job_id
        self._name = inp.spec.name
        self._search_attributes = inp.search_attributes
        exit_codes: dict[int, int | None] = {}
        try:
            ending = await self._attempts(inp, exit_codes)
        except asyncio.CancelledError:
            # Cancelled from outside (e.g. `temporal workflow cancel`): compensate, then end as
            # cancelled. Activities started here still run: only the awaited one was cancelled.
            await self._finalize(Ending(TerminationReason.STOPPED_BY_USER, "workflow cancelled"))
            raise
        except Exception as error:
            if not _unexpected(error):
                raise
            ending = await self._fail_internally(error)
        return self._end(ending, exit_codes)

    async def _attempts(self, inp: JobInput, exit_codes: dict[int, int | None]) -> Ending:
        """Place, provision, start and monitor the job until an attempt ends for good; every
        attempt is compensated before the next one or the end."""
        spec = inp.spec
        resume = inp.resume
        first_look: list[ProbeResult] | None = None
        if resume is not None:
            self._attempt = resume.attempt
            self._placement = resume.placement
            self._utilization = resume.utilization
            self._status = JobStatus.RUNNING
            self._start_attempted = True
        else:
            started_with = workflow.info().typed_search_attributes
            if started_with.get(ui.SA_STATUS) is None:
                self._upsert(status=JobStatus.PENDING, priority=spec.priority)
            if (
                self._search_attributes
                and started_with.get(ui.SA_QUEUE) is None
                and self._patched(PATCH_QUEUE_ATTRIBUTE)
            ):
                workflow.upsert_search_attributes([ui.SA_QUEUE.value_set(spec.queue)])
            # Written by the first place step, in its transaction.
            self._set_status(JobStatus.PENDING, "submitted")
            self._unrecorded = self._status_record(JobStatus.PENDING, "submitted", spec=spec)
        while True:
            try:
                if resume is None:
                    self._placement = await self._place(inp)
                    await self._provision(self._placement)
                    first_look = await self._start(inp, self._placement)
                    self._utilization.nodes = len(self._placement.nodes)
                    resume = JobResume(
                        attempt=self._attempt,
                        placement=self._placement,
                        running_since=workflow.now(),
                        utilization=self._utilization,
                    )
                ending = await self._monitor(inp, resume, exit_codes, first_look)
                first_look = None
            except Ending as caught:
                ending = caught
            await self._finalize(ending)
            if not self._should_retry(inp, ending):
                return ending
            delay = self._retry_delay(ending, resume)
            if delay and workflow.now() + delay >= retry_deadline(inp):
                return ending  # no attempt could start in time
            self._attempt += 1
            self._requeued = ending.reason == TerminationReason.PREEMPTED
            self._start_attempted = False
            self._gone = set()
            self._preempted_for = None
            resume = None
            self._placement = None
            self._utilization = utilization.UtilizationState()
            wait_s = int(delay.total_seconds())
            await self._record(
                JobStatus.PENDING, retrying(self._attempt, ending.reason.value, wait_s)
            )
            if delay:
                await steps.wait_until(lambda: self._stop_requested, delay, "wait to retry")
                if self._stop_requested:
                    ending = self._interruption()
                    await self._finalize(ending)
                    return ending

    async def _fail_internally(self, error: Exception) -> Ending:
        """A bug, or an input nothing bounded, broke the workflow code: the job ends `failed`
        and is compensated like any other ending, instead of failing its workflow task (and
        being retried) forever."""
        ending = Ending(
            TerminationReason.INTERNAL_ERROR,
            f"gpuflow internal error: {type(error).__name__}: {error}",
        )
        workflow.logger.exception("job %s: %s", self._job_id, ending.message)
        try:
            await self._finalize(ending)
        except Exception as again:
            if not _unexpected(again):
                raise
            # Compensation broke too: fail the workflow; the fleet reconciler releases the
            # allocation of a closed workflow.
            raise ApplicationError(
                f"{ending.message}; compensation failed: {type(again).__name__}: {again}",
                type=TerminationReason.INTERNAL_ERROR.value,
                non_retryable=True,
            ) from None
        return ending

    def _end(self, ending: Ending, exit_codes: dict[int, int | None]) -> JobResult:
        """The job's result; a job that did not end `done` fails its workflow with it, so the
        UI does not list it as completed (histories from before that patch complete)."""
        result = JobResult(
            job_id=self._job_id,
            status=ending.reason.status,
            reason=ending.reason,
            message=ending.message,
            attempts=self._attempt,
            exit_codes=exit_codes,
            name=self._name,
        )
        failure = failure_of(result)
        if failure is not None and self._patched(PATCH_FAIL_UNLESS_DONE):
            raise failure
        return result

    async def _monitor(
        self,
        inp: JobInput,
        resume: JobResume,
        exit_codes: dict[int, int | None],
        first_look: list[ProbeResult] | None = None,
    ) -> Ending:
        spec = inp.spec
        placement = resume.placement
        policy = spec.utilization_policy
        long_poll = self._patched(PATCH_LONG_POLL)
        unseen_busy_s = idle_rule(policy)
        check = monitor.check_interval(policy, long_poll=long_poll)
        watch = monitor.Watch(failures=dict(resume.probe_failures), gone=self._gone)
        ticks = resume.ticks
        while True:
            tick = monitor.next_tick(
                ticks=ticks,
                check=check,
                policy=policy,
                state=self._utilization,
                failing=any(watch.failures.values()),
                now=workflow.now(),
                long_poll=long_poll,
            )
            if spec.max_duration is not None:
                ends = resume.running_since + monitor.span(spec.max_duration)
                left = ends - workflow.now()
                if left <= timedelta(0):
                    return Ending.of(monitor.max_duration_verdict(spec.max_duration))
                tick = min(tick, left)
            asked = workflow.now()
            nodes = placement.nodes
            probes: Sequence[ProbeResult | BaseException | None]
            if first_look is not None:  # every node had exited when its start returned
                probes, first_look = list(first_look), None
            elif long_poll:
                # A node whose script exited with 0 stays so: only the others are watched.
                nodes = [n for n in placement.nodes if n.rank not in watch.exit_codes]
                probes = await steps.long_poll(
                    inp.job_id,
                    self._attempt,
                    nodes,
                    tick,
                    self._interrupted,
                    policy.min_gpu_utilization if policy else None,
                )
                ticks += 1
            else:
                probes = await steps.probe_after_tick(
                    inp.job_id,
                    self._attempt,
                    placement.nodes,
                    tick,
                    self._interrupted,
                    first=ticks == 0,
                )
                ticks += 1
            if self._interrupted():
                return self._interruption()
            verdict = monitor.judge(
                watch,
                self._utilization,
                policy,
                nodes,
                probes,
                node_count=len(placement.nodes),
                max_gap_s=max(check, tick).total_seconds() * 2.5,
                unseen_busy_s=unseen_busy_s,
                describe=steps.failure_text,
            )
            exit_codes.update(watch.exit_codes)
            if verdict is not None:
                return Ending.of(verdict)
            if any(isinstance(p, ProbeResult) and p.samples for p in probes):
                workflow.set_current_details(self._details())
            rest = tick - (workflow.now() - asked)
            if long_poll and rest > EARLY_ANSWER and not probe_again_now(probes):
                await steps.wait_until(self._interrupted, rest, "monitor tick")
                if self._interrupted():
                    return self._interruption()
            if workflow.info().is_continue_as_new_suggested() or (
                ticks - resume.ticks >= TICKS_PER_RUN
            ):
                await workflow.wait_condition(workflow.all_handlers_finished)
                workflow.continue_as_new(
                    JobInput(
                        job_id=inp.job_id,
                        spec=self._spec(inp),
                        submitted_at=inp.submitted_at,
                        search_attributes=inp.search_attributes,
                        resume=JobResume(
                            attempt=self._attempt,
                            placement=placement,
                            running_since=resume.running_since,
                            utilization=self._utilization,
                            probe_failures=watch.failures,
                            ticks=ticks,
                        ),
                    )
                )

    async def _finalize(self, ending: Ending) -> None:
        """The one compensation for every ending: stop processes, release GPUs, record status."""
        placement = self._placement
        if placement is not None and self._start_attempted:
            left = [node for node in placement.nodes if node.rank not in self._gone]
            await steps.stop_processes(self._job_id, self._attempt, left)
        self._reason = ending.reason
        status = ending.reason.status
        self._set_status(status, ending.message)
        released = await steps.control(
            contract.release_job,
            ReleaseInput(
                job_id=self._job_id,
                record=self._status_record(status, ending.message, reason=ending.reason),
            ),
            f"release GPUs, record {status.value}",
        )
        self._upsert(status=status, placement=self._placement)
        others = [job for job in released.waiting_jobs if job != self._job_id]
        # Wake the jobs that wait for capacity, all at once; one that ended meanwhile is fine.
        await asyncio.gather(
            *(
                workflow.get_external_workflow_handle_for(JobWorkflow.run, other).signal(
                    JobWorkflow.capacity_changed
                )
                for other in others
            ),
            return_exceptions=True,
        )

    # ---- helpers ----------------------------------------------------------------------------

    def _interrupted(self) -> bool:
        return self._stop_requested or self._preempted_for is not None

    def _interruption(self) -> Ending:
        if self._stop_requested:
            return Ending(TerminationReason.STOPPED_BY_USER, "stopped by the user")
        return Ending(TerminationReason.PREEMPTED, f"preempted for {self._preempted_for}")


def _unexpected(error: Exception) -> bool:
    """Whether an exception that reached `run` is a failure of the workflow code (a bug, an
    overflow) rather than the SDK's own control flow: nondeterminism and sandbox errors must
    fail the workflow task, so a fixed worker can replay it."""
    return not isinstance(error, TemporalError) or isinstance(error, FailureError)


__all__ = ["JobWorkflow"]
