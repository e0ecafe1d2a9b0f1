"""Secrets on the host agent, with real processes: values injected into a job are masked in every
log chunk the agent hands over (also when a read cuts them, and whatever becomes of the secret
after the start, across agent restarts: the values are recorded with the run), never written to
the agent's other files, which only their owner can read; a broken secrets file refuses the
start (a job failure, not a lost host)."""

from __future__ import annotations

import asyncio
import hashlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from gpuflow import secrets
from gpuflow.agent.activities import HostAgent
from gpuflow.agent.logs import record_masks, recorded_masks
from gpuflow.agent.processes import RunPaths
from gpuflow.scheduler.model import NodePlacement
from gpuflow.workflows.models import LogsInput, ProbeInput, StartProcessInput, StopProcessInput
from tests.fake_sampler import FixedSampler

pytestmark = pytest.mark.asyncio(loop_scope="session")

TOKEN = "tok-5f3a9c2e71d84b06"


@pytest.fixture
def secrets_path(tmp_path: Path) -> Path:
    path = tmp_path / "secrets.json"
    secrets.set_all({"token": TOKEN, "key": "line-one-abc\nline-two-def", "pin": "42"}, path)
    return path


@pytest.fixture(autouse=True)
def loose_umask() -> Iterator[None]:
    old = os.umask(0o022)  # what most hosts have: modes must not depend on it
    yield
    os.umask(old)


def _agent(tmp_path: Path, secrets_path: Path) -> HostAgent:
    return HostAgent(
        host_id="sim/h1",
        state_dir=tmp_path / "agent",
        sampler=FixedSampler(silent=True),
        secrets_path=secrets_path,
    )


def _start(commands: list[str], job_id: str = "job-s-1", **env: str) -> StartProcessInput:
    node = NodePlacement(
        rank=0,
        host_id="sim/h1",
        host_name="h1",
        fleet="sim",
        task_queue="q",
        gpu_indices=[0],
        address="127.0.0.1",
    )
    return StartProcessInput(
        job_id=job_id,
        attempt=1,
        node=node,
        nodes=1,
        master_address="127.0.0.1",
        commands=commands,
        env=env,
    )


async def _wait_exit(agent: HostAgent, job_id: str) -> None:
    env = ActivityEnvironment()
    for _ in range(200):
        probe = await env.run(agent.probe_process, ProbeInput(job_id=job_id, attempt=1, rank=0))
        if probe.state == "exited":
            return
        await asyncio.sleep(0.05)
    raise AssertionError("still running")


async def _read_all(agent: HostAgent, job_id: str, *, limit: int, rounds: int = 400) -> str:
    """Read the log `limit` bytes at a time, while the job runs and after, as a follow does."""
    env = ActivityEnvironment()
    out, offset = "", 0
    for _ in range(rounds):
        chunk = await env.run(agent.read_logs, LogsInput(job_id=job_id, offset=offset, limit=limit))
        out, offset = out + chunk.data, chunk.next_offset
        done = (agent.state_dir / "jobs" / job_id / "1-0" / "exit_code").exists()
        if chunk.eof and done and not chunk.data:
            return out
        await asyncio.sleep(0.01)
    raise AssertionError("log never ended")


async def test_injected_values_are_masked_and_reach_the_job(
    tmp_path: Path, secrets_path: Path
) -> None:
    agent = _agent(tmp_path, secrets_path)
    await ActivityEnvironment().run(
        agent.start_process,
        _start(
            [
                'echo "token=$TOKEN twice $TOKEN"',
                'printf %s "$TOKEN" | sha256sum',
                'echo "$KEY"',
                'echo "$KEY" | tail -n 1 | sed "s/^/2nd /"',
                'echo "pin=$PIN"',
            ],
            TOKEN="${{ secrets.token }}",
            KEY="${{ secrets.key }}",
            PIN="${{ secrets.pin }}",
        ),
    )
    await _wait_exit(agent, "job-s-1")
    log = await _read_all(agent, "job-s-1", limit=256 * 1024)
    digest = hashlib.sha256(TOKEN.encode()).hexdigest()
    # The multi-line value printed whole is one mask; a line of it alone is masked too; a value
    # shorter than MIN_MASKED_LENGTH is not.
    assert log.splitlines() == ["token=*** twice ***", f"{digest}  -", "***", "2nd ***", "pin=42"]


async def test_a_value_written_in_pieces_and_read_in_small_chunks_never_shows(
    tmp_path: Path, secrets_path: Path
) -> None:
    agent = _agent(tmp_path, secrets_path)
    await ActivityEnvironment().run(
        agent.start_process,
        _start(
            [
                'for i in 1 2 3; do printf "a%s-%s" $i "${TOKEN:0:9}"; sleep 0.2; '
                'printf "%s b\\n" "${TOKEN:9}"; done'
            ],
            TOKEN="${{ secrets.token }}",
        ),
    )
    for limit in (5, 13, 4096):
        log = await _read_all(agent, "job-s-1", limit=limit)
        assert TOKEN not in log and TOKEN[:9] + TOKEN[9:12] not in log, limit
        assert log == "a1-*** b\na2-*** b\na3-*** b\n", limit


