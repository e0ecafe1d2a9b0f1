"""An ssh host whose agent died comes back by itself, against a real sshd on 127.0.0.1 and a
real dev server: the fleet's health round starts its agent again over SSH, the host is ready
again and runs the next job, with no new `fleet apply`.

Found in QA: the agent of an ssh host was started only by provisioning, after placement, and
placement takes only hosts whose agent answers; once the agent died the host stayed not ready
for good while sshd answered."""

from __future__ import annotations

import asyncio
import os
import signal
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.testing import WorkflowEnvironment

from gpuflow.client import Client
from gpuflow.control.worker import ControlWorker
from gpuflow.naming import CONTROL_TASK_QUEUE, fleet_workflow_id, host_id
from gpuflow.services.fleets import get_host
from gpuflow.specs import FleetSpec, JobSpec
from gpuflow.status import HostState, JobStatus
from gpuflow.store.db import Store
from gpuflow.workflows.fleet import FleetWorkflow
from gpuflow.workflows.models import FleetInput
from tests.sshd.fixture import SshServer, agent_pid, stop_agent

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

REPO = Path(__file__).resolve().parents[2]
HEALTH_INTERVAL_S = 3.0
COMEBACK_S = 60.0
"""The interval, a ping that times out (10 s), the restart over SSH and the agent's first
answer, on a loaded machine."""


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


async def test_an_ssh_host_whose_agent_was_killed_comes_back_and_runs_a_job(
    dev_env: WorkflowEnvironment,
    sshd: SshServer,
    sqlite_store: Store,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    address = dev_env.client.service_client.config.target_host
    fleet = f"rev{uuid.uuid4().hex[:6]}"
    box = host_id(fleet, "box")
    spec = FleetSpec.model_validate(sshd.fleet(fleet, tmp_path, address, monkeypatch))
    agent_dir = tmp_path / "remote-agent"

    def job(name: str) -> JobSpec:
        return JobSpec.model_validate(
            {"name": name, "commands": ["echo ran"], "fleets": [fleet], "resources": {"cpu": 1}}
        )

    async def comes_back(killed_at: datetime, old_pid: int) -> None:
        deadline = asyncio.get_running_loop().time() + COMEBACK_S
        while True:
            host = await asyncio.to_thread(get_host, sqlite_store, box)
            assert host is not None
            pid = agent_pid(agent_dir)
            heard = host.last_heartbeat and host.last_heartbeat.replace(tzinfo=UTC) > killed_at
            if host.state == HostState.READY and heard and pid not in (None, old_pid):
                assert pid is not None and _alive(pid)
                return
            assert asyncio.get_running_loop().time() < deadline, (
                f"{host.state} ({host.state_detail}), agent pid {pid}"
            )
            await asyncio.sleep(0.5)

    client = Client(temporal=dev_env.client)
    try:
        async with ControlWorker(dev_env.client, sqlite_store, home=tmp_path / "home"):
            await client.apply_fleet(spec)
            # the fleet's health checks again, with a short interval
            await dev_env.client.start_workflow(
                FleetWorkflow.run,
                FleetInput(fleet=fleet, health_interval_s=HEALTH_INTERVAL_S),
                id=fleet_workflow_id(fleet),
                task_queue=CONTROL_TASK_QUEUE,
                id_conflict_policy=WorkflowIDConflictPolicy.TERMINATE_EXISTING,
            )
            submitted = await client.submit(job("before-crash"))
            before = await client.wait(submitted.id, timeout_s=90)
            assert before.status == JobStatus.DONE, before.message
            first = agent_pid(agent_dir)
            assert first is not None and _alive(first)
            killed_at = datetime.now(UTC)
            os.killpg(first, signal.SIGKILL)  # a crash: no goodbye
            await comes_back(killed_at, first)
            submitted = await client.submit(job("after-crash"))
            result = await client.wait(submitted.id, timeout_s=90)
    finally:
        stop_agent(agent_dir)
    assert result.status == JobStatus.DONE, result.message
