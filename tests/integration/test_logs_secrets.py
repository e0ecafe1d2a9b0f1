"""Against a real Temporal dev server: a secret a job prints never reaches any Temporal history
through `logs` or `logs -f`, a follow uses one log reader workflow, and no reader is left behind
after either."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import WorkflowHistory
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import WorkflowEnvironment

from gpuflow import log_reader
from gpuflow.client import Client
from gpuflow.control.worker import ControlWorker
from gpuflow.specs import FleetSpec, JobSpec
from gpuflow.status import JobStatus
from gpuflow.store.db import Store

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]


def _fleet(name: str) -> FleetSpec:
    return FleetSpec.model_validate(
        {
            "type": "fleet",
            "name": name,
            "kind": "sim",
            "hosts": [
                {"name": "h1", "cpus": 8, "gpus": [{"name": "A100", "memory": "80GB", "count": 1}]}
            ],
        }
    )


@contextlib.asynccontextmanager
async def _running(
    dev_env: WorkflowEnvironment, store: Store, home: Path
) -> AsyncIterator[tuple[Client, str]]:
    """A control worker and a one-host sim fleet of the test's own: the client, the fleet."""
    fleet = f"f{uuid.uuid4().hex[:6]}"
    client = Client(temporal=dev_env.client)
    async with ControlWorker(dev_env.client, store, home=home):
        await client.apply_fleet(_fleet(fleet))
        yield client, fleet


def _job(name: str, fleet: str, commands: list[str], **fields: object) -> JobSpec:
    """A job of one A100 on `fleet`; `env`: HF_TOKEN from the secret hf_token unless given."""
    return JobSpec.model_validate(
        {
            "name": name,
            "fleets": [fleet],
            "resources": {"gpu": "A100:1"},
            "env": {"HF_TOKEN": "${{ secrets.hf_token }}"},
            "commands": commands,
            **fields,
        }
    )


def _raw(history: WorkflowHistory) -> bytes:
    """Every byte of a history, payloads as they are stored (its JSON form has them base64)."""
    return b"".join(event.SerializeToString() for event in history.events)


async def _gone(env: WorkflowEnvironment, workflow_id: str) -> bool:
    """Whether Temporal no longer has the workflow (deletion is asynchronous: wait a little)."""
    for _ in range(50):
        try:
            await env.client.get_workflow_handle(workflow_id).describe()
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:
                return True
            raise
        await asyncio.sleep(0.2)
    return False


