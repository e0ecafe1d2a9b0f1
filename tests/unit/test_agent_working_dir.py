"""Where a job runs on its host (`working_dir`), with real processes: a relative path is inside
the job's own directory that the agent makes (where a job without working_dir runs), whatever
directory the agent was started in; `~` is the home of the user the agent runs as."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.testing import ActivityEnvironment

from gpuflow.agent.activities import HostAgent
from gpuflow.scheduler.model import NodePlacement
from gpuflow.workflows.models import StartProcessInput
from tests.fake_sampler import FixedSampler

pytestmark = pytest.mark.asyncio(loop_scope="session")


def _agent(tmp_path: Path) -> HostAgent:
    return HostAgent(
        host_id="sim/h1",
        state_dir=tmp_path / "agent",
        sampler=FixedSampler(silent=True),
        secrets_path=tmp_path / "secrets.json",
    )


async def _ran_in(agent: HostAgent, working_dir: str | None) -> Path:
    """The directory the job's commands ran in (what `pwd -P` printed)."""
    node = NodePlacement(
        rank=0,
        host_id="sim/h1",
        host_name="h1",
        fleet="sim",
        task_queue="q",
        gpu_indices=[],
        address="127.0.0.1",
    )
    start = StartProcessInput(
        job_id="job-wd-1",
        attempt=1,
        node=node,
        nodes=1,
        master_address="127.0.0.1",
        commands=["pwd -P"],
        working_dir=working_dir,
        wait_s=10,
    )
    handle = await ActivityEnvironment().run(agent.start_process, start)
    assert handle.exited is not None and handle.exited.exit_code == 0
    return Path(Path(handle.log_path).read_text().strip())


@pytest.fixture
def elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The directory the agent was started in: nothing of a job's may land here."""
    started_in = tmp_path / "started-in"
    started_in.mkdir()
    monkeypatch.chdir(started_in)
    return started_in


async def test_a_relative_working_dir_is_inside_the_jobs_own_directory(
    tmp_path: Path, elsewhere: Path
) -> None:
    """It was resolved against (and created in) the directory the agent was started in."""
    agent = _agent(tmp_path)
    run_dir = (tmp_path / "agent" / "jobs" / "job-wd-1" / "1-0").resolve()
    assert await _ran_in(agent, "relative/dir") == run_dir / "relative" / "dir"
    assert list(elsewhere.iterdir()) == []


async def test_no_working_dir_is_the_jobs_own_directory(tmp_path: Path, elsewhere: Path) -> None:
    agent = _agent(tmp_path)
    run_dir = (tmp_path / "agent" / "jobs" / "job-wd-1" / "1-0").resolve()
    assert await _ran_in(agent, None) == run_dir
    assert run_dir.stat().st_mode & 0o777 == 0o700  # made private before anything inside it


@pytest.mark.parametrize(("written", "under_home"), [("~", ""), ("~/runs/a", "runs/a")])
async def test_a_working_dir_from_tilde_is_in_the_agent_users_home(
    tmp_path: Path,
    elsewhere: Path,
    monkeypatch: pytest.MonkeyPatch,
    written: str,
    under_home: str,
) -> None:
    """`~` was taken as a directory named `~` in the agent's starting directory."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    assert await _ran_in(_agent(tmp_path), written) == (home / under_home).resolve()
    assert list(elsewhere.iterdir()) == []


async def test_an_absolute_working_dir_is_used_as_it_is(tmp_path: Path, elsewhere: Path) -> None:
    where = tmp_path / "data" / "run-1"
    assert await _ran_in(_agent(tmp_path), str(where)) == where.resolve()
