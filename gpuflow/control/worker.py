"""The control worker (task queue "gpuflow"): JobWorkflow and the control activities.

It also serves the agents of simulated hosts: they run job processes on this machine, and their
GPU samples come from the fleet's declared source.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import AsyncExitStack, ExitStack
from pathlib import Path

from temporalio.client import Client
from temporalio.worker import Worker

from gpuflow.agent.activities import HostAgent
from gpuflow.agent.main import SIMULATED_AGENT_POLLS, agent_state_dir, make_agent_worker
from gpuflow.agent.samplers import sampler_for_host
from gpuflow.control.activities import ControlActivities
from gpuflow.control.api import ApiActivities
from gpuflow.metrics.store import watch_store
from gpuflow.naming import CONTROL_TASK_QUEUE
from gpuflow.services.fleets import list_hosts
from gpuflow.store.db import Store
from gpuflow.store.tables import HostRow
from gpuflow.workflows import workflow_runner
from gpuflow.workflows.admission import AdmissionWorkflow
from gpuflow.workflows.api import ControlApiWorkflow
from gpuflow.workflows.fleet import FleetWorkflow
from gpuflow.workflows.job import JobWorkflow
from gpuflow.workflows.logs import LogReaderWorkflow

log = logging.getLogger("gpuflow.control")


class SimulatedAgents:
    """Agents of simulated hosts, started on demand inside this process."""

    def __init__(self, client: Client, home: Path) -> None:
        self.client = client
        self.home = home
        self._stack = AsyncExitStack()
        self._running: dict[str, Worker] = {}
        self._lock = asyncio.Lock()

    async def ensure(self, host: HostRow) -> str | None:
        if not host.simulated:
            return None
        async with self._lock:
            if host.id not in self._running:
                agent = HostAgent(
                    host_id=host.id,
                    state_dir=agent_state_dir(self.home, host.id),
                    sampler=sampler_for_host(host.sim_utilization),
                )
                worker = make_agent_worker(
                    self.client, agent, host.task_queue, polls=SIMULATED_AGENT_POLLS
                )
                await self._stack.enter_async_context(worker)
                self._running[host.id] = worker
                log.info("serving simulated host %s on %s", host.id, host.task_queue)
        return None

    async def close(self) -> None:
        await self._stack.aclose()


class ControlWorker:
    """Everything the control plane runs, as one async context."""

    def __init__(
        self, client: Client, store: Store, *, home: Path, eager_start: bool = False
    ) -> None:
        self.client = client
        self.store = store
        self.home = home
        self.sim_agents = SimulatedAgents(client, home)
        self._metrics = ExitStack()
        self.activities = ControlActivities(store, ensure_agent=self._ensure_agent, temporal=client)
        # The client's API (gpuflow/workflows/api.py) is served here, beside the database.
        self.api = ApiActivities(store, client, home=home, eager_start=eager_start)
        self.activities.admission.entries = self.api.entries
        self.worker = Worker(
            client,
            task_queue=CONTROL_TASK_QUEUE,
            workflows=[
                JobWorkflow,
                LogReaderWorkflow,
                FleetWorkflow,
                ControlApiWorkflow,
                AdmissionWorkflow,
            ],
            workflow_runner=workflow_runner(),
            activities=[*self.activities.activities(), *self.api.activities()],
            max_concurrent_activities=64,
        )

    async def _ensure_agent(self, host: HostRow) -> str | None:
        if host.simulated:
            return await self.sim_agents.ensure(host)
        if host.ssh:
            from gpuflow import secrets
            from gpuflow.ssh.agents import ensure_host_agent

            return await ensure_host_agent(
                host.id, host.ssh, secrets_path=secrets.secrets_file(self.home)
            )
        return None  # the local agent is started by `gpuflow up` or by the operator

    async def __aenter__(self) -> ControlWorker:
        for host in await asyncio.to_thread(list_hosts, self.store):
            if host.simulated:
                await self.sim_agents.ensure(host)
        await self.worker.__aenter__()
        self._metrics.enter_context(watch_store(self.store))
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._metrics.close()
        await self.worker.__aexit__(None, None, None)
        await self.sim_agents.close()
