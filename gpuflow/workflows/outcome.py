"""How a job's ending reads in Temporal, and how a client reads it back.

A job that ended `done` completes its workflow with its JobResult. Any other ending fails the
workflow (so the UI's list does not show it as completed) with an ApplicationError whose type is
the termination reason, whose message is the job's, and whose details carry the JobResult: the
client and CLI still read gpuflow's own status from either shape. Such a failure is sent without
a stack trace (gpuflow/payloads.py `EndingFailureConverter`): it is how the job ended.
"""

from __future__ import annotations

from typing import Any

from temporalio.client import WorkflowFailureError, WorkflowHandle
from temporalio.exceptions import ApplicationError

from gpuflow.payloads import is_job_ending
from gpuflow.status import TerminationReason
from gpuflow.workflows.models import JobResult


def failure_of(result: JobResult) -> ApplicationError | None:
    """What the workflow raises to end as failed; None when the job is done (it completes)."""
    if result.reason == TerminationReason.DONE:
        return None
    return ApplicationError(
        f"{result.status.value}: {result.message}",
        result,
        type=result.reason.value,
        non_retryable=True,
    )


def result_of_failure(error: WorkflowFailureError) -> JobResult | None:
    """The JobResult a failed job's workflow carries; None for any other failure (the
    workflow itself broke, or it was cancelled or terminated from outside)."""
    cause = error.cause
    if not isinstance(cause, ApplicationError) or not is_job_ending(cause):
        return None
    try:
        return JobResult.model_validate(cause.details[0])
    except ValueError:
        return None


async def job_result(handle: WorkflowHandle[Any, Any], *, follow_runs: bool = True) -> JobResult:
    """A job's JobResult once it ends, whichever shape its workflow ended in. Raises
    WorkflowFailureError when the workflow ended without one (cancelled, terminated)."""
    try:
        raw = await handle.result(follow_runs=follow_runs)
    except WorkflowFailureError as exc:
        result = result_of_failure(exc)
        if result is None:
            raise
        return result
    return raw if isinstance(raw, JobResult) else JobResult.model_validate(raw)


__all__ = ["failure_of", "job_result", "result_of_failure"]
