"""How a process outside the workflows (the client, the embedded stack) starts and signals
them: by reference to the workflow class and its handlers, so strict mypy sees a rename."""

from __future__ import annotations

from temporalio.client import Client
from temporalio.common import WorkflowIDConflictPolicy

from gpuflow.naming import CONTROL_TASK_QUEUE, fleet_workflow_id
from gpuflow.workflows.fleet import FleetWorkflow
from gpuflow.workflows.models import FleetInput


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
