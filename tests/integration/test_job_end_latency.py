"""How soon a job's end is seen, on a real Temporal dev server with a real host agent: the
monitor's probes are long polls, so the exit of the last process ends the job within about two
seconds whatever its tick (a job without a utilization policy ticks every 2 minutes)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from temporalio.testing import WorkflowEnvironment

from gpuflow.client import Client
from gpuflow.control.worker import ControlWorker
from gpuflow.specs import FleetSpec, JobSpec
from gpuflow.status import JobStatus
from gpuflow.store.db import Store

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

END_SEEN_WITHIN_S = 2.0


async def test_a_job_ends_within_seconds_of_its_last_exit(
    dev_env: WorkflowEnvironment, sqlite_store: Store, tmp_path: Path
) -> None:
    fleet = f"f{uuid.uuid4().hex[:6]}"
    ended = tmp_path / "ended"
    client = Client(temporal=dev_env.client)
    async with ControlWorker(dev_env.client, sqlite_store, home=tmp_path):
        await client.apply_fleet(
            FleetSpec.model_validate(
                {
                    "type": "fleet",
                    "name": fleet,
                    "kind": "sim",
                    "hosts": [{"name": "h1", "gpus": [{"name": "A100", "memory": "80GB"}]}],
                }
            )
        )
        # Past the start's short wait and the 5 s an agent's first look once waited.
        job = await client.submit(
            JobSpec.model_validate(
                {
                    "name": "sleeper",
                    "commands": ["sleep 7", f"date +%s.%N > {ended}"],
                    "resources": {"gpu": "A100:1"},
                    "fleets": [fleet],
                }
            )
        )
        result = await client.wait(job.id, timeout_s=90)
        described = await dev_env.client.get_workflow_handle(job.id).describe()
    assert result.status == JobStatus.DONE
    assert described.close_time is not None
    latency = described.close_time.timestamp() - float(ended.read_text())
    print(f"exit -> workflow closed: {latency:.2f} s")
    assert 0 < latency < END_SEEN_WITHIN_S