def _run_dir(tmp_path: Path, job_id: str = "job-s-1") -> Path:
    return tmp_path / "agent" / "jobs" / job_id / "1-0"


async def test_a_run_of_an_older_agent_is_masked_with_the_values_looked_up_again(
    tmp_path: Path, secrets_path: Path
) -> None:
    first = _agent(tmp_path, secrets_path)
    await ActivityEnvironment().run(
        first.start_process, _start(['echo "$TOKEN"'], TOKEN="${{ secrets.token }}")
    )
    await _wait_exit(first, "job-s-1")
    (_run_dir(tmp_path) / "masks.json").unlink()  # as an agent that kept no record left it
    restarted = _agent(tmp_path, secrets_path)
    assert await _read_all(restarted, "job-s-1", limit=1024) == "***\n"


@pytest.mark.parametrize("change", ["deleted", "rotated", "broken"])
async def test_a_restarted_agent_masks_the_value_given_whatever_became_of_the_secret(
    tmp_path: Path, secrets_path: Path, change: str
) -> None:
    first = _agent(tmp_path, secrets_path)
    await ActivityEnvironment().run(
        first.start_process, _start(['echo "t=$TOKEN"'], TOKEN="${{ secrets.token }}")
    )
    await _wait_exit(first, "job-s-1")
    if change == "deleted":
        secrets.delete_secret("token", secrets_path)
    elif change == "rotated":
        secrets.set_secret("token", "rotated-value-123", secrets_path)
    else:
        secrets_path.write_text("{not json")
    restarted = _agent(tmp_path, secrets_path)
    assert await _read_all(restarted, "job-s-1", limit=1024) == "t=***\n"


async def test_a_job_running_across_a_restart_and_a_rotation_stays_masked(
    tmp_path: Path, secrets_path: Path
) -> None:
    """The process keeps the value it was given and prints it after the restart."""
    go = tmp_path / "go"
    first = _agent(tmp_path, secrets_path)
    await ActivityEnvironment().run(
        first.start_process,
        _start(
            [f'echo "a=$TOKEN"; while [ ! -e {go} ]; do sleep 0.02; done; echo "b=$TOKEN"'],
            TOKEN="${{ secrets.token }}",
        ),
    )
    restarted = _agent(tmp_path, secrets_path)
    secrets.set_secret("token", "rotated-value-123", secrets_path)
    go.touch()
    assert await _read_all(restarted, "job-s-1", limit=7) == "a=***\nb=***\n"


@pytest.mark.parametrize("content", [b"{not json", b'{"values": [5]}', b"[]", b"\xff"])
async def test_a_run_whose_record_cannot_be_read_refuses_the_log_rather_than_leak(
    tmp_path: Path, secrets_path: Path, content: bytes
) -> None:
    agent = _agent(tmp_path, secrets_path)
    await ActivityEnvironment().run(
        agent.start_process, _start(['echo "$TOKEN"'], TOKEN="${{ secrets.token }}")
    )
    await _wait_exit(agent, "job-s-1")
    secrets.delete_secret("token", secrets_path)
    (_run_dir(tmp_path) / "masks.json").write_bytes(content)
    with pytest.raises(ApplicationError) as refused:
        await ActivityEnvironment().run(agent.read_logs, LogsInput(job_id="job-s-1"))
    assert refused.value.non_retryable
    message = str(refused.value)
    assert message.startswith(f"cannot mask the job's secrets in its log: {_run_dir(tmp_path)}")
    assert TOKEN not in message and "\n" not in message


async def test_a_retried_start_adds_to_the_record_of_an_earlier_one(tmp_path: Path) -> None:
    """The process a retried start adopts was given what the earlier start resolved."""
    paths = RunPaths(tmp_path)
    assert recorded_masks(paths) is None
    record_masks(paths, ["first-value"])
    record_masks(paths, ["second-value", "first-value"])
    assert recorded_masks(paths) == ["first-value", "second-value"]
    assert stat.S_IMODE(paths.masks.stat().st_mode) == 0o600


async def test_a_changed_secret_is_still_masked_by_the_agent_that_injected_it(
    tmp_path: Path, secrets_path: Path
) -> None:
    agent = _agent(tmp_path, secrets_path)
    await ActivityEnvironment().run(
        agent.start_process, _start(['echo "$TOKEN"'], TOKEN="${{ secrets.token }}")
    )
    await _wait_exit(agent, "job-s-1")
    secrets.set_secret("token", "rotated-value-123", secrets_path)
    assert await _read_all(agent, "job-s-1", limit=1024) == "***\n"
    secrets_path.write_text("{not json")
    assert await _read_all(agent, "job-s-1", limit=1024) == "***\n"  # it knows the value


