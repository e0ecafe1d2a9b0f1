"""JobWorkflow: place → provision → run → monitor → finalize, one workflow per job.

Deterministic code only: time comes from `workflow.now()`, waits are durable timers, and every
effect is an activity. Retrying and falling back are steps here, not activity retries.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.common import (
    RetryPolicy,
    SearchAttributeKey,
    SearchAttributePair,
    SearchAttributeUpdate,
    TypedSearchAttributes,
)
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from gpuflow import utilization
    from gpuflow.scheduler.model import Placement
    from gpuflow.specs.job import JobSpec
    from gpuflow.specs.units import format_duration
    from gpuflow.status import JobStatus, RetryEvent, TerminationReason
    from gpuflow.workflows.models import (
        JobInput,
        JobProgress,
        JobResult,
        JobResume,
        JobStatusInput,
        PlaceInput,
        PlaceResult,
        ProbeInput,
        ProbeResult,
        ProcessHandle,
        ProvisionInput,
        ProvisionResult,
        ReleaseInput,
        ReleaseResult,
        StartProcessInput,
        StopProcessInput,
        StopProcessResult,
        placed_message,
    )

SA_STATUS = SearchAttributeKey.for_keyword("GpuflowStatus")
SA_FLEET = SearchAttributeKey.for_keyword("GpuflowFleet")
SA_GPU = SearchAttributeKey.for_keyword("GpuflowGpu")
SA_PRIORITY = SearchAttributeKey.for_int("GpuflowPriority")
SEARCH_ATTRIBUTES = {
    "GpuflowStatus": "Keyword",
    "GpuflowFleet": "Keyword",
    "GpuflowGpu": "Keyword",
    "GpuflowPriority": "Int",
}


def initial_search_attributes(spec: JobSpec) -> TypedSearchAttributes:
    """What a job's workflow starts with (the client sets them, so the UI lists the job as
    pending from its first moment, and the workflow needs no upsert of its own)."""
    return TypedSearchAttributes(
        [
            SearchAttributePair(SA_STATUS, JobStatus.PENDING.value),
            SearchAttributePair(SA_PRIORITY, spec.priority),
        ]
    )


CAPACITY_BACKOFF_FIRST = timedelta(seconds=5)
CAPACITY_BACKOFF_MAX = timedelta(minutes=5)
IDLE_TICK_MAX = timedelta(seconds=60)
"""Tick of a job without a utilization policy: how late its exit may be noticed."""
QUIET_TICK_MAX = timedelta(minutes=3)
"""Longest tick while every GPU of the job reads busy (no verdict can fire sooner): bounds how
late an exit or a lost host is noticed, and keeps a busy job near 260 history events an hour."""
PROBE_FAILURES_BEFORE_LOST = 3
TICKS_PER_RUN = 300
"""Monitor ticks after which a run continues as new even if Temporal has not suggested it, so
history stays small (a few thousand events) on any server."""
STOP_GRACE_S = 10.0
START_WAIT_S = 0.25
"""How long a start waits for the script to exit: a command that fails at once, or a job that
is done at once, is seen without a probe."""

CONTROL_TIMEOUT = timedelta(seconds=20)
"""Control steps are short database transactions; one stuck this long is retried."""
CONTROL_RETRY = RetryPolicy(maximum_interval=timedelta(seconds=30))
_R = TypeVar("_R")


class _Ending(Exception):
    """How one attempt ended; caught in `run`, never leaves the workflow."""

    def __init__(self, reason: TerminationReason, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@workflow.defn(name="JobWorkflow")
class JobWorkflow:
    def __init__(self) -> None:
        self._job_id = ""
        self._name = ""
        self._status = JobStatus.PENDING
        self._attempt = 1
        self._placement: Placement | None = None
        self._reason: TerminationReason | None = None
        self._message = ""
        self._waiting_reasons: list[str] = []
        self._stop_requested = False
        self._capacity_changed = False
        self._utilization = utilization.UtilizationState()
        self._search_attributes = True
        self._unrecorded: JobStatusInput | None = None
        """A record the next place step writes in its own transaction."""
        self._start_attempted = False
        """Whether any process may exist: before the run step, compensation has nothing to
        stop (and a host without an agent must not hold up the release of GPUs)."""
        self._gone: set[int] = set()
        """Ranks whose script exited and whose process group the agent saw empty: nothing
        of theirs is left to stop."""

    # ---- handlers ---------------------------------------------------------------------------

    @workflow.signal
    def stop(self) -> None:
        """Stop the job: processes stopped, GPUs released, status `stopped`."""
        self._stop_requested = True

    @workflow.signal
    def capacity_changed(self) -> None:
        """Capacity was freed or added: a job waiting for it tries again now."""
        self._capacity_changed = True

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
        spec = inp.spec
        resume = inp.resume
        exit_codes: dict[int, int | None] = {}
        first_look: list[ProbeResult] | None = None
        if resume is not None:
            self._attempt = resume.attempt
            self._placement = resume.placement
            self._utilization = resume.utilization
            self._status = JobStatus.RUNNING
            self._start_attempted = True
        else:
            if workflow.info().typed_search_attributes.get(SA_STATUS) is None:
                self._upsert(status=JobStatus.PENDING, priority=spec.priority)
            # Written by the first place step, in its transaction.
            self._unrecorded = self._status_input(JobStatus.PENDING, "submitted", spec=spec)
        try:
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
                except _Ending as caught:
                    ending = caught
                await self._finalize(ending)
                if not self._should_retry(inp, ending):
                    return self._result(ending, exit_codes)
                self._attempt += 1
                self._start_attempted = False
                self._gone = set()
                resume = None
                self._placement = None
                self._utilization = utilization.UtilizationState()
                await self._record(
                    JobStatus.PENDING,
                    f"attempt {self._attempt}: retrying after {ending.reason.value}",
                )
        except asyncio.CancelledError:
            # Cancelled from outside (e.g. `temporal workflow cancel`): compensate, then end as
            # cancelled. Activities started here still run: only the awaited one was cancelled.
            await self._finalize(_Ending(TerminationReason.STOPPED_BY_USER, "workflow cancelled"))
            raise

    # ---- steps ------------------------------------------------------------------------------

    async def _place(self, inp: JobInput) -> Placement:
        spec = inp.spec
        retry = spec.retry
        fleet_order: list[list[str] | None] = [[fleet] for fleet in spec.fleets] or [None]
        options = spec.resource_options()
        # Every resource option on every fleet, in that order (see JobSpec.alternatives).
        tries = [
            (option, _option_label(k, option, len(options)), fleets)
            for k, option in enumerate(options)
            for fleets in fleet_order
        ]
        deadline = _submitted(inp) + timedelta(seconds=retry.duration if retry else 0)
        backoff = CAPACITY_BACKOFF_FIRST
        while True:
            reasons: list[str] = []
            for option, label, fleets in tries:
                where = f"fleet {fleets[0]}" if fleets else "any fleet"
                before, self._unrecorded = self._unrecorded, None
                result = await _control(
                    "place_job",
                    PlaceInput(
                        job_id=inp.job_id,
                        attempt=self._attempt,
                        spec=option,
                        fleets=fleets,
                        before=before,
                        placed=JobStatusInput(
                            job_id=self._job_id,
                            name=self._name,
                            status=JobStatus.PROVISIONING,
                            attempt=self._attempt,
                            event_key=self._event_key(JobStatus.PROVISIONING, ""),
                            at=workflow.now(),
                        ),
                    ),
                    PlaceResult,
                    f"place {label + ' ' if label else ''}on {where}",
                )
                if result.placement is not None:
                    self._waiting_reasons = []
                    self._placement = result.placement
                    self._set_status(JobStatus.PROVISIONING, placed_message(result.placement))
                    return result.placement
                reasons.extend(f"{label}: {r}" if label else r for r in result.reasons)
            self._waiting_reasons = reasons
            message = "no capacity: " + "; ".join(reasons) if reasons else "no capacity"
            may_wait = retry is not None and RetryEvent.NO_CAPACITY in retry.on_events
            if not may_wait or workflow.now() + backoff > deadline or self._stop_requested:
                raise _Ending(TerminationReason.NO_CAPACITY, message)
            if not self._message.startswith("waiting for capacity"):
                await self._record(
                    JobStatus.PENDING,
                    f"waiting for capacity: {'; '.join(reasons)}",
                    waiting_for_capacity=True,
                )
            self._capacity_changed = False
            await _wait(
                lambda: self._capacity_changed or self._stop_requested, backoff, "wait for capacity"
            )
            if self._stop_requested:
                raise _Ending(
                    TerminationReason.STOPPED_BY_USER, "stopped while waiting for capacity"
                )
            backoff = min(backoff * 2, CAPACITY_BACKOFF_MAX)

    async def _provision(self, placement: Placement) -> None:
        """Make sure every real host's agent is up (the place step recorded `provisioning`).
        Simulated hosts are served inside control workers, which start their agents
        themselves."""
        real = {n.host_id: n for n in placement.nodes if not n.simulated}
        if not real:
            return
        self._upsert(status=JobStatus.PROVISIONING, placement=placement)
        results = await asyncio.gather(
            *(
                workflow.execute_activity(
                    "provision_host",
                    ProvisionInput(job_id=self._job_id, host_id=node.host_id),
                    result_type=ProvisionResult,
                    summary=f"provision {node.host_name}",
                    start_to_close_timeout=timedelta(minutes=5),
                    retry_policy=RetryPolicy(maximum_attempts=3),
                )
                for node in real.values()
            ),
            return_exceptions=True,
        )
        for result in results:
            if isinstance(result, BaseException):
                raise _Ending(TerminationReason.PROVISIONING_FAILED, _failure_text(result))
            if not result.ready:
                raise _Ending(TerminationReason.PROVISIONING_FAILED, result.message)

    async def _start(self, inp: JobInput, placement: Placement) -> list[ProbeResult] | None:
        """Start the job on every node; the nodes' exits when all of them ended within the
        start's short wait (then the monitor needs no probe to see them)."""
        self._start_attempted = True
        spec = inp.spec
        master = placement.nodes[0].address
        asked = workflow.now()
        handles = await asyncio.gather(
            *(
                workflow.execute_activity(
                    "start_process",
                    StartProcessInput(
                        job_id=inp.job_id,
                        attempt=self._attempt,
                        node=node,
                        nodes=len(placement.nodes),
                        master_address=master,
                        commands=list(spec.commands),
                        env=dict(spec.env),
                        working_dir=spec.working_dir,
                        wait_s=START_WAIT_S,
                    ),
                    result_type=ProcessHandle,
                    task_queue=node.task_queue,
                    summary=f"start on {node.host_name}",
                    schedule_to_start_timeout=timedelta(minutes=1),
                    start_to_close_timeout=timedelta(minutes=1),
                    retry_policy=RetryPolicy(maximum_attempts=3),
                )
                for node in placement.nodes
            ),
            return_exceptions=True,
        )
        for handle in handles:
            if isinstance(handle, BaseException):
                # A refusal by the agent (e.g. a missing secret) is the job's fault; anything
                # else (no agent answering, a broken host) is an interruption.
                reason = (
                    TerminationReason.START_FAILED
                    if _refused(handle)
                    else TerminationReason.HOST_LOST
                )
                raise _Ending(reason, "could not start the job: " + _failure_text(handle))
        # Running since the first process started, by its host's clock (the start waited a
        # moment after it), kept between the ask and the answer against clock skew.
        started = [h.started_at for h in handles if isinstance(h, ProcessHandle) and h.started_at]
        since = min(max(min(started, default=asked), asked), workflow.now())
        await self._record(
            JobStatus.RUNNING,
            f"running on {len(placement.nodes)} node(s)",
            placement=placement,
            at=since,
        )
        exits = [h.exited for h in handles if isinstance(h, ProcessHandle)]
        if not all(exits):
            self._upsert(status=JobStatus.RUNNING, placement=placement)
            return None
        return [e for e in exits if e is not None]  # ended already: the final upsert says so

    async def _monitor(
        self,
        inp: JobInput,
        resume: JobResume,
        exit_codes: dict[int, int | None],
        first_look: list[ProbeResult] | None = None,
    ) -> _Ending:
        spec = inp.spec
        placement = resume.placement
        policy = spec.utilization_policy
        check = timedelta(seconds=utilization.check_interval_s(policy)) if policy else IDLE_TICK_MAX
        failures = dict(resume.probe_failures)
        ticks = resume.ticks
        while True:
            # Short first ticks notice quick jobs quickly; then the policy's check interval.
            tick = min(timedelta(seconds=2 ** min(ticks, 6)), check)
            if policy is not None and tick >= check and not any(failures.values()):
                # While every GPU reads busy, no verdict can fire before the oldest newest
                # sample plus the window: sleep longer (bounded, so exits are still noticed).
                until = utilization.quiet_until(self._utilization, policy)
                if until is not None:
                    quiet = timedelta(seconds=until - workflow.now().timestamp())
                    tick = max(check, min(QUIET_TICK_MAX, quiet))
            if spec.max_duration is not None:
                left = resume.running_since + timedelta(seconds=spec.max_duration) - workflow.now()
                if left <= timedelta(0):
                    return _Ending(
                        TerminationReason.MAX_DURATION_EXCEEDED,
                        f"ran longer than max_duration {format_duration(spec.max_duration)}",
                    )
                tick = min(tick, left)
            probes: list[ProbeResult | BaseException]
            if first_look is not None:  # every node had exited when its start returned
                probes, first_look = list(first_look), None
            else:
                probes = await self._probe(inp, placement, tick, first=ticks == 0)
                ticks += 1
            if self._stop_requested:
                return _Ending(TerminationReason.STOPPED_BY_USER, "stopped by the user")
            exited: dict[int, int | None] = {}
            for node, probe in zip(placement.nodes, probes, strict=True):
                if isinstance(probe, BaseException):
                    failures[node.rank] = failures.get(node.rank, 0) + 1
                    if failures[node.rank] >= PROBE_FAILURES_BEFORE_LOST:
                        return _Ending(
                            TerminationReason.HOST_LOST,
                            f"host {node.host_name} stopped answering: {_failure_text(probe)}",
                        )
                    continue
                failures[node.rank] = 0
                if probe.samples:
                    # Samples a tick apart are continuous coverage; a missed tick is a gap.
                    utilization.update(
                        self._utilization,
                        node.rank,
                        probe.samples,
                        policy=policy,
                        max_gap_s=max(check, tick).total_seconds() * 2.5,
                    )
                if probe.state == "missing":
                    return _Ending(
                        TerminationReason.HOST_LOST,
                        f"the process of node {node.rank} on {node.host_name} is gone "
                        "without an exit code (host restarted?)",
                    )
                if probe.state in ("exited", "stopped"):
                    exited[node.rank] = probe.exit_code
                    if not probe.leftovers:
                        self._gone.add(node.rank)
            if exited:
                exit_codes.update(exited)
                failed = {r: c for r, c in exited.items() if c != 0}
                if failed:
                    rank, code = sorted(failed.items())[0]
                    what = "vanished" if code is None else f"exited with code {code}"
                    return _Ending(TerminationReason.PROCESS_FAILED, f"node {rank} {what}")
                if len(exited) == len(placement.nodes):
                    return _Ending(TerminationReason.DONE, "all processes exited with code 0")
            if policy is not None:
                violation = utilization.verdict(self._utilization, policy)
                if violation is not None:
                    return _Ending(TerminationReason.GPU_UNDERUTILIZED, violation.message)
            if any(not isinstance(p, BaseException) and p.samples for p in probes):
                workflow.set_current_details(self._details())
            if workflow.info().is_continue_as_new_suggested() or (
                ticks - resume.ticks >= TICKS_PER_RUN
            ):
                await workflow.wait_condition(workflow.all_handlers_finished)
                workflow.continue_as_new(
                    JobInput(
                        job_id=inp.job_id,
                        spec=spec,
                        submitted_at=inp.submitted_at,
                        search_attributes=inp.search_attributes,
                        resume=JobResume(
                            attempt=self._attempt,
                            placement=placement,
                            running_since=resume.running_since,
                            utilization=self._utilization,
                            probe_failures=failures,
                            ticks=ticks,
                        ),
                    )
                )

    async def _probe(
        self, inp: JobInput, placement: Placement, tick: timedelta, *, first: bool
    ) -> list[ProbeResult | BaseException]:
        """One look at every node, a tick after the last. The first look needs no timer: the
        probe itself waits up to a tick for an exit."""
        if not first:
            await _wait(lambda: self._stop_requested, tick, "monitor tick")
            if self._stop_requested:
                return []
        probes: list[ProbeResult | BaseException] = await asyncio.gather(
            *(
                workflow.execute_activity(
                    "probe_process",
                    ProbeInput(
                        job_id=inp.job_id,
                        attempt=self._attempt,
                        rank=node.rank,
                        gpu_indices=list(node.gpu_indices),
                        sample=bool(node.gpu_indices),
                        wait_s=tick.total_seconds() if first else 0.0,
                    ),
                    result_type=ProbeResult,
                    task_queue=node.task_queue,
                    summary=f"probe {node.host_name}",
                    schedule_to_close_timeout=timedelta(seconds=20),
                    retry_policy=RetryPolicy(maximum_attempts=2),
                )
                for node in placement.nodes
            ),
            return_exceptions=True,
        )
        return probes

    async def _finalize(self, ending: _Ending) -> None:
        """The one compensation for every ending: stop processes, release GPUs, record status."""
        placement = self._placement
        if placement is not None and self._start_attempted:
            await asyncio.gather(
                *(
                    workflow.execute_activity(
                        "stop_process",
                        StopProcessInput(
                            job_id=self._job_id,
                            attempt=self._attempt,
                            rank=node.rank,
                            grace_s=STOP_GRACE_S,
                        ),
                        result_type=StopProcessResult,
                        task_queue=node.task_queue,
                        summary=f"stop on {node.host_name}",
                        schedule_to_close_timeout=timedelta(minutes=2),
                        heartbeat_timeout=timedelta(seconds=30),
                        retry_policy=RetryPolicy(maximum_attempts=3),
                    )
                    for node in placement.nodes
                    if node.rank not in self._gone
                ),
                return_exceptions=True,  # a lost host must not keep its GPUs allocated
            )
        self._reason = ending.reason
        status = ending.reason.status
        released = await _control(
            "release_job",
            ReleaseInput(
                job_id=self._job_id,
                record=self._status_input(status, ending.message, reason=ending.reason),
            ),
            ReleaseResult,
            f"release GPUs, record {status.value}",
        )
        self._upsert(status=status, placement=self._placement)
        others = [job for job in released.waiting_jobs if job != self._job_id]
        # Wake the jobs that wait for capacity, all at once; one that ended meanwhile is fine.
        await asyncio.gather(
            *(
                workflow.get_external_workflow_handle(other).signal("capacity_changed")
                for other in others
            ),
            return_exceptions=True,
        )

    # ---- helpers ----------------------------------------------------------------------------

    def _should_retry(self, inp: JobInput, ending: _Ending) -> bool:
        retry = inp.spec.retry
        event = ending.reason.retry_event
        if retry is None or event is None or event not in retry.on_events:
            return False
        if event == RetryEvent.NO_CAPACITY:
            return False  # capacity waits already happened inside _place, up to the deadline
        if self._stop_requested:
            return False
        if retry.max_attempts is not None and self._attempt >= retry.max_attempts:
            return False
        return workflow.now() < _submitted(inp) + timedelta(seconds=retry.duration)

    def _result(self, ending: _Ending, exit_codes: dict[int, int | None]) -> JobResult:
        return JobResult(
            job_id=self._job_id,
            status=ending.reason.status,
            reason=ending.reason,
            message=ending.message,
            attempts=self._attempt,
            exit_codes=exit_codes,
        )

    async def _record(
        self,
        status: JobStatus,
        message: str,
        *,
        reason: TerminationReason | None = None,
        placement: Placement | None = None,
        waiting_for_capacity: bool = False,
        at: datetime | None = None,
    ) -> None:
        record = self._status_input(
            status,
            message,
            reason=reason,
            placement=placement,
            waiting_for_capacity=waiting_for_capacity,
            at=at,
        )
        await _control("record_job_status", record, None, f"record {status.value}")

    def _status_input(
        self,
        status: JobStatus,
        message: str,
        *,
        reason: TerminationReason | None = None,
        placement: Placement | None = None,
        spec: JobSpec | None = None,
        waiting_for_capacity: bool = False,
        at: datetime | None = None,
    ) -> JobStatusInput:
        """The job's new status, set here and shown in the UI, as a record for the store."""
        self._set_status(status, message)
        return JobStatusInput(
            job_id=self._job_id,
            name=self._name,
            spec=spec,
            waiting_for_capacity=waiting_for_capacity,
            status=status,
            attempt=self._attempt,
            event_key=self._event_key(status, message),
            message=message,
            reason=reason,
            placement=placement,
            at=at or workflow.now(),
        )

    def _set_status(self, status: JobStatus, message: str) -> None:
        self._status = status
        self._message = message
        workflow.set_current_details(self._details())

    def _event_key(self, status: JobStatus, message: str) -> str:
        return f"{self._attempt}:{status.value}:{workflow.info().run_id}:{message[:80]}"

    def _details(self) -> str:
        lines = [f"**status** {self._status.value} (attempt {self._attempt})"]
        if self._message:
            lines.append(self._message)
        if self._placement is not None:
            for node in self._placement.nodes:
                gpus = ",".join(str(i) for i in node.gpu_indices) or "none"
                sim = " (simulated)" if node.simulated else ""
                lines.append(f"node {node.rank}: {node.host_name} GPUs {gpus}{sim}")
        for gpu in utilization.summarize(self._utilization):
            sim = " simulated" if gpu.simulated else ""
            lines.append(
                f"node {gpu.node} GPU {gpu.gpu}: {gpu.utilization:.0f}%{sim} util, "
                f"{gpu.memory_used_mib}/{gpu.memory_total_mib} MiB"
            )
        return "\n\n".join(lines)

    def _upsert(
        self,
        *,
        status: JobStatus,
        placement: Placement | None = None,
        priority: int | None = None,
    ) -> None:
        if not self._search_attributes:
            return
        updates: list[SearchAttributeUpdate[Any]] = [SA_STATUS.value_set(status.value)]
        if placement is not None:
            updates.append(SA_FLEET.value_set(placement.fleet))
            names = sorted({name for n in placement.nodes for name in n.gpu_names})
            if names:
                updates.append(SA_GPU.value_set(",".join(names)))
        if priority is not None:
            updates.append(SA_PRIORITY.value_set(priority))
        workflow.upsert_search_attributes(updates)


