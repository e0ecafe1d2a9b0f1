"""The job workflow's phases before the monitor: place (waiting for capacity), provision,
start. Workflow code; JobWorkflow runs them."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from datetime import timedelta
from types import MappingProxyType

from temporalio import workflow
from temporalio.common import RetryPolicy

from gpuflow.workflows import contract, steps
from gpuflow.workflows.job_state import (
    PATCH_RARE_CHECK,
    PATCH_REQUEUE_WAITS,
    Ending,
    JobState,
    retry_deadline,
)

with workflow.unsafe.imports_passed_through():
    from gpuflow.scheduler.model import Placement
    from gpuflow.specs.job import JobSpec
    from gpuflow.status import (
        NO_CAPACITY_PREFIX,
        WAITING_PREFIX,
        JobStatus,
        RetryEvent,
        TerminationReason,
    )
    from gpuflow.workflows.models import (
        JobInput,
        JobStatusInput,
        PlaceInput,
        ProbeResult,
        ProcessHandle,
        ProvisionInput,
        StartProcessInput,
        placed_message,
    )
    from gpuflow.workflows.queue_models import EnqueueInput, QueueVerdict, WithdrawInput

CAPACITY_BACKOFF_FIRST = timedelta(seconds=5)
CAPACITY_BACKOFF_MAX = timedelta(minutes=5)
START_WAIT_S = 0.25
"""How long a start waits for the script to exit: a command that fails at once, or a job that
is done at once, is seen without a probe."""
START_HEARTBEAT = timedelta(seconds=15)
"""A start heartbeats on arrival and every poll of its short wait; one silent this long died."""
PATCH_STOP_PROVISIONING = "stop-while-provisioning"
"""A stop that arrives while the job's hosts are provisioned ends it `stopped` at once (the
provisioning is cancelled); it waited for the provisioning, and a failed one ended the job
`failed (provisioning_failed)`. Histories from before replay as they ran."""
PATCH_QUEUE = "queue-admission"
"""The job waits in its queue for the admission loop; before it, each job placed itself and
retried on a backoff and on broadcasts (histories from then replay that way)."""
PATCH_QUEUE_GONE = "queue-gone-start-failed"
"""A job whose queue does not exist (deleted since its schedule named it) ends `failed
(start_failed)`, which no retry covers; before, it ended `no_capacity`, as if capacity could
admit it (histories from then replay that way). Asked only when the queue is unknown: other
histories record no marker."""
ADMISSION_CHECK = timedelta(minutes=10)
ADMISSION_CHECK_MAX = timedelta(hours=1)
"""A job waiting in its queue asks again after ADMISSION_CHECK without news, then after twice
as long each time, up to ADMISSION_CHECK_MAX: for a loop that is gone (terminated from outside;
asking starts it again). A lost ask or verdict is the loop's to make good (admission.py
SAFETY_PASS, `pass_id`), so a job asks about once however long it waits in a long queue."""
ADMISSION_CHECK_BEFORE = timedelta(seconds=60)
"""How often a waiting job asked again before job_state.PATCH_RARE_CHECK."""


class JobPhases(JobState):
    async def _place(self, inp: JobInput) -> Placement:
        if self._patched(PATCH_QUEUE):
            return await self._queued(inp)
        return await self._place_alone(inp)

    async def _queued(self, inp: JobInput) -> Placement:
        """Enter the job's queue and wait, costing nothing, until an admission pass admits it
        (the pass took its allocation), refuses it (a job that may not wait, when nothing
        fits now), or the wait is over (stopped, or its retry deadline passed)."""
        spec = self._spec(inp)
        may_wait = spec.may_wait or (self._requeued and workflow.patched(PATCH_REQUEUE_WAITS))
        deadline = retry_deadline(inp)
        self._admission, self._refusal = None, None
        ask = EnqueueInput(
            job_id=inp.job_id,
            attempt=self._attempt,
            spec=spec,
            submitted_at=inp.submitted_at or workflow.info().start_time,
            may_wait=may_wait,
        )
        before, self._unrecorded = self._unrecorded, None
        verdict = await steps.control(
            contract.enqueue_job,
            ask.model_copy(update={"before": before}),
            f"enter queue {spec.queue}",
        )
        self._set_status(JobStatus.PENDING, f"waiting in queue {spec.queue}")
        rare = self._patched(PATCH_RARE_CHECK)
        check = ADMISSION_CHECK if rare else ADMISSION_CHECK_BEFORE
        while True:
            if self._admission is not None:
                verdict = QueueVerdict(placement=self._admission.placement)
            elif self._refusal is not None:
                verdict = QueueVerdict(refused=self._refusal.reasons)
            if verdict.placement is not None:
                return self._placed(verdict.placement)
            if verdict.refused is not None:
                if verdict.unknown_queue and workflow.patched(PATCH_QUEUE_GONE):
                    raise Ending(TerminationReason.START_FAILED, "; ".join(verdict.refused))
                raise Ending(TerminationReason.NO_CAPACITY, _no_capacity(verdict.refused))
            self._waiting_reasons = verdict.detail
            left = deadline - workflow.now()
            if self._stop_requested or (may_wait and left <= timedelta(0)):
                return await self._leave_queue(inp, verdict)
            await steps.wait_until(
                lambda: (
                    self._admission is not None or self._refusal is not None or self._stop_requested
                ),
                min(check, left) if may_wait else check,
                "wait for admission",
            )
            if rare:
                check = min(ADMISSION_CHECK_MAX, check * 2)
            if self._admission is None and self._refusal is None and not self._stop_requested:
                verdict = await steps.control(
                    contract.enqueue_job, ask, f"ask queue {spec.queue} again"
                )

    async def _leave_queue(self, inp: JobInput, verdict: QueueVerdict) -> Placement:
        """Stopped, or out of time: leave the queue. An attempt admitted meanwhile is taken
        (out of time) or released by the compensation (stopped)."""
        left = await steps.control(
            contract.withdraw_job,
            WithdrawInput(job_id=inp.job_id, attempt=self._attempt),
            f"leave queue {inp.spec.queue}",
        )
        if left.placement is not None:
            if not self._stop_requested:
                return self._placed(left.placement)
            self._placement = left.placement
        if self._stop_requested:
            raise Ending(TerminationReason.STOPPED_BY_USER, "stopped while waiting in its queue")
        reasons = left.detail or verdict.detail or [_QUEUE_REASONS.get(left.reason or "", "")]
        raise Ending(TerminationReason.NO_CAPACITY, _no_capacity([r for r in reasons if r]))

    def _placed(self, placement: Placement) -> Placement:
        self._waiting_reasons = []
        self._placement = placement
        self._set_status(JobStatus.PROVISIONING, placed_message(placement))
        return placement

    async def _place_alone(self, inp: JobInput) -> Placement:
        """Before queues: place, and on no capacity wait on a backoff or a broadcast."""
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
        deadline = retry_deadline(inp)
        backoff = CAPACITY_BACKOFF_FIRST
        while True:
            reasons: list[str] = []
            for option, label, fleets in tries:
                where = f"fleet {fleets[0]}" if fleets else "any fleet"
                before, self._unrecorded = self._unrecorded, None
                result = await steps.control(
                    contract.place_job,
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
                    f"place {label + ' ' if label else ''}on {where}",
                )
                if result.placement is not None:
                    self._waiting_reasons = []
                    self._placement = result.placement
                    self._set_status(JobStatus.PROVISIONING, placed_message(result.placement))
                    return result.placement
                reasons.extend(f"{label}: {r}" if label else r for r in result.reasons)
            self._waiting_reasons = reasons
            message = NO_CAPACITY_PREFIX + "; ".join(reasons) if reasons else "no capacity"
            may_wait = retry is not None and RetryEvent.NO_CAPACITY in retry.on_events
            if not may_wait or workflow.now() + backoff > deadline or self._stop_requested:
                raise Ending(TerminationReason.NO_CAPACITY, message)
            if not self._message.startswith(WAITING_PREFIX):
                await self._record(
                    JobStatus.PENDING,
                    WAITING_PREFIX + "; ".join(reasons),
                    waiting_for_capacity=True,
                )
            self._capacity_changed = False
            await steps.wait_until(
                lambda: self._capacity_changed or self._stop_requested, backoff, "wait for capacity"
            )
            if self._stop_requested:
                raise Ending(
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
        provisioning = asyncio.ensure_future(
            steps.on_nodes(
                contract.provision_host,
                (
                    (
                        ProvisionInput(job_id=self._job_id, host_id=node.host_id),
                        f"provision {node.host_name}",
                        None,  # the control queue: provisioning runs on a control worker
                    )
                    for node in real.values()
                ),
                start_to_close_timeout=timedelta(minutes=5),
                retry_policy=RetryPolicy(maximum_attempts=3),
            )
        )
        if workflow.patched(PATCH_STOP_PROVISIONING):
            await workflow.wait_condition(lambda: provisioning.done() or self._stop_requested)
            if self._stop_requested:
                provisioning.cancel()
                raise Ending(
                    TerminationReason.STOPPED_BY_USER, "stopped while its hosts were provisioned"
                )
        results = await provisioning
        for result in results:
            if isinstance(result, BaseException):
                raise Ending(TerminationReason.PROVISIONING_FAILED, steps.failure_text(result))
            if not result.ready:
                raise Ending(TerminationReason.PROVISIONING_FAILED, result.message)

    async def _start(self, inp: JobInput, placement: Placement) -> list[ProbeResult] | None:
        """Start the job on every node; the nodes' exits when all of them ended within the
        start's short wait (then the monitor needs no probe to see them)."""
        self._start_attempted = True
        spec = inp.spec
        master = placement.nodes[0].address
        asked = workflow.now()
        handles = await steps.on_nodes(
            contract.start_process,
            (
                (
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
                    f"start on {node.host_name}",
                    node.task_queue,
                )
                for node in placement.nodes
            ),
            schedule_to_start_timeout=timedelta(minutes=1),
            start_to_close_timeout=timedelta(minutes=1),
            # An agent that dies during a start (its host or process killed) is retried after
            # this, not after the whole minute; a start is idempotent and adopts what it ran.
            heartbeat_timeout=START_HEARTBEAT,
            retry_policy=RetryPolicy(maximum_attempts=3),
        )
        for handle in handles:
            if isinstance(handle, BaseException):
                # A refusal by the agent (e.g. a missing secret) is the job's fault; anything
                # else (no agent answering, a broken host) is an interruption.
                reason = (
                    TerminationReason.START_FAILED
                    if steps.refused(handle)
                    else TerminationReason.HOST_LOST
                )
                raise Ending(reason, "could not start the job: " + steps.failure_text(handle))
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


_QUEUE_REASONS: Mapping[str, str] = MappingProxyType(
    {
        "no_capacity": "nothing fits now",
        "quota": "its queue has no quota left for it",
    }
)


def _no_capacity(reasons: list[str]) -> str:
    return NO_CAPACITY_PREFIX + "; ".join(reasons) if reasons else "no capacity"


def _option_label(k: int, option: JobSpec, count: int) -> str:
    """How failure reasons name a resource option; empty when the job has only one."""
    if count == 1:
        return ""
    return f"option {k + 1} ({option.resources.gpu_label})"