async def test_an_unreadable_secrets_file_refuses_the_log_of_an_older_agents_run(
    tmp_path: Path, secrets_path: Path
) -> None:
    first = _agent(tmp_path, secrets_path)
    await ActivityEnvironment().run(
        first.start_process, _start(['echo "$TOKEN"'], TOKEN="${{ secrets.token }}")
    )
    await _wait_exit(first, "job-s-1")
    (_run_dir(tmp_path) / "masks.json").unlink()  # no record: the values cannot be known
    secrets_path.write_text("{not json")
    with pytest.raises(ApplicationError) as refused:
        await ActivityEnvironment().run(
            _agent(tmp_path, secrets_path).read_logs, LogsInput(job_id="job-s-1")
        )
    assert refused.value.non_retryable
    assert f"secrets file {secrets_path} is not valid JSON" in str(refused.value)


async def test_values_never_reach_the_agents_files_which_only_the_owner_reads(
    tmp_path: Path, secrets_path: Path
) -> None:
    agent = _agent(tmp_path, secrets_path)
    await ActivityEnvironment().run(
        agent.start_process, _start(['echo "$TOKEN"'], TOKEN="${{ secrets.token }}")
    )
    await _wait_exit(agent, "job-s-1")
    job_dir = tmp_path / "agent" / "jobs" / "job-s-1" / "1-0"
    for directory in (tmp_path / "agent", job_dir.parent.parent, job_dir.parent, job_dir):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700, directory
    assert stat.S_IMODE((job_dir / "claimed").stat().st_mode) == 0o700  # the run's claim
    files = sorted(p.name for p in job_dir.iterdir() if p.is_file())
    assert files == ["exit_code", "job.sh", "masks.json", "output.log", "pid", "process.json"]
    for name in files:
        assert stat.S_IMODE((job_dir / name).stat().st_mode) == 0o600, name
        # The job's own output, on the host, is what it printed; the masks are the values
        # to hide in it, as private as it is.
        if name not in ("output.log", "masks.json"):
            assert TOKEN not in (job_dir / name).read_text(), name


@pytest.mark.parametrize("content", [b"{not json", b'{"token": 5}', b"[]", b'{"t": "\xff"}'])
async def test_a_broken_secrets_file_refuses_the_start_naming_the_file(
    tmp_path: Path, secrets_path: Path, content: bytes
) -> None:
    secrets_path.write_bytes(content)
    agent = _agent(tmp_path, secrets_path)
    with pytest.raises(ApplicationError) as refused:
        await ActivityEnvironment().run(
            agent.start_process, _start(["true"], TOKEN="${{ secrets.token }}")
        )
    assert refused.value.non_retryable  # the job fails; not an interruption to retry
    message = str(refused.value)
    assert message.startswith(f"secrets file {secrets_path} is not valid JSON: ")
    assert message.endswith("; fix or remove it") and "\n" not in message
    assert not (tmp_path / "agent" / "jobs" / "job-s-1").exists()


async def test_a_held_back_tail_is_released_once_nothing_can_write(
    tmp_path: Path, secrets_path: Path
) -> None:
    agent = _agent(tmp_path, secrets_path)
    env = ActivityEnvironment()
    await env.run(
        agent.start_process,
        _start(['printf "end tok-5f"', "sleep 30"], TOKEN="${{ secrets.token }}"),
    )
    log = tmp_path / "agent" / "jobs" / "job-s-1" / "1-0" / "output.log"
    for _ in range(100):
        if log.read_bytes():
            break
        await asyncio.sleep(0.05)
    running = await env.run(agent.read_logs, LogsInput(job_id="job-s-1", wait_s=0.3))
    assert (running.data, running.next_offset) == ("end ", 4)  # "tok-5f" may be a value's start
    await env.run(
        agent.stop_process, StopProcessInput(job_id="job-s-1", attempt=1, rank=0, grace_s=2)
    )
    stopped = await env.run(agent.read_logs, LogsInput(job_id="job-s-1", offset=4))
    assert (stopped.data, stopped.eof) == ("tok-5f", True)


@pytest.mark.parametrize("problem", ["a file", "under a file"])
async def test_a_working_dir_that_cannot_be_used_refuses_the_start(
    tmp_path: Path, secrets_path: Path, problem: str
) -> None:
    """The job's fault, not its host's: it ends start_failed with one line, not host_lost after
    three tries with a Python exception."""
    (tmp_path / "wd").write_text("")
    where = tmp_path / "wd" if problem == "a file" else tmp_path / "wd" / "sub"
    agent = _agent(tmp_path, secrets_path)
    start = _start(["true"]).model_copy(update={"working_dir": str(where)})
    with pytest.raises(ApplicationError) as refused:
        await ActivityEnvironment().run(agent.start_process, start)
    assert refused.value.non_retryable
    reason = "file exists" if problem == "a file" else "not a directory"
    assert str(refused.value) == f"working_dir {where} cannot be used on sim/h1: {reason}"
    assert not (tmp_path / "agent" / "jobs" / "job-s-1" / "1-0" / "pid").exists()
