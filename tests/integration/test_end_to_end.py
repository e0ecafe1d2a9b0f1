"""The whole path against a real Temporal dev server: real control worker, real host agents
running real processes, the Python client; on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import subprocess
import sys
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio.client import (
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleIntervalSpec,
    ScheduleSpec,
)
from temporalio.testing import WorkflowEnvironment

from gpuflow.client import Client
from gpuflow.control.worker import ControlWorker
from gpuflow.errors import NotFoundError, SpecError, UnschedulableError
from gpuflow.services.capacity import allocations_of
from gpuflow.specs import FleetSpec, JobSpec
from gpuflow.status import JobStatus, TerminationReason
from gpuflow.store.db import Store

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]


def _fleet(name: str, gpus: int = 2) -> FleetSpec:
    return FleetSpec.model_validate(
        {
            "type": "fleet",
            "name": name,
            "kind": "sim",
            "hosts": [
                {
                    "name": "h1",
                    "cpus": 8,
                    "gpus": [{"name": "A100", "memory": "80GB", "count": gpus}],
                }
            ],
        }
    )


def _job(name: str, commands: list[str], **extra: object) -> JobSpec:
    return JobSpec.model_validate(
        {"name": name, "commands": commands, "resources": {"gpu": "A100:1"}, **extra}
    )


async def _wait_for(client: Client, job_id: str, status: JobStatus, timeout: float = 30) -> None:
    for _ in range(int(timeout * 10)):
        if (await client.get(job_id)).status == status:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{job_id} never reached {status}")


async def test_job_runs_logs_and_releases(
    dev_env: WorkflowEnvironment, store: Store, tmp_path: Path
) -> None:
    fleet = f"f{uuid.uuid4().hex[:6]}"
    client = Client(temporal=dev_env.client)
    async with ControlWorker(dev_env.client, store, home=tmp_path):
        await client.apply_fleet(_fleet(fleet))
        job = await client.submit(
            _job(
                "hello",
                [
                    "echo hello rank=$GPUFLOW_NODE_RANK nodes=$GPUFLOW_NODES_NUM",
                    "echo gpus=$CUDA_VISIBLE_DEVICES sim=$GPUFLOW_SIMULATED",
                ],
                fleets=[fleet],
            )
        )
        result = await client.wait(job.id, timeout_s=60)
        output = "".join([chunk async for chunk in client.logs(job.id)])
        info = await client.get(job.id)  # the control worker answers it
    assert result.status == JobStatus.DONE and result.exit_codes == {0: 0}
    assert "hello rank=0 nodes=1" in output
    assert "sim=1" in output and "gpus=" in output
    assert info.status == JobStatus.DONE and info.hosts == ["h1"] and info.gpus == "1xA100"
    assert allocations_of(store, job.id) == []


async def test_stop_kills_the_process_and_frees_the_gpu(
    dev_env: WorkflowEnvironment, store: Store, tmp_path: Path
) -> None:
    fleet = f"f{uuid.uuid4().hex[:6]}"
    pid_file = tmp_path / "pid"
    client = Client(temporal=dev_env.client)
    async with ControlWorker(dev_env.client, store, home=tmp_path):
        await client.apply_fleet(_fleet(fleet, gpus=1))
        job = await client.submit(
            _job("sleeper", [f"echo $$ > {pid_file}", "sleep 300"], fleets=[fleet])
        )
        await _wait_for(client, job.id, JobStatus.RUNNING)
        for _ in range(50):
            if pid_file.exists() and pid_file.read_text().strip():
                break
            await asyncio.sleep(0.1)
        pid = int(pid_file.read_text())
        info = await client.stop(job.id)
    assert info.status == JobStatus.STOPPED
    assert info.reason == TerminationReason.STOPPED_BY_USER.value
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text()
    assert allocations_of(store, job.id) == []


async def test_unschedulable_job_raises_with_reasons(
    dev_env: WorkflowEnvironment, store: Store, tmp_path: Path
) -> None:
    fleet = f"f{uuid.uuid4().hex[:6]}"
    client = Client(temporal=dev_env.client)
    async with ControlWorker(dev_env.client, store, home=tmp_path):
        await client.apply_fleet(_fleet(fleet))
        job = await client.submit(
            JobSpec.model_validate(
                {
                    "name": "huge",
                    "commands": ["true"],
                    "resources": {"gpu": "H100:8"},
                    "fleets": [fleet],
                }
            )
        )
        with pytest.raises(UnschedulableError) as caught:
            await client.wait(job.id, timeout_s=60)
    assert caught.value.reasons
    assert all(reason.startswith("h1: ") for reason in caught.value.reasons)
    assert str(caught.value).startswith("job huge: ")  # the name, from the job's result
    assert "H100" in str(caught.value)


async def test_killed_control_worker_resumes_with_one_process_and_one_allocation(
    dev_env: WorkflowEnvironment, store: Store, tmp_path: Path
) -> None:
    """SIGKILL the control worker process (which also serves the simulated host) while the job
    is pending and again while it runs; a new worker finishes the job."""
    fleet = f"f{uuid.uuid4().hex[:6]}"
    marker = tmp_path / "starts"
    env = {
        **os.environ,
        "GPUFLOW_TEMPORAL_ADDRESS": dev_env.client.service_client.config.target_host,
        "GPUFLOW_DATABASE_URL": store.url,
        "GPUFLOW_HOME": str(tmp_path / "home"),
    }

    def start_worker() -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-m", "gpuflow.control.main"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    client = Client(temporal=dev_env.client)
    worker = start_worker()  # it answers the API: apply and submit go through it
    try:
        await client.apply_fleet(_fleet(fleet))
        job = await client.submit(
            _job(
                "durable",
                [f"echo started >> {marker}", "sleep 25", "echo finished"],
                fleets=[fleet],
            )
        )
        # The job just submitted (placed by the submit itself): its workflow's first steps are
        # in flight on this worker, each lost one retried by the next worker after its timeout
        # (a workflow task 10 s, a start's heartbeat 15 s): a start that had begun is adopted,
        # not repeated, so the job runs long enough to be seen running after that.
        worker.send_signal(signal.SIGKILL)
        worker.wait()
        worker = start_worker()
        await _wait_for(client, job.id, JobStatus.RUNNING, timeout=120)
        worker.send_signal(signal.SIGKILL)
        worker.wait()
        await asyncio.sleep(1.0)
        worker = start_worker()
        result = await client.wait(job.id, timeout_s=90)
    finally:
        worker.terminate()
        worker.wait()
    assert result.status == JobStatus.DONE
    assert marker.read_text().count("started") == 1
    assert allocations_of(store, job.id) == []


async def test_schedule_runs_become_jobs(
    dev_env: WorkflowEnvironment, sqlite_store: Store, tmp_path: Path
) -> None:
    fleet = f"f{uuid.uuid4().hex[:6]}"
    client = Client(temporal=dev_env.client)
    schedule_id = f"nightly-{uuid.uuid4().hex[:6]}"
    async with ControlWorker(dev_env.client, sqlite_store, home=tmp_path):
        await client.apply_fleet(_fleet(fleet))
        created = await client.schedule(
            _job("nightly", ["echo scheduled"], fleets=[fleet]),
            cron="0 3 * * *",
            schedule_id=schedule_id,
        )
        assert created == schedule_id
        await dev_env.client.get_schedule_handle(schedule_id).trigger()
        job_id = None
        for _ in range(100):
            runs = [j for j in await client.jobs(include_finished=True) if j.name == "nightly"]
            if runs and runs[0].status.is_final:
                job_id = runs[0].id
                break
            await asyncio.sleep(0.2)
        # Another team's schedule in the same namespace: neither listed nor deleted by gpuflow.
        theirs = f"backup-{uuid.uuid4().hex[:6]}"
        await dev_env.client.create_schedule(
            theirs,
            Schedule(
                action=ScheduleActionStartWorkflow(
                    "BackupWorkflow", id="backup", task_queue="other-team"
                ),
                spec=ScheduleSpec(intervals=[ScheduleIntervalSpec(every=timedelta(hours=24))]),
            ),
        )
        try:
            listed = await client.schedules()
            with pytest.raises(SpecError, match=f"^schedule {theirs} does not run gpuflow jobs"):
                await client.delete_schedule(theirs)
            await dev_env.client.get_schedule_handle(theirs).describe()  # still there
        finally:  # the dev server is the session's: leave nothing of this test on it
            await dev_env.client.get_schedule_handle(theirs).delete()
        await client.delete_schedule(schedule_id)
        with pytest.raises(NotFoundError, match=f"^no schedule named '{schedule_id}'$"):
            await client.delete_schedule(schedule_id)
        assert job_id is not None and job_id.startswith("job-nightly-")
        assert (await client.get(job_id)).status == JobStatus.DONE
        nightly = _job("nightly", ["true"], fleets=[fleet])
        for cron, refusal in (("@every 5s", "an interval is given with every"), (" ", "empty")):
            with pytest.raises(SpecError, match=refusal):  # as often as every 5 s, else
                await client.schedule(nightly, cron=cron, schedule_id="too-often")
        with pytest.raises(SpecError, match=r"^every is a number of seconds, not '1h'$"):
            await client.schedule(nightly, every_s="1h", schedule_id="too-often")  # type: ignore[arg-type]
    (item,) = [item for item in listed if item["id"] == schedule_id]
    assert (item["job"], item["when"]) == ("nightly", "cron 0 3 * * *")
    assert theirs not in [item["id"] for item in listed]


async def test_fleet_health_marks_a_silent_agent_not_ready_and_back(
    dev_env: WorkflowEnvironment, sqlite_store: Store, tmp_path: Path
) -> None:
    """An ssh-less, non-simulated host whose agent does not poll is marked not_ready by the
    FleetWorkflow; when its agent starts, it is ready again and a waiting job runs there."""
    from gpuflow.agent.activities import HostAgent
    from gpuflow.agent.main import make_agent_worker
    from gpuflow.agent.samplers import sampler_for_host
    from gpuflow.naming import host_task_queue
    from gpuflow.services.fleets import apply_fleet, get_host
    from gpuflow.workflows.handles import watch_fleet

    fleet = f"f{uuid.uuid4().hex[:6]}"
    client = Client(temporal=dev_env.client)
    async with ControlWorker(dev_env.client, sqlite_store, home=tmp_path):
        # The fleet's rows first, its host made one with an agent of its own, and only then
        # its health checks: started earlier, they would serve it a simulated agent.
        apply_fleet(sqlite_store, _fleet(fleet))
        hid = f"{fleet}/h1"
        with sqlite_store.session() as session:
            from gpuflow.store.tables import HostRow

            row = session.get(HostRow, hid)
            assert row is not None
            row.simulated = False
            session.add(row)
            session.commit()
        await watch_fleet(dev_env.client, fleet)
        for _ in range(150):
            host = get_host(sqlite_store, hid)
            if host is not None and host.state == "not_ready":
                break
            await asyncio.sleep(0.2)
        assert host is not None and host.state == "not_ready"
        offers = await client.offers(_job("x", ["true"], fleets=[fleet]))
        assert next(str(r) for r in offers.rejections).startswith(
            "h1: not ready (agent not answering"
        )
        job = await client.submit(
            _job(
                "waits",
                ["echo ran"],
                fleets=[fleet],
                retry={"on_events": ["no-capacity"], "duration": "10m"},
            )
        )
        agent = HostAgent(host_id=hid, state_dir=tmp_path / "agent", sampler=sampler_for_host({}))
        async with make_agent_worker(dev_env.client, agent, host_task_queue(hid)):
            await dev_env.client.get_workflow_handle(f"fleet-{fleet}").signal("refresh")
            result = await client.wait(job.id, timeout_s=60)
        await client.delete_fleet(fleet)
        # Deleting the fleet ends its health checks (the typed `delete` signal), at once.
        checks = dev_env.client.get_workflow_handle(f"fleet-{fleet}")
        await asyncio.wait_for(checks.result(), 30)
    assert result.status == JobStatus.DONE


async def test_secret_value_reaches_the_process_but_never_temporal(
    dev_env: WorkflowEnvironment,
    sqlite_store: Store,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from gpuflow import secrets

    monkeypatch.setenv("GPUFLOW_SECRETS_FILE", str(tmp_path / "secrets.json"))
    value = f"tok-{uuid.uuid4().hex}"
    secrets.set_secret("hf_token", value)
    assert (tmp_path / "secrets.json").stat().st_mode & 0o777 == 0o600
    fleet = f"f{uuid.uuid4().hex[:6]}"
    client = Client(temporal=dev_env.client)
    async with ControlWorker(dev_env.client, sqlite_store, home=tmp_path):
        await client.apply_fleet(_fleet(fleet))
        job = await client.submit(
            _job(
                "secretive",
                ['echo "token=$HF_TOKEN"', 'printf %s "$HF_TOKEN" | sha256sum'],
                fleets=[fleet],
                env={"HF_TOKEN": "${{ secrets.hf_token }}"},
            )
        )
        result = await client.wait(job.id, timeout_s=60)
        output = "".join([chunk async for chunk in client.logs(job.id)])
        # A secret the control plane does not have: refused at submit, nothing started.
        with pytest.raises(SpecError, match=r"^env: no secret named absent \(gpuflow secret"):
            await client.submit(
                _job("nosecret", ["true"], fleets=[fleet], env={"X": "${{ secrets.absent }}"})
            )
        assert [j for j in await client.jobs(include_finished=True) if j.name == "nosecret"] == []
        history = await dev_env.client.get_workflow_handle(job.id).fetch_history()
    assert result.status == JobStatus.DONE
    assert "token=***" in output and value not in output  # masked by the agent
    assert hashlib.sha256(value.encode()).hexdigest() in output  # yet the process had it
    assert value.encode() not in b"".join(e.SerializeToString() for e in history.events)


async def test_logs_and_metrics_of_an_unreachable_job_are_one_line_errors(
    dev_env: WorkflowEnvironment, sqlite_store: Store, tmp_path: Path
) -> None:
    """A job whose host agent is gone and whose workflow Temporal no longer has: `logs` and
    `metrics` say so in one line (the CLI prints it), they do not hang or raise a traceback."""
    from sqlmodel import Session

    from gpuflow.errors import GpuflowError
    from gpuflow.store.tables import FleetRow, HostRow, JobRow

    fleet = f"ghost{uuid.uuid4().hex[:6]}"
    with Session(sqlite_store.engine) as session:
        session.add(FleetRow(name=fleet, kind="ssh"))
        session.add(
            HostRow(
                id=f"{fleet}/gh1",
                fleet=fleet,
                name=f"{fleet}-gh1",
                state="ready",
                task_queue=f"gpuflow-host-{fleet}/gh1",
            )
        )
        session.add(
            JobRow(id=f"job-{fleet}-abc123", name=fleet, status="done", hosts=[f"{fleet}-gh1"])
        )
        session.commit()
    client = Client(temporal=dev_env.client)
    async with ControlWorker(dev_env.client, sqlite_store, home=tmp_path):
        with pytest.raises(GpuflowError) as metrics:
            await client.metrics(fleet)
        with pytest.raises(GpuflowError) as logs:
            async for _ in client.logs(fleet):
                pass
    for error in (metrics.value, logs.value):
        assert "\n" not in str(error)
    assert str(metrics.value).startswith(f"job {fleet}: cannot read its GPU metrics")
    assert str(logs.value).startswith(f"job {fleet}: cannot read the log of node 0 from its host")
    assert str(logs.value).endswith("is the host's agent running?")


async def test_jobs_start_eagerly_on_the_embedded_stack_only(
    dev_env: WorkflowEnvironment, sqlite_store: Store, tmp_path: Path
) -> None:
    """On the embedded stack the control worker is the only one: a job's first workflow task
    comes back in the answer to its start (eager start). A control worker of a cluster, one of
    several, leaves it to the task queue, so jobs spread over all of them."""
    from gpuflow.config import TemporalConfig
    from gpuflow.control.embedded import control_plane

    address = dev_env.client.service_client.config.target_host
    fleet = f"f{uuid.uuid4().hex[:6]}"
    client = Client(temporal=dev_env.client)
    config = TemporalConfig(address=address, namespace=dev_env.client.namespace, embedded=True)
    eager: list[bool] = []
    for plane in (
        control_plane(config, sqlite_store, home=tmp_path, local_agent=False),
        ControlWorker(dev_env.client, sqlite_store, home=tmp_path),
    ):
        async with plane:
            await client.apply_fleet(_fleet(fleet))
            job = await client.submit(_job("eager", ["true"], fleets=[fleet]))
            assert (await client.wait(job.id, timeout_s=60)).status == JobStatus.DONE
        history = await dev_env.client.get_workflow_handle(job.id).fetch_history()
        started = history.events[0].workflow_execution_started_event_attributes
        eager.append(started.eager_execution_accepted)
    assert eager == [True, False]
