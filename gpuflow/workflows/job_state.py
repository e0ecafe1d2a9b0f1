"""The job workflow's state and how it records it: the store (through a control step), the
UI details and the search attributes. Workflow code; JobWorkflow is built on it."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from temporalio import workflow

from gpuflow.workflows import contract, steps

with workflow.unsafe.imports_passed_through():
    from gpuflow import utilization
    from gpuflow.scheduler.model import Placement
    from gpuflow.specs.job import JobSpec, UtilizationPolicy
    from gpuflow.status import JobStatus, RetryEvent, TerminationReason
    from gpuflow.workflows import monitor, ui
    from gpuflow.workflows.models import JobInput, JobResume, JobStatusInput, ProbeResult
    from gpuflow.workflows.queue_models import Admission, Refusal


PATCHES_2026_11 = "job-patches-2026-11"
"""Stands for every patch of the job workflow before it (queue-admission, probe-long-poll,
fail-unless-done, queue-search-attribute): a job started since records this one marker, and the
SDK's one upsert of `TemporalChangeVersion` with it, instead of one of each per patch in every
run. Histories recorded before have the single patches' markers, which `_patched` still reads."""
PATCHES_2026_12 = "job-patches-2026-12"
"""Stands for PATCHES_2026_11's patches and those after it (SINCE_2026_11): a job started since
records this one marker. A run that recorded PATCHES_2026_11 takes none of the later ones."""
PATCH_RARE_CHECK = "queue-rare-check"
"""A waiting job asks again after phases.ADMISSION_CHECK, doubling; before, every
ADMISSION_CHECK_BEFORE (histories from then replay that way)."""
SINCE_2026_11 = frozenset({PATCH_RARE_CHECK})


