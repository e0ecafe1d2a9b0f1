"""What the tests of two control workers on one dev server share: a small sim fleet, and the
second worker's own Temporal connection (as a second process has: one connection serves one
worker per task queue)."""

from __future__ import annotations

import asyncio
import uuid

from temporalio.client import Client as TemporalClient
from temporalio.testing import WorkflowEnvironment

from gpuflow.client import Client
from gpuflow.specs import FleetSpec
from gpuflow.status import JobStatus


def sim_fleet(hosts: int = 2, gpus: int = 2) -> FleetSpec:
    """A sim fleet with a fresh name: `hosts` hosts of 8 CPUs and `gpus` A100s each."""
    models = [{"name": "A100", "memory": "80GB", "count": gpus}]
    return FleetSpec.model_validate(
        {
            "type": "fleet",
            "name": f"f{uuid.uuid4().hex[:6]}",
            "kind": "sim",
            "hosts": [{"name": f"h{i}", "cpus": 8, "gpus": models} for i in range(hosts)],
        }
    )


async def second_connection(env: WorkflowEnvironment) -> TemporalClient:
    """Another connection to the environment's server, namespace and data converter."""
    return await TemporalClient.connect(
        env.client.service_client.config.target_host,
        namespace=env.client.namespace,
        data_converter=env.client.data_converter,
    )


async def running(client: Client, job_id: str) -> None:
    """Wait (up to 30 s) until the job runs."""
    for _ in range(300):
        if (await client.get(job_id)).status == JobStatus.RUNNING:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{job_id} never ran")
