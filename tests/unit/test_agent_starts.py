"""Starts on one host side by side: starts of different runs do not wait for each other, and
starts of the same run (a retry beside the first) still launch its script once."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from temporalio.testing import ActivityEnvironment

from gpuflow.agent import activities
from gpuflow.agent.launch import RunLocks
from gpuflow.workflows.models import ProbeInput, StopProcessInput
from tests.unit.test_host_agent import _agent, _start, _until_exited

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_starts_of_different_runs_wait_for_each_other_to_launch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each start waits for its wrapper's pid until the other start has launched too: an agent
    that started one run at a time (a lock per agent) would never get there."""
    launched: set[str] = set()
    both = asyncio.Event()
    real = activities.claimed_pid

    async def claimed_pid(**kw: Any) -> int | None:
        if kw.get("launched"):
            launched.add(kw["pid"].parent.parent.name)
            if len(launched) == 2:
                both.set()
            await asyncio.wait_for(both.wait(), timeout=5)
        return await real(**kw)

    monkeypatch.setattr(activities, "claimed_pid", claimed_pid)
    agent = _agent(tmp_path)
    env = ActivityEnvironment()
    starts = [_start(["sleep 30"], job_id=job) for job in ("job-a-1", "job-b-1")]
    handles = await asyncio.gather(*(env.run(agent.start_process, s) for s in starts))
    assert launched == {"job-a-1", "job-b-1"}
    assert len({h.pid for h in handles}) == 2 and not any(h.already_running for h in handles)
    for job in ("job-a-1", "job-b-1"):
        stop = StopProcessInput(job_id=job, attempt=1, rank=0, grace_s=2)
        assert (await env.run(agent.stop_process, stop)).was_running


async def test_starts_of_one_run_side_by_side_launch_it_once(tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    agent = _agent(tmp_path)
    env = ActivityEnvironment()
    inp = _start([f"echo started >> {marks}"])
    handles = await asyncio.gather(*(env.run(agent.start_process, inp) for _ in range(3)))
    assert len({h.pid for h in handles}) == 1
    assert sorted(h.already_running for h in handles) == [False, True, True]
    assert await _until_exited(agent, ProbeInput(job_id="job-t-1", attempt=1, rank=0)) == "exited:0"
    assert marks.read_text().splitlines() == ["started"]
    assert len(agent._starting) == 0  # no lock kept for a run nobody starts


async def test_a_run_lock_is_held_by_one_and_forgotten_after_the_last() -> None:
    locks = RunLocks()
    order: list[str] = []
    entered = asyncio.Event()

    async def first() -> None:
        async with locks.hold("r"):
            entered.set()
            await asyncio.sleep(0.05)
            order.append("first")

    async def second() -> None:
        await entered.wait()
        async with locks.hold("r"):
            order.append("second")

    async def other() -> None:
        await entered.wait()
        async with locks.hold("s"):
            order.append("other")

    await asyncio.gather(first(), second(), other())
    assert order == ["other", "first", "second"]
    assert len(locks) == 0
