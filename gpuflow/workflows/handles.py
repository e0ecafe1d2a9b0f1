"""How a process outside the workflows (the client, the embedded stack) starts and signals
them: by reference to the workflow class and its handlers, so strict mypy sees a rename."""

from __future__ import annotations

from temporalio.client import Client, WorkflowQueryFailedError
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.service import RPCError, RPCStatusCode

from gpuflow.naming import CONTROL_TASK_QUEUE, fleet_workflow_id
from gpuflow.workflows.admission import HOLD_SIGNAL, AdmissionWorkflow
from gpuflow.workflows.fleet import FleetWorkflow
from gpuflow.workflows.models import FleetInput
from gpuflow.workflows.queue_models import AdmissionState, admission_workflow_id


async def watch_fleet(temporal: Client, fleet: str) -> None:
    """Start the fleet's health checks (FleetWorkflow), or make a running one check now."""
    await temporal.start_workflow(
        FleetWorkflow.run,
        FleetInput(fleet=fleet),
        id=fleet_workflow_id(fleet),
        task_queue=CONTROL_TASK_QUEUE,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        static_summary=f"health checks of fleet {fleet}",
    )
    # By id, not by the started run: the run may have continued as new since.
    handle = temporal.get_workflow_handle_for(FleetWorkflow.run, fleet_workflow_id(fleet))
    await handle.signal(FleetWorkflow.refresh)


async def hold_admission(
    temporal: Client, held: bool, task_queue: str = CONTROL_TASK_QUEUE
) -> None:
    """Hold the admission loop of the control plane on `task_queue` (no pass runs until it is
    let go) or let it go. Holding starts a loop that is not running (signal-with-start);
    letting go of one that is not running does nothing. Any other failure: RPCError."""
    workflow_id = admission_workflow_id(task_queue)
    if held:
        await temporal.start_workflow(
            AdmissionWorkflow.run,
            AdmissionState(),
            id=workflow_id,
            task_queue=task_queue,
            start_signal=HOLD_SIGNAL,
            start_signal_args=[True],
        )
        return
    try:
        await temporal.get_workflow_handle(workflow_id).signal(HOLD_SIGNAL, False)
    except RPCError as exc:
        if exc.status != RPCStatusCode.NOT_FOUND:
            raise


async def admission_held(temporal: Client, task_queue: str = CONTROL_TASK_QUEUE) -> bool:
    """Whether the admission loop on `task_queue` is held; False when there is no loop, or
    its worker predates the question (RPCError for anything else)."""
    handle = temporal.get_workflow_handle_for(
        AdmissionWorkflow.run, admission_workflow_id(task_queue)
    )
    try:
        return await handle.query(AdmissionWorkflow.held)
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            return False
        raise
    except WorkflowQueryFailedError:
        return False