def _option_label(k: int, option: JobSpec, count: int) -> str:
    """How failure reasons name a resource option; empty when the job has only one."""
    if count == 1:
        return ""
    return f"option {k + 1} ({option.resources.gpu_label})"


async def _control(activity: str, arg: Any, result_type: type[_R] | None, summary: str) -> _R:
    """A control step (place, release, record): a short idempotent database transaction, run
    as a local activity by the control worker that runs this workflow. Its result is recorded
    in the history as a marker, with no task queue round trip; a worker that dies in the middle
    is replaced by one that replays the workflow and runs the step again."""
    result: _R = await workflow.execute_local_activity(
        activity,
        arg,
        result_type=result_type,
        summary=summary,
        start_to_close_timeout=CONTROL_TIMEOUT,
        retry_policy=CONTROL_RETRY,
    )
    return result


def _submitted(inp: JobInput) -> datetime:
    assert inp.submitted_at is not None  # filled in at the start of `run`
    return inp.submitted_at


async def _wait(condition: Callable[[], bool], timeout: timedelta, summary: str) -> bool:
    """A durable timer that ends early when `condition` holds; True if it did."""
    try:
        await workflow.wait_condition(condition, timeout=timeout, timeout_summary=summary)
    except TimeoutError:
        return False
    return True


def _root_cause(error: BaseException) -> BaseException:
    """What an activity really failed with, under Temporal's ActivityError wrapper."""
    cause = error
    while isinstance(cause, ActivityError) and cause.cause is not None:
        cause = cause.cause
    return cause


def _refused(error: BaseException) -> bool:
    cause = _root_cause(error)
    return isinstance(cause, ApplicationError) and cause.non_retryable


def _failure_text(error: BaseException) -> str:
    cause = _root_cause(error)
    return str(cause) or type(cause).__name__


__all__ = ["SEARCH_ATTRIBUTES", "JobWorkflow", "initial_search_attributes"]
