"""Names that several layers must agree on: host ids, task queues, workflow ids."""

from __future__ import annotations

CONTROL_TASK_QUEUE = "gpuflow"


def host_id(fleet: str, host: str) -> str:
    return f"{fleet}/{host}"


def host_task_queue(host_id: str) -> str:
    return f"gpuflow-host-{host_id}"


def job_workflow_id(name: str, suffix: str) -> str:
    return f"job-{name}-{suffix}"


def fleet_workflow_id(fleet: str) -> str:
    """The fleet's health checks (FleetWorkflow): one per fleet."""
    return f"fleet-{fleet}"
