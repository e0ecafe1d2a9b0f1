"""An ssh fleet end to end: facts read over SSH, the real agent started over SSH against a real
dev server, a job run there, secrets copied over SFTP (never through Temporal)."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest
from temporalio.testing import WorkflowEnvironment

from gpuflow import secrets
from gpuflow.client import Client
from gpuflow.control.worker import ControlWorker
from gpuflow.specs import FleetSpec, JobSpec
from gpuflow.status import JobStatus
from gpuflow.store.db import Store
from tests.sshd.fixture import SshServer, stop_agent

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]


async def test_ssh_fleet_runs_a_job_through_an_agent_started_over_ssh(
    dev_env: WorkflowEnvironment,
    sshd: SshServer,
    sqlite_store: Store,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    address = dev_env.client.service_client.config.target_host
    fleet = f"ssh{uuid.uuid4().hex[:6]}"
    spec = FleetSpec.model_validate(sshd.fleet(fleet, tmp_path, address, monkeypatch))
    agent_dir = tmp_path / "remote-agent"
    value = f"s-{uuid.uuid4().hex}"
    secrets.set_secret("token", value)
    client = Client(temporal=dev_env.client)
    try:
        async with ControlWorker(dev_env.client, sqlite_store, home=tmp_path / "home"):
            info = await client.apply_fleet(spec)
            host = info.hosts[0]
            assert host["state"] == "ready" and host["cpus"] == os.cpu_count()
            assert host["simulated"] is False
            job = await client.submit(
                JobSpec.model_validate(
                    {
                        "name": "over-ssh",
                        "commands": ['echo "on $(hostname) with $TOKEN"'],
                        "env": {"TOKEN": "${{ secrets.token }}"},
                        "fleets": [fleet],
                        "resources": {"cpu": 1},
                    }
                )
            )
            result = await client.wait(job.id, timeout_s=90)
            output = "".join([chunk async for chunk in client.logs(job.id)])
            history = await dev_env.client.get_workflow_handle(job.id).fetch_history()
    finally:
        stop_agent(agent_dir)
    assert result.status == JobStatus.DONE, result.message
    assert "with ***" in output and value not in output  # the agent masks what it injected
    assert value not in history.to_json()
    pushed = next(agent_dir.glob("*/secrets.json"))
    assert pushed.stat().st_mode & 0o777 == 0o600
