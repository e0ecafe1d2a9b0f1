"""Asking the admission loop for a pass: a signal-with-start of its one workflow, so whoever
asks first starts it, and a loop that was terminated from outside comes back on the next ask."""

from __future__ import annotations

import logging

from temporalio import activity
from temporalio.client import Client
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError

from gpuflow.naming import CONTROL_TASK_QUEUE
from gpuflow.workflows.queue_models import AdmissionState, admission_workflow_id

log = logging.getLogger(__name__)


async def wake_admission(temporal: Client | None, task_queue: str | None = None) -> bool:
    """Ask for a pass (the loop coalesces asks that arrive during one). Whether the ask was
    delivered: a failure is logged, not raised, because the loop also passes on its own
    schedule and every waiting job asks again while it waits."""
    if temporal is None:
        return False
    if task_queue is None:
        task_queue = activity.info().task_queue if activity.in_activity() else CONTROL_TASK_QUEUE
    try:
        await temporal.start_workflow(
            "AdmissionWorkflow",
            AdmissionState(),
            id=admission_workflow_id(task_queue),
            task_queue=task_queue,
            start_signal="wake",
        )
    except RPCError as error:
        log.warning("could not ask the admission loop for a pass: %s", error)
        return False
    return True


async def ask_for_pass(temporal: Client | None, task_queue: str | None = None) -> None:
    """`wake_admission` for a job that has just entered its queue to wait: raises when the ask
    was not delivered, so the step that entered the job runs again (entering again changes
    nothing) and asks again. The loop passes on its own only while it knows of waiting jobs,
    and the job itself asks again only after minutes (workflows/phases.py ADMISSION_CHECK), so
    this ask must not be lost. Without a Temporal client (tests of the store) nothing is asked."""
    if temporal is not None and not await wake_admission(temporal, task_queue):
        raise ApplicationError(
            "could not ask the admission loop for a pass (the job waits in its queue): asks again",
            type="AdmissionAskLost",
        )