class Ending(Exception):
    """How one attempt ended; caught in `run`, never leaves the workflow."""

    def __init__(self, reason: TerminationReason, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message

    @classmethod
    def of(cls, verdict: monitor.Verdict) -> Ending:
        return cls(verdict.reason, verdict.message)


class JobState:
    """What a job's workflow knows, and its writes of it (no step of its own)."""

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
        self._admission: Admission | None = None
        """What the admission loop said of the attempt waiting in its queue."""
        self._refusal: Refusal | None = None
        self._preempted_for: str | None = None
        """The job the running attempt is preempted for (it stops as when stopped)."""
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
        self._priority: int | None = None
        """The priority set since the job was submitted (`set_priority`), if any."""
        self._requeued = False
        """The attempt follows a preemption (PATCH_REQUEUE_WAITS)."""
        self._quick_failures = 0
        """Attempts in a row that ended (not preempted) within RETRY_BACKOFF_RESET of their
        start: how long the next waits (`retry_backoff`)."""

    def _patched(self, patch: str) -> bool:
        """Whether this run takes the path `patch` introduced (one of those PATCHES_2026_12
        stands for). Each answer is decided at its first use in a run and kept, as patches
        are: a run replaying a history from before PATCHES_2026_12 finds its marker absent and
        reads PATCHES_2026_11's (for the patches it stands for), then `patch`'s own."""
        if workflow.patched(PATCHES_2026_12):
            return True
        if patch not in SINCE_2026_11 and workflow.patched(PATCHES_2026_11):
            return True
        return workflow.patched(patch)

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
        """Set the job's status and write it to the store."""
        self._set_status(status, message)
        record = self._status_record(
            status,
            message,
            reason=reason,
            placement=placement,
            waiting_for_capacity=waiting_for_capacity,
            at=at,
        )
        await steps.control(contract.record_job_status, record, f"record {status.value}")

    def _status_record(
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
        """A status of this job as a record for the store (it changes nothing here)."""
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
        return ui.details(
            status=self._status,
            attempt=self._attempt,
            message=self._message,
            placement=self._placement,
            state=self._utilization,
        )

    def _spec(self, inp: JobInput) -> JobSpec:
        """The job's spec as it stands: its priority as last set."""
        if self._priority is None or self._priority == inp.spec.priority:
            return inp.spec
        return inp.spec.model_copy(update={"priority": self._priority})

    def _upsert(
        self,
        *,
        status: JobStatus,
        placement: Placement | None = None,
        priority: int | None = None,
    ) -> None:
        if self._search_attributes:
            workflow.upsert_search_attributes(
                ui.search_attribute_updates(status, placement, priority)
            )

    def _should_retry(self, inp: JobInput, ending: Ending) -> bool:
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
        return workflow.now() < retry_deadline(inp)

    def _retry_delay(self, ending: Ending, ran: JobResume | None) -> timedelta:
        """How long to wait before the next attempt (`retry_backoff`); none for a preempted job
        (it goes back to its queue's order at once) or a run of an older history."""
        started = ran.running_since if ran is not None else None
        quick = started is None or workflow.now() - started < RETRY_BACKOFF_RESET
        self._quick_failures = self._quick_failures + 1 if quick else 1
        if ending.reason == TerminationReason.PREEMPTED:
            return timedelta(0)
        if not workflow.patched(PATCH_RETRY_BACKOFF):
            return timedelta(0)
        return retry_backoff(self._quick_failures)


def idle_rule(policy: UtilizationPolicy | None) -> float | None:
    """`utilization.update`'s `unseen_busy_s` for this run: an idle reading a tick after a busy
    one is idle since one reading before it, not since the busy one (PATCH_UNSEEN_BUSY, asked
    only of a job with a policy; histories from before replay as they ran)."""
    if policy is None or not workflow.patched(monitor.PATCH_UNSEEN_BUSY):
        return None
    return utilization.READING_INTERVAL_S


def probe_again_now(probes: Sequence[ProbeResult | BaseException | None]) -> bool:
    """Whether the next look goes at once, not at the next tick: a probe failed
    (PATCH_QUICK_LOSS, asked only then, so a job whose probes answer records no marker)."""
    failed = any(isinstance(probe, BaseException) for probe in probes)
    return failed and workflow.patched(monitor.PATCH_QUICK_LOSS)


def retry_deadline(inp: JobInput) -> datetime:
    """Until when a job may wait for capacity or start another attempt: its retry duration
    from its submission (the one place this deadline is decided)."""
    assert inp.submitted_at is not None  # filled in at the start of `run`
    retry = inp.spec.retry
    return inp.submitted_at + monitor.span(retry.duration if retry else 0)


PATCH_REQUEUE_WAITS = "requeue-waits"
"""The attempt after a preemption waits in its queue (until the retry's deadline) whether or
not its retry covers no-capacity: the preemptor holds the GPUs it freed, so a requeued attempt
that may not wait was refused at once. Its own marker, read only by such an attempt; histories
from before replay without it (refused)."""


PATCH_RETRY_BACKOFF = "retry-backoff"
"""Another attempt after a failure waits `retry_backoff` first; before, it started at once
(histories from then replay that way). Its own marker: runs that recorded PATCHES_2026_12 did
not wait."""
RETRY_BACKOFF_FIRST = timedelta(seconds=10)
RETRY_BACKOFF_MAX = timedelta(minutes=5)
RETRY_BACKOFF_RESET = timedelta(minutes=10)
"""An attempt that ran this long before it ended starts the count of quick failures anew."""


def retry_backoff(quick_failures: int) -> timedelta:
    """The wait before the next attempt after `quick_failures` attempts in a row ended soon
    after they started: 10 s, doubling, at most 5 minutes (Kubernetes' CrashLoopBackOff), so a
    command that fails at once is not restarted in a hot loop."""
    if quick_failures < 1:
        return timedelta(0)
    doubled = RETRY_BACKOFF_FIRST * (1 << min(quick_failures - 1, 16))
    return min(doubled, RETRY_BACKOFF_MAX)
