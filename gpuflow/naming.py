"""Names that several layers must agree on: host ids, task queues, workflow ids, the secret
reference of a job file."""

from __future__ import annotations

import re

CONTROL_TASK_QUEUE = "gpuflow"

SECRET_REF = re.compile(r"^\$\{\{\s*secrets\.([A-Za-z_][A-Za-z0-9_-]*)\s*\}\}$")
"""A job's env value that refers to a stored secret: `${{ secrets.NAME }}`, the whole value
(a job file's syntax, resolved by the host agent: gpuflow/secrets.py)."""


def host_id(fleet: str, host: str) -> str:
    return f"{fleet}/{host}"


def host_task_queue(host_id: str) -> str:
    return f"gpuflow-host-{host_id}"


def job_workflow_id(name: str, suffix: str) -> str:
    return f"job-{name}-{suffix}"


def fleet_workflow_id(fleet: str) -> str:
    """The fleet's health checks (FleetWorkflow): one per fleet."""
    return f"fleet-{fleet}"


RECORDED_KEY = "recorded"
RECORDED = {RECORDED_KEY: True}
"""The validation context of a value read back from where gpuflow recorded it (a workflow's
history, the store), not taken from a user: a check added to a spec since it was written does
not refuse it there, so running workflows replay and waiting jobs stay readable
(gpuflow/payloads.py; `specs.recorded`)."""