async def test_secret_printed_by_a_job_never_reaches_temporal_through_logs(
    dev_env: WorkflowEnvironment,
    sqlite_store: Store,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from gpuflow import secrets

    monkeypatch.setenv("GPUFLOW_SECRETS_FILE", str(tmp_path / "secrets.json"))
    value = f"tok-{uuid.uuid4().hex}"
    secrets.set_secret("hf_token", value)
    started: list[str] = []
    original = log_reader.LogReader._start

    async def spy(self: log_reader.LogReader) -> Any:
        handle = await original(self)
        started.append(handle.id)
        return handle

    retired: list[bytes] = []  # the readers' histories just before their deletion
    original_retire = log_reader.LogReader._retire

    async def retire_spy(self: log_reader.LogReader) -> None:
        if self._handle is not None:
            try:
                retired.append(_raw(await self._handle.fetch_history()))
            except RPCError as error:  # a reader already gone (it ended on its own) holds nothing
                if error.status != RPCStatusCode.NOT_FOUND:
                    raise
        await original_retire(self)

    monkeypatch.setattr(log_reader.LogReader, "_start", spy)
    monkeypatch.setattr(log_reader.LogReader, "_retire", retire_spy)
    async with _running(dev_env, sqlite_store, tmp_path) as (client, fleet):
        job = await client.submit(
            _job(
                "leaky",
                fleet,
                [
                    "echo start",
                    "sleep 1.5",
                    'echo "token=$HF_TOKEN"',
                    'printf "half=%s" "${HF_TOKEN:0:12}"',
                    "sleep 1.5",
                    'printf "%s\\n" "${HF_TOKEN:12}"',
                    'printf %s "$HF_TOKEN" | sha256sum',
                    "sleep 1",
                    "echo done",
                ],
            )
        )
        followed = "".join([chunk async for chunk in client.logs(job.id, follow=True)])
        follow_readers = list(started)
        result = await client.wait(job.id, timeout_s=60)
        plain = "".join([chunk async for chunk in client.logs(job.id)])
        readers = list(started)
        histories = []
        async for execution in dev_env.client.list_workflows():
            handle = dev_env.client.get_workflow_handle(execution.id, run_id=execution.run_id)
            try:
                histories.append((execution.id, _raw(await handle.fetch_history())))
            except RPCError as error:  # visibility still lists a reader just deleted: its
                if error.status != RPCStatusCode.NOT_FOUND:  # history was read in `retired`
                    raise
    assert result.status == JobStatus.DONE
    digest = hashlib.sha256(value.encode()).hexdigest()
    for output in (followed, plain):
        assert value not in output and value[:12] not in output
        assert output.splitlines() == ["start", "token=***", "half=***", f"{digest}  -", "done"]
    assert len(follow_readers) == 1 and len(readers) == 2
    assert len(retired) == 2 and all(b"token=***" in raw for raw in retired)
    assert not any(value.encode() in raw for raw in retired)  # masked before entering Temporal
    for reader in readers:
        assert await _gone(dev_env, reader), f"{reader} left in Temporal"
    assert any(workflow_id == job.id and b"hf_token" in raw for workflow_id, raw in histories)
    leaked = [workflow_id for workflow_id, raw in histories if value.encode() in raw]
    assert leaked == []


async def _readers_of(env: WorkflowEnvironment, job_id: str) -> set[str]:
    query = 'WorkflowType = "LogReaderWorkflow"'
    return {
        e.id async for e in env.client.list_workflows(query) if e.id.startswith(f"logs-{job_id}-")
    }


async def test_an_interrupted_cli_follow_leaves_no_reader_behind(
    dev_env: WorkflowEnvironment,
    sqlite_store: Store,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`gpuflow logs -f` as a user runs it, stopped with Ctrl-C mid-follow: one reader while it
    runs, none after."""
    import os
    import signal
    import sys

    fleet = f"f{uuid.uuid4().hex[:6]}"
    client = Client(temporal=dev_env.client)
    env = {
        **os.environ,
        "GPUFLOW_HOME": str(tmp_path / "home"),
        "GPUFLOW_DATABASE_URL": sqlite_store.url,
        "GPUFLOW_TEMPORAL_ADDRESS": dev_env.client.service_client.config.target_host,
    }
    async with ControlWorker(dev_env.client, sqlite_store, home=tmp_path):
        await client.apply_fleet(_fleet(fleet))
        job = await client.submit(
            JobSpec.model_validate(
                {
                    "name": "chatty",
                    "fleets": [fleet],
                    "resources": {"gpu": "A100:1"},
                    "commands": ["for i in $(seq 60); do echo tick $i; sleep 0.5; done"],
                }
            )
        )
        follow = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "gpuflow",
            "logs",
            "-f",
            job.id,
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        assert follow.stdout is not None
        seen = b""
        while b"tick 6\n" not in seen:
            seen += await asyncio.wait_for(follow.stdout.read(100), 60)
        during: set[str] = set()
        for _ in range(25):  # visibility follows the start closely, not at once
            during = await _readers_of(dev_env, job.id)
            if during:
                break
            await asyncio.sleep(0.2)
        follow.send_signal(signal.SIGINT)
        rest, _ = await asyncio.wait_for(follow.communicate(), 30)
        after: set[str] = set()
        for _ in range(50):
            after = await _readers_of(dev_env, job.id)
            if not after:
                break
            await asyncio.sleep(0.2)
        await client.stop(job.id)
    assert follow.returncode == 130, (seen + rest).decode()
    assert len(during) == 1, during
    assert after == set()
    assert await _gone(dev_env, during.pop())


async def test_a_broken_secrets_file_fails_the_job_once_naming_the_file(
    dev_env: WorkflowEnvironment,
    sqlite_store: Store,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from gpuflow.status import TerminationReason

    path = tmp_path / "secrets.json"
    path.write_text('{"hf_token": "tok-')  # cut short
    monkeypatch.setenv("GPUFLOW_SECRETS_FILE", str(path))
    async with _running(dev_env, sqlite_store, tmp_path) as (client, fleet):
        job = await client.submit(
            _job(
                "brokensecrets",
                fleet,
                ["true"],
                retry={"on_events": ["interruption", "error"], "duration": "1h"},
            )
        )
        result = await client.wait(job.id, timeout_s=60)
    assert result.status == JobStatus.FAILED
    assert result.reason == TerminationReason.START_FAILED  # not host_lost, not retried
    assert f"secrets file {path} is not valid JSON" in (result.message or "")
    assert result.attempts == 1


async def test_an_earlier_attempts_output_is_read_with_its_secrets_masked(
    dev_env: WorkflowEnvironment,
    sqlite_store: Store,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A job that retried keeps each attempt's output on the host that ran it: `logs` reads
    the current attempt's, `logs --attempt 1` the first one's, masked as the current one is."""
    from gpuflow import secrets
    from gpuflow.errors import NotFoundError

    monkeypatch.setenv("GPUFLOW_SECRETS_FILE", str(tmp_path / "secrets.json"))
    value = f"tok-{uuid.uuid4().hex}"
    secrets.set_secret("hf_token", value)
    async with _running(dev_env, sqlite_store, tmp_path) as (client, fleet):
        job = await client.submit(
            _job(
                "flaky",
                fleet,
                [
                    'echo "attempt $GPUFLOW_ATTEMPT token=$HF_TOKEN"',
                    'test "$GPUFLOW_ATTEMPT" -ge 2 || exit 3',
                ],
                retry={"on_events": ["error"], "duration": "10m"},
            )
        )
        result = await client.wait(job.id, timeout_s=90)
        current = "".join([chunk async for chunk in client.logs(job.id)])
        first = "".join([chunk async for chunk in client.logs(job.id, attempt=1)])
        also_current = "".join([chunk async for chunk in client.logs(job.id, attempt=2)])
        with pytest.raises(NotFoundError, match="has no attempt 3: it has had 2 attempts"):
            async for _ in client.logs(job.id, attempt=3):
                pass
    assert (result.status, result.attempts) == (JobStatus.DONE, 2)
    assert first == "attempt 1 token=***\n"
    assert current == also_current == "attempt 2 token=***\n"
    assert value not in first + current


async def test_a_job_followed_while_it_retries_shows_every_attempts_output(
    dev_env: WorkflowEnvironment,
    sqlite_store: Store,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`logs -f` from the first attempt on: attempt 1's last line, written just before it
    failed, and attempt 2's first, came too late or were read at the wrong offset."""
    from gpuflow import secrets

    monkeypatch.setenv("GPUFLOW_SECRETS_FILE", str(tmp_path / "secrets.json"))
    secrets.set_secret("hf_token", f"tok-{uuid.uuid4().hex}")
    async with _running(dev_env, sqlite_store, tmp_path) as (client, fleet):
        job = await client.submit(
            _job(
                "twice",
                fleet,
                [
                    'echo "attempt $GPUFLOW_ATTEMPT begins"',
                    "sleep 2",
                    'echo "attempt $GPUFLOW_ATTEMPT ends"',
                    'test "$GPUFLOW_ATTEMPT" -ge 2 || exit 3',
                ],
                retry={"on_events": ["error"], "duration": "10m"},
            )
        )
        followed = "".join([chunk async for chunk in client.logs(job.id, follow=True)])
        result = await client.wait(job.id, timeout_s=90)
    assert (result.status, result.attempts) == (JobStatus.DONE, 2)
    assert followed == ("attempt 1 begins\nattempt 1 ends\nattempt 2 begins\nattempt 2 ends\n")
