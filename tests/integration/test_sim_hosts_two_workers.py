"""Two whole control workers on one machine and one GPUFLOW_HOME (as two `python -m
gpuflow.control.main` would run), each with its own engine and its own agents for the same sim
hosts, on a real Temporal dev server: a host's task queue then has two agents, and a job's
start, probes, log reads and stop go to either. Jobs still end as they should, their output
reads back whole, a stop stops the process the other agent started, and no GPU is held twice
or left held."""

from __future__ import annotations

import asyncio
import collections
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from sqlmodel import select
from temporalio.testing import WorkflowEnvironment

from gpuflow.agent.activities import HostAgent
from gpuflow.agent.processes import group_alive
from gpuflow.client import Client
from gpuflow.control.worker import ControlWorker
from gpuflow.specs import JobSpec
from gpuflow.status import JobStatus
from gpuflow.store.db import Store
from gpuflow.store.tables import AllocationRow, HostRow
from tests.integration.two_workers import running, second_connection, sim_fleet

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]


async def _output(client: Client, job_id: str) -> str:
    lines = client.logs(job_id)
    try:
        return "".join([line async for line in lines])
    finally:
        await lines.aclose()  # type: ignore[attr-defined]


Calls = collections.Counter[tuple[int, str, str]]
"""(agent object id, activity, job id) -> times."""


def _counting(calls: Calls, monkeypatch: pytest.MonkeyPatch) -> None:
    """Count, per agent object, the activities that looked up a run's files (every start,
    probe, stop and log read does, first thing)."""
    original = HostAgent._paths

    def paths(self: HostAgent, job_id: str, attempt: int, rank: int) -> Any:
        calls[id(self), sys._getframe(1).f_code.co_name, job_id] += 1
        return original(self, job_id, attempt, rank)

    monkeypatch.setattr(HostAgent, "_paths", paths)


async def test_two_control_workers_serve_the_same_sim_hosts(
    dev_env: WorkflowEnvironment, store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = sim_fleet()
    fleet = spec.name
    other = Store(store.url).init()
    client = Client(temporal=dev_env.client)
    # The second worker's own connection, as a second process has.
    connection = await second_connection(dev_env)
    calls: Calls = collections.Counter()
    _counting(calls, monkeypatch)
    wait = {"on_events": ["no-capacity"], "duration": "10m"}
    try:
        async with ControlWorker(dev_env.client, store, home=tmp_path) as first:
            await client.apply_fleet(spec)
            async with ControlWorker(connection, other, home=tmp_path) as second:
                for worker in (first, second):  # both serve both hosts
                    for host in spec.hosts:
                        row = await asyncio.to_thread(_host_row, store, f"{fleet}/{host.name}")
                        await worker.sim_agents.ensure(row)
                long = await client.submit(
                    JobSpec.model_validate(
                        {
                            "name": "long",
                            "commands": ["echo begun", "sleep 300"],
                            "resources": {"gpu": "A100:1"},
                            "fleets": [fleet],
                        }
                    )
                )
                jobs = [
                    await client.submit(
                        JobSpec.model_validate(
                            {
                                "name": f"short-{k}",
                                "commands": [f"echo line-{k}-a", "sleep 0.5", f"echo line-{k}-b"],
                                "resources": {"gpu": "A100:1"},
                                "retry": wait,
                                "fleets": [fleet],
                            }
                        )
                    )
                    for k in range(12)
                ]
                results = await asyncio.gather(*(client.wait(j.id, timeout_s=240) for j in jobs))
                outputs = [await _output(client, j.id) for j in jobs]
                await running(client, long.id)
                (state,) = (tmp_path / "agents").glob(f"*/jobs/{long.id}/*/process.json")
                pid = json.loads(state.read_text())["pid"]
                assert group_alive(pid)
                stopped = await client.stop(long.id, grace_s=5)
                ended = await client.get(long.id)
    finally:
        other.dispose()
    assert [r.status for r in results] == [JobStatus.DONE] * len(jobs)
    for k, text in enumerate(outputs):
        assert f"line-{k}-a" in text and f"line-{k}-b" in text, text
    assert ended.status == JobStatus.STOPPED, (stopped, ended)
    with store.read() as session:
        assert session.exec(select(AllocationRow)).all() == []
    # The long job's processes are gone, whichever agent started and stopped them.
    assert not group_alive(pid)
    # Both workers' agents served each host, and runs were started by one agent and probed,
    # read or stopped by another.
    assert len({agent for agent, _, _ in calls}) == 4, calls
    started = {job: agent for agent, step, job in calls if step == "start_process"}
    crossed = {job for agent, step, job in calls if job in started and started[job] != agent}
    assert crossed, calls


def _host_row(store: Store, host_id: str) -> HostRow:
    with store.read() as session:
        row = session.get(HostRow, host_id)
        assert row is not None
        return row
