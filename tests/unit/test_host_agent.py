"""The host agent's activities on real processes: idempotent start, exit codes, stop with
SIGTERM then SIGKILL, node variables, and a restarted agent that still knows its processes."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from temporalio.testing import ActivityEnvironment

from gpuflow.agent.activities import HostAgent
from gpuflow.scheduler.model import NodePlacement
from gpuflow.workflows.models import LogsInput, ProbeInput, StartProcessInput, StopProcessInput
from tests.fake_sampler import FixedSampler

pytestmark = pytest.mark.asyncio(loop_scope="session")


def _agent(tmp_path: Path) -> HostAgent:
    return HostAgent(host_id="sim/h1", state_dir=tmp_path / "agent", sampler=FixedSampler())


def _start(
    commands: list[str], *, rank: int = 0, gpus: list[int] | None = None, job_id: str = "job-t-1"
) -> StartProcessInput:
    node = NodePlacement(
        rank=rank,
        host_id="sim/h1",
        host_name="h1",
        fleet="sim",
        task_queue="q",
        gpu_indices=gpus or [2, 3],
        address="10.9.8.7",
    )
    return StartProcessInput(
        job_id=job_id,
        attempt=1,
        node=node,
        nodes=2,
        master_address="10.9.8.7",
        commands=commands,
        env={"GREETING": "hi"},
    )


async def _until_exited(agent: HostAgent, probe: ProbeInput, timeout: float = 10) -> str:
    env = ActivityEnvironment()
    for _ in range(int(timeout * 20)):
        result = await env.run(agent.probe_process, probe)
        if result.state != "running":
            return f"{result.state}:{result.exit_code}"
        await asyncio.sleep(0.05)
    raise AssertionError("still running")


async def test_start_is_idempotent_and_sets_node_variables(tmp_path: Path) -> None:
    agent = _agent(tmp_path)
    env = ActivityEnvironment()
    inp = _start(
        [
            "echo $GREETING rank=$GPUFLOW_NODE_RANK of=$GPUFLOW_NODES_NUM",
            "echo cuda=$CUDA_VISIBLE_DEVICES master=$GPUFLOW_MASTER_NODE_IP "
            "per_node=$GPUFLOW_GPUS_PER_NODE",
        ]
    )
    first = await env.run(agent.start_process, inp)
    second = await env.run(agent.start_process, inp)
    assert second.pid == first.pid and second.already_running and not first.already_running
    probe = ProbeInput(job_id="job-t-1", attempt=1, rank=0)
    assert await _until_exited(agent, probe) == "exited:0"
    log = await env.run(agent.read_logs, LogsInput(job_id="job-t-1"))
    assert log.data.splitlines() == ["hi rank=0 of=2", "cuda=2,3 master=10.9.8.7 per_node=2"]


async def test_exit_code_is_reported(tmp_path: Path) -> None:
    agent = _agent(tmp_path)
    await ActivityEnvironment().run(agent.start_process, _start(["exit 7"]))
    assert await _until_exited(agent, ProbeInput(job_id="job-t-1", attempt=1, rank=0)) == "exited:7"


async def test_running_probe_carries_samples(tmp_path: Path) -> None:
    agent = _agent(tmp_path)
    env = ActivityEnvironment()
    await env.run(agent.start_process, _start(["sleep 30"]))
    result = await env.run(
        agent.probe_process, ProbeInput(job_id="job-t-1", attempt=1, rank=0, gpu_indices=[2, 3])
    )
    assert result.state == "running"
    assert [s.gpu for s in result.samples] == [2, 3]
    await env.run(
        agent.stop_process, StopProcessInput(job_id="job-t-1", attempt=1, rank=0, grace_s=2)
    )


async def test_restarted_agent_knows_its_process_and_stops_it(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    env = ActivityEnvironment()
    await env.run(_agent(tmp_path).start_process, _start([f"echo $$ > {pid_file}", "sleep 60"]))
    for _ in range(100):
        if pid_file.exists() and pid_file.read_text().strip():
            break
        await asyncio.sleep(0.05)
    restarted = _agent(tmp_path)  # a new agent process: nothing in memory, same state dir
    probe = ProbeInput(job_id="job-t-1", attempt=1, rank=0)
    assert (await env.run(restarted.probe_process, probe)).state == "running"
    again = await env.run(restarted.start_process, _start(["sleep 60"]))
    assert again.already_running
    stopped = await env.run(
        restarted.stop_process, StopProcessInput(job_id="job-t-1", attempt=1, rank=0, grace_s=5)
    )
    assert stopped.was_running and stopped.signal == "TERM"
    job_pid = int(pid_file.read_text())
    await asyncio.sleep(0.2)
    assert not _alive(job_pid)
    assert (await env.run(restarted.probe_process, probe)).state == "stopped"
    second = await env.run(
        restarted.stop_process, StopProcessInput(job_id="job-t-1", attempt=1, rank=0)
    )
    assert not second.was_running


async def test_stop_escalates_to_kill_after_grace(tmp_path: Path) -> None:
    agent = _agent(tmp_path)
    env = ActivityEnvironment()
    await env.run(agent.start_process, _start(["trap '' TERM", "sleep 60 & wait"]))
    await asyncio.sleep(0.3)
    stopped = await env.run(
        agent.stop_process, StopProcessInput(job_id="job-t-1", attempt=1, rank=0, grace_s=0.5)
    )
    assert stopped.signal == "KILL"


async def test_vanished_state_is_missing_not_idle(tmp_path: Path) -> None:
    agent = _agent(tmp_path)
    result = await ActivityEnvironment().run(
        agent.probe_process, ProbeInput(job_id="job-unknown", attempt=1, rank=0)
    )
    assert result.state == "missing"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and ") Z" not in stat.read_text()


async def test_exit_reports_whether_processes_outlived_the_script(tmp_path: Path) -> None:
    """A script that exits alone leaves nothing to stop; one that leaves a background child
    behind says so, and stopping it at finalize kills that child."""
    agent = _agent(tmp_path)
    env = ActivityEnvironment()
    await env.run(agent.start_process, _start(["true"], job_id="job-clean"))
    clean = ProbeInput(job_id="job-clean", attempt=1, rank=0)
    assert await _until_exited(agent, clean) == "exited:0"
    assert not (await env.run(agent.probe_process, clean)).leftovers

    pid_file = tmp_path / "child"
    await env.run(
        agent.start_process, _start([f"(sleep 60 & echo $! > {pid_file})"], job_id="job-leaky")
    )
    leaky = ProbeInput(job_id="job-leaky", attempt=1, rank=0)
    assert await _until_exited(agent, leaky) == "exited:0"
    assert (await env.run(agent.probe_process, leaky)).leftovers
    child = int(pid_file.read_text())
    assert _alive(child)
    stopped = await env.run(
        agent.stop_process, StopProcessInput(job_id="job-leaky", attempt=1, rank=0, grace_s=2)
    )
    assert stopped.was_running
    await asyncio.sleep(0.2)
    assert not _alive(child)


async def test_jobs_get_their_env_and_an_allowlist_never_the_agents(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PGPASSWORD", "pg-must-not-leak")
    monkeypatch.setenv("GPUFLOW_TEMPORAL_API_KEY", "key-must-not-leak")
    monkeypatch.setenv("GPUFLOW_DATABASE_URL", "postgresql://u:pw-must-not-leak@127.0.0.1/x")
    monkeypatch.setenv("GPUFLOW_SOME_SETTING", "not-inherited")
    monkeypatch.setenv("TEMPORAL_TLS_CERT", "/tls-must-not-leak")
    monkeypatch.setenv("LC_TIME", "C.UTF-8")
    monkeypatch.setenv("TZ", "Europe/Paris")
    agent = _agent(tmp_path)
    env = ActivityEnvironment()
    await env.run(agent.start_process, _start(["env"]))
    assert await _until_exited(agent, ProbeInput(job_id="job-t-1", attempt=1, rank=0)) == "exited:0"
    log = (await env.run(agent.read_logs, LogsInput(job_id="job-t-1"))).data
    dumped = dict(line.split("=", 1) for line in log.splitlines() if "=" in line)
    assert "must-not-leak" not in log
    assert not {"PGPASSWORD", "GPUFLOW_TEMPORAL_API_KEY", "GPUFLOW_SOME_SETTING"} & set(dumped)
    assert dumped["GREETING"] == "hi"  # the job's own env
    assert dumped["PATH"] == os.environ["PATH"] and dumped["HOME"] == os.environ["HOME"]
    assert (dumped["LC_TIME"], dumped["TZ"]) == ("C.UTF-8", "Europe/Paris")
    assert dumped["GPUFLOW_NODE_RANK"] == "0" and dumped["CUDA_VISIBLE_DEVICES"] == "2,3"


async def test_probe_waits_for_a_quick_exit_but_not_past_its_wait(tmp_path: Path) -> None:
    agent = _agent(tmp_path)
    env = ActivityEnvironment()
    loop = asyncio.get_running_loop()
    await env.run(agent.start_process, _start(["sleep 0.3", "exit 3"], job_id="job-quick"))
    t0 = loop.time()
    quick = await env.run(
        agent.probe_process, ProbeInput(job_id="job-quick", attempt=1, rank=0, wait_s=3)
    )
    assert (quick.state, quick.exit_code) == ("exited", 3)
    assert loop.time() - t0 < 2.5

    await env.run(agent.start_process, _start(["sleep 30"], job_id="job-slow"))
    t0 = loop.time()
    slow = await env.run(
        agent.probe_process, ProbeInput(job_id="job-slow", attempt=1, rank=0, wait_s=0.5)
    )
    assert slow.state == "running"
    assert 0.4 < loop.time() - t0 < 3
    await env.run(
        agent.stop_process, StopProcessInput(job_id="job-slow", attempt=1, rank=0, grace_s=2)
    )


async def test_start_reports_an_exit_within_its_wait(tmp_path: Path) -> None:
    agent = _agent(tmp_path)
    env = ActivityEnvironment()
    quick = _start(["exit 5"], job_id="job-at-once").model_copy(update={"wait_s": 3.0})
    handle = await env.run(agent.start_process, quick)
    assert handle.exited is not None
    assert (handle.exited.state, handle.exited.exit_code) == ("exited", 5)
    again = await env.run(agent.start_process, quick)  # a retried start: same process, same exit
    assert again.already_running and again.pid == handle.pid and again.exited == handle.exited

    slow = _start(["sleep 30"], job_id="job-slow-start").model_copy(update={"wait_s": 0.3})
    t0 = asyncio.get_running_loop().time()
    running = await env.run(agent.start_process, slow)
    assert running.exited is None and asyncio.get_running_loop().time() - t0 >= 0.25
    await env.run(
        agent.stop_process, StopProcessInput(job_id="job-slow-start", attempt=1, rank=0, grace_s=2)
    )


class _CutOff(Exception):
    """Stands for the agent dying after it started the process, before it recorded it."""


async def test_a_start_cut_off_before_recording_is_adopted_not_run_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marks = tmp_path / "marks"
    inp = _start([f"echo started >> {marks}", "sleep 2"])
    env = ActivityEnvironment()

    def die(pid: int) -> int | None:
        raise _CutOff

    with monkeypatch.context() as patch:
        patch.setattr("gpuflow.agent.processes.proc_start_time", die)
        with pytest.raises(_CutOff):
            await env.run(_agent(tmp_path).start_process, inp)
    assert not (tmp_path / "agent" / "jobs" / "job-t-1" / "1-0" / "process.json").exists()
    retried = await env.run(_agent(tmp_path).start_process, inp)  # a fresh agent, same state
    assert retried.already_running
    agent = _agent(tmp_path)
    assert await _until_exited(agent, ProbeInput(job_id="job-t-1", attempt=1, rank=0)) == "exited:0"
    assert marks.read_text().splitlines() == ["started"]


async def test_two_racing_wrappers_run_the_script_once(tmp_path: Path) -> None:
    # A start whose wrapper had not yet claimed the run when a retry started a second one.
    from gpuflow.agent.launch import claimed_pid, wrapper_command

    root = tmp_path / "run"
    root.mkdir()
    (root / "job.sh").write_text(f"echo ran >> {tmp_path / 'marks'}\n")
    line = wrapper_command(
        script=root / "job.sh",
        log=root / "out",
        exit_code=root / "code",
        claim=root / "claimed",
        pid=root / "pid",
    )
    procs = [await asyncio.create_subprocess_exec("bash", "-c", line) for _ in range(4)]
    codes = sorted([await p.wait() for p in procs])
    assert codes == [0, 97, 97, 97]
    assert (tmp_path / "marks").read_text().splitlines() == ["ran"]
    winner = await claimed_pid(claim=root / "claimed", pid=root / "pid")
    assert winner in {p.pid for p in procs}


async def test_a_probe_is_a_long_poll_answered_at_the_exit(tmp_path: Path) -> None:
    """A probe waits as long as the monitor's tick asks (past the 5 s an agent once capped it
    at), answers the moment the script exits, and ends early when the job's process group dies
    without an exit code or the probe is cancelled (a stop)."""
    agent = _agent(tmp_path)
    env = ActivityEnvironment()
    loop = asyncio.get_running_loop()
    await env.run(agent.start_process, _start(["sleep 5.5", "exit 0"], job_id="job-long"))
    t0 = loop.time()
    done = await env.run(
        agent.probe_process, ProbeInput(job_id="job-long", attempt=1, rank=0, wait_s=60)
    )
    assert (done.state, done.exit_code) == ("exited", 0)
    assert 4.5 < loop.time() - t0 < 7.5

    handle = await env.run(agent.start_process, _start(["sleep 30"], job_id="job-killed"))
    waiting = asyncio.ensure_future(
        env.run(agent.probe_process, ProbeInput(job_id="job-killed", attempt=1, rank=0, wait_s=60))
    )
    await asyncio.sleep(0.3)
    os.killpg(handle.pid, 9)  # no exit code is written: only the group's death ends the wait
    t0 = loop.time()
    killed = await asyncio.wait_for(waiting, 5)
    assert killed.state == "missing" and loop.time() - t0 < 2.5

    await env.run(agent.start_process, _start(["sleep 30"], job_id="job-stopped"))
    cancelled = ActivityEnvironment()
    waiting = asyncio.ensure_future(
        cancelled.run(
            agent.probe_process, ProbeInput(job_id="job-stopped", attempt=1, rank=0, wait_s=60)
        )
    )
    await asyncio.sleep(0.3)
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(waiting, 2)
    await env.run(
        agent.stop_process, StopProcessInput(job_id="job-stopped", attempt=1, rank=0, grace_s=2)
    )


async def test_a_waiting_probe_reads_the_gpus_for_the_metrics_every_so_often(
    tmp_path: Path,
) -> None:
    """A long poll answers once a tick; while it waits, the agent still reads the job's GPUs
    every `sample_every_s` (those readings feed the metrics), and none without it."""
    sampler = FixedSampler()
    env = ActivityEnvironment()
    agent = HostAgent(host_id="sim/h1", state_dir=tmp_path / "agent", sampler=sampler)
    await env.run(agent.start_process, _start(["sleep 30"]))
    probe = ProbeInput(job_id="job-t-1", attempt=1, rank=0, gpu_indices=[2, 3], wait_s=1.0)
    await env.run(agent.probe_process, probe)
    assert len(sampler.runs) == 1  # only the probe's own answer
    agent.sample_every_s = 0.25
    result = await env.run(agent.probe_process, probe)
    assert result.state == "running" and len(result.samples) == 2
    assert len(sampler.runs) >= 1 + 4  # readings while waiting, plus the answer's
    await env.run(
        agent.stop_process, StopProcessInput(job_id="job-t-1", attempt=1, rank=0, grace_s=1)
    )


async def test_a_waiting_probe_answers_when_its_gpus_turned_idle(tmp_path: Path) -> None:
    """A probe that waits reads the GPUs as it waits; with the policy's threshold it answers
    with the readings on either side of each turn, so the monitor knows when the GPU last
    read busy (not only that it reads idle at the end of a long tick)."""
    calls = 0

    def turning(gpu: int) -> float:
        return 90.0 if calls <= 3 else 0.0

    class Counting(FixedSampler):
        def sample(self, run, now):  # type: ignore[no-untyped-def]
            nonlocal calls
            calls += 1
            return super().sample(run, now)

    agent = HostAgent(
        host_id="sim/h1", state_dir=tmp_path / "agent", sampler=Counting(utilization=turning)
    )
    agent.sample_every_s = 0.1
    env = ActivityEnvironment()
    await env.run(agent.start_process, _start(["sleep 30"], gpus=[2]))
    # 3 s at a reading each 0.1 s: room for the four readings kept on a loaded machine
    probe = ProbeInput(job_id="job-t-1", attempt=1, rank=0, gpu_indices=[2], wait_s=3.0)
    plain = await env.run(agent.probe_process, probe)
    assert [s.utilization for s in plain.samples] == [0.0]  # the reading at the end only
    calls = 0
    turned = await env.run(agent.probe_process, probe.model_copy(update={"min_utilization": 30}))
    readings = [s.utilization for s in turned.samples]
    assert readings[:3] == [90.0, 90.0, 0.0] and readings[-1] == 0.0 and len(readings) == 4
    assert [s.ts for s in turned.samples] == sorted(s.ts for s in turned.samples)
    await env.run(
        agent.stop_process, StopProcessInput(job_id="job-t-1", attempt=1, rank=0, grace_s=2)
    )
