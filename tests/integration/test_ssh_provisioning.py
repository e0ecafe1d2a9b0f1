"""SSH provisioning against a real OpenSSH server on 127.0.0.1 (fixture: tests/sshd/fixture.py).

The "remote" host is this machine: its interpreter is this test run's Python with the repository
on its path, so the code that runs over SSH is the code under test.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import pickle
import signal
import socket
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from gpuflow.ssh import agents as ssh
from gpuflow.ssh.provisioning import (
    AgentStatus,
    ProvisioningError,
    ProvisioningProblem,
    SshTarget,
    ensure_ssh_agent,
    gpuflow_known_hosts,
    ssh_host_facts,
    stop_ssh_agent,
)
from tests.sshd.fixture import SshServer, generate_key

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]

# stands in for the agent until a test needs the real one: long-running, harmless, and it
# carries the host id so that the test can count its processes
SLEEPER = (
    "{python}", "-c", "import time; time.sleep(600)",
    "--host-id", "{host_id}", "--namespace", "{namespace}", "--state-dir", "{state_dir}",
)  # fmt: skip
AGENT_ARGS = {"temporal_address": "127.0.0.1:7233", "namespace": "default", "task_queue": "q"}


@pytest.fixture(scope="session")
def host_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The host's interpreter: this Python, with gpuflow importable from the repository."""
    wrapper = tmp_path_factory.mktemp("host") / "python"
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH="{REPO}" exec "{sys.executable}" "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper)


@pytest.fixture(autouse=True)
def gpuflow_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "gpuflow-home"
    monkeypatch.setenv("GPUFLOW_HOME", str(home))
    return home


@pytest.fixture
def target(sshd: SshServer, host_python: str) -> SshTarget:
    return SshTarget(
        host_id=f"ssh-test/box-{uuid.uuid4().hex[:8]}",
        hostname=sshd.host,
        port=sshd.port,
        user=sshd.user,
        identity_file=sshd.identity_file,
        python=host_python,
        connect_timeout=5,
    )


@pytest.fixture
def state_dir(tmp_path: Path) -> Iterator[str]:
    """The agent's state dir; whatever agent a failed test left behind is killed."""
    path = tmp_path / "agent-state"
    yield str(path)
    pidfile = path / "agent.pid"
    if pidfile.exists():
        pid = json.loads(pidfile.read_text())["pid"]
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)


@pytest.fixture
def secrets(sshd: SshServer) -> list[str]:
    """Private key material that must never show up: the whole file and each base64 line."""
    text = Path(sshd.identity_file).read_text()
    lines = [line for line in text.splitlines() if line and not line.startswith("-----")]
    return [text, *lines]


def processes_with(marker: str) -> list[int]:
    """Live processes whose command line mentions `marker` (zombies have none)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline:
            pids.append(int(entry.name))
    return pids


def assert_no_secret(text: str, secrets: list[str]) -> None:
    for secret in secrets:
        assert secret not in text


# --- facts ------------------------------------------------------------------------------------


async def test_facts_are_collected_over_ssh(target: SshTarget, sshd: SshServer) -> None:
    facts = await ssh_host_facts(target)

    assert facts.os == "linux"
    assert facts.cpus == os.cpu_count()
    assert facts.memory_mib > 0
    # first contact remembers the host key (accept-new)
    assert f"[{sshd.host}]:{sshd.port} {sshd.host_public_key}" in gpuflow_known_hosts().read_text()


# --- the agent --------------------------------------------------------------------------------


async def test_agent_starts_once_and_stops(
    target: SshTarget, state_dir: str, secrets: list[str]
) -> None:
    first = await ensure_ssh_agent(target, state_dir=state_dir, agent_command=SLEEPER, **AGENT_ARGS)
    second = await ensure_ssh_agent(
        target, state_dir=state_dir, agent_command=SLEEPER, **AGENT_ARGS
    )

    assert first.started and not second.started
    assert second.pid == first.pid
    assert processes_with(target.host_id) == [first.pid]
    assert first.log_path == str(Path(state_dir) / "agent.log")
    assert_no_secret(first.model_dump_json(), secrets)

    stopped = await stop_ssh_agent(target, state_dir=state_dir)
    again = await stop_ssh_agent(target, state_dir=state_dir)

    assert stopped.stopped and stopped.pid == first.pid
    assert not again.stopped and again.pid is None
    assert processes_with(target.host_id) == []


async def test_concurrent_ensures_start_one_agent(target: SshTarget, state_dir: str) -> None:
    statuses: list[AgentStatus] = await asyncio.gather(
        *(
            ensure_ssh_agent(target, state_dir=state_dir, agent_command=SLEEPER, **AGENT_ARGS)
            for _ in range(3)
        )
    )

    assert sorted(status.started for status in statuses) == [False, False, True]
    assert len({status.pid for status in statuses}) == 1
    assert processes_with(target.host_id) == [statuses[0].pid]
    await stop_ssh_agent(target, state_dir=state_dir)


async def test_agent_with_another_command_is_replaced(target: SshTarget, state_dir: str) -> None:
    old = await ensure_ssh_agent(target, state_dir=state_dir, agent_command=SLEEPER, **AGENT_ARGS)
    new = await ensure_ssh_agent(
        target, state_dir=state_dir, agent_command=SLEEPER, **{**AGENT_ARGS, "namespace": "prod"}
    )

    assert new.started and new.replaced_pid == old.pid
    assert processes_with(target.host_id) == [new.pid]
    await stop_ssh_agent(target, state_dir=state_dir)


async def test_agent_that_exits_at_once_is_reported(target: SshTarget, state_dir: str) -> None:
    crashing = ("{python}", "-c", "import sys; print('bad temporal address'); sys.exit(3)")

    with pytest.raises(ProvisioningError) as caught:
        await ensure_ssh_agent(target, state_dir=state_dir, agent_command=crashing, **AGENT_ARGS)

    assert caught.value.problem is ProvisioningProblem.AGENT_EXITED
    assert "bad temporal address" in str(caught.value)
    assert not (Path(state_dir) / "agent.pid").exists()


async def test_state_dir_of_another_host_is_refused(target: SshTarget, state_dir: str) -> None:
    await ensure_ssh_agent(target, state_dir=state_dir, agent_command=SLEEPER, **AGENT_ARGS)
    other = target.model_copy(update={"host_id": "ssh-test/other"})

    with pytest.raises(ProvisioningError) as caught:
        await ensure_ssh_agent(other, state_dir=state_dir, agent_command=SLEEPER, **AGENT_ARGS)

    assert caught.value.problem is ProvisioningProblem.STATE_DIR_IN_USE
    assert len(processes_with(target.host_id)) == 1
    await stop_ssh_agent(target, state_dir=state_dir)


async def test_tls_files_reach_the_host_and_the_agent_names_them(
    target: SshTarget, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control worker's CA, client certificate and key and API key are copied to the host
    (mode 0600) and the agent's command names those copies; the key is in no command line. A
    rotated file restarts the agent, an unchanged one does not."""
    api_key = f"key-{uuid.uuid4().hex}"
    local = tmp_path / "control-tls"
    local.mkdir()
    for name in ("ca.pem", "client.pem", "client.key"):
        (local / name).write_text(f"-----BEGIN {name}-----\n")
    for variable in ("TLS", "TLS_SERVER_NAME", "API_KEY_FILE"):
        monkeypatch.delenv(f"GPUFLOW_TEMPORAL_{variable}", raising=False)
    monkeypatch.delenv("GPUFLOW_AGENT_TEMPORAL_ADDRESS", raising=False)
    monkeypatch.delenv("GPUFLOW_AGENT_TEMPORAL_TLS_SERVER_NAME", raising=False)
    monkeypatch.setenv("GPUFLOW_TEMPORAL_ADDRESS", "127.0.0.1:7233")
    monkeypatch.setenv("GPUFLOW_TEMPORAL_TLS_CA", str(local / "ca.pem"))
    monkeypatch.setenv("GPUFLOW_TEMPORAL_TLS_CERT", str(local / "client.pem"))
    monkeypatch.setenv("GPUFLOW_TEMPORAL_TLS_KEY", str(local / "client.key"))
    monkeypatch.setenv("GPUFLOW_TEMPORAL_API_KEY", api_key)
    # the sleeper stands in for the agent; the TLS flags are appended to any command
    monkeypatch.setattr(
        ssh, "ensure_ssh_agent", functools.partial(ensure_ssh_agent, agent_command=SLEEPER)
    )
    state_dir = tmp_path / "remote"
    host = SimpleNamespace(
        id=target.host_id,
        ssh={
            "hostname": target.hostname,
            "port": target.port,
            "user": target.user,
            "identity_file": target.identity_file,
            "python": target.python,
            "state_dir": str(state_dir),
        },
    )
    agent_dir = state_dir / target.host_id.replace("/", "_")
    pidfile = agent_dir / "agent.pid"
    try:
        assert await ssh.ensure_host_agent(host.id, host.ssh) is None
        first = json.loads(pidfile.read_text())
        copies = {path.name: path for path in (agent_dir / "temporal").iterdir()}
        assert sorted(copies) == ["api-key", "ca.pem", "client.key", "client.pem"]
        for name, path in copies.items():
            assert path.stat().st_mode & 0o777 == 0o600, name
        assert copies["api-key"].read_text() == api_key
        assert copies["client.key"].read_bytes() == (local / "client.key").read_bytes()
        argv = first["argv"]
        flags = {"--tls-ca": "ca.pem", "--tls-cert": "client.pem", "--tls-key": "client.key"}
        for flag, name in {**flags, "--api-key-file": "api-key"}.items():
            assert argv[argv.index(flag) + 1] == str(copies[name])
        assert api_key not in pidfile.read_text()
        cmdline = Path(f"/proc/{first['pid']}/cmdline").read_bytes()
        assert b"--api-key-file" in cmdline and api_key.encode() not in cmdline

        assert await ssh.ensure_host_agent(host.id, host.ssh) is None
        assert json.loads(pidfile.read_text())["pid"] == first["pid"]  # nothing changed

        (local / "ca.pem").write_text("-----BEGIN rotated ca.pem-----\n")
        assert await ssh.ensure_host_agent(host.id, host.ssh) is None
        rotated = json.loads(pidfile.read_text())
        assert rotated["pid"] != first["pid"] and rotated["argv"] == argv
        assert copies["ca.pem"].read_text() == "-----BEGIN rotated ca.pem-----\n"
        assert processes_with(target.host_id) == [rotated["pid"]]
    finally:
        await stop_ssh_agent(target, state_dir=str(agent_dir))


# --- what the user must fix -------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def failure(target: SshTarget, state_dir: str = "/tmp/gpuflow-unused") -> ProvisioningError:
    """The error of a cheap round trip (stopping an agent that does not run)."""
    with pytest.raises(ProvisioningError) as caught:
        await stop_ssh_agent(target, state_dir=state_dir)
    error = caught.value
    assert error.host_id == target.host_id
    assert target.host_id in str(error) and "\n" not in str(error)
    return error


async def test_wrong_port_is_unreachable(target: SshTarget, secrets: list[str]) -> None:
    error = await failure(target.model_copy(update={"port": free_port()}))

    assert error.problem is ProvisioningProblem.CONNECTION_REFUSED
    assert error.problem.retryable
    assert "unreachable: connection refused" in str(error)
    assert_no_secret(str(error), secrets)


async def test_silent_server_times_out(target: SshTarget) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        silent = target.model_copy(
            update={"port": listener.getsockname()[1], "connect_timeout": 0.5}
        )
        error = await failure(silent)

    assert error.problem is ProvisioningProblem.UNREACHABLE
    assert "no SSH login within 0.5 s" in str(error)


async def test_wrong_key_is_an_auth_error(
    target: SshTarget, tmp_path: Path, secrets: list[str]
) -> None:
    stranger = generate_key(tmp_path / "stranger")
    error = await failure(target.model_copy(update={"identity_file": str(stranger)}))

    assert error.problem is ProvisioningProblem.AUTH_FAILED
    assert not error.problem.retryable
    assert str(stranger) in str(error) and "authorized_keys" in str(error)
    assert_no_secret(str(error), [*secrets, stranger.read_text()])


async def test_missing_identity_file_is_named(target: SshTarget, tmp_path: Path) -> None:
    error = await failure(target.model_copy(update={"identity_file": str(tmp_path / "nokey")}))

    assert error.problem is ProvisioningProblem.IDENTITY_FILE
    assert "nokey" in str(error)


async def test_changed_host_key_is_refused(
    target: SshTarget, sshd: SshServer, tmp_path: Path
) -> None:
    await stop_ssh_agent(target, state_dir=str(tmp_path / "state"))  # remembers the key
    impostor = generate_key(tmp_path / "impostor").with_suffix(".pub").read_text().split()[:2]
    store = gpuflow_known_hosts()
    store.write_text(f"[{sshd.host}]:{sshd.port} {' '.join(impostor)}\n")

    error = await failure(target)

    assert error.problem is ProvisioningProblem.HOST_KEY_MISMATCH
    assert "changed since gpuflow first saw it" in str(error) and str(store) in str(error)


async def test_given_known_hosts_is_strict(
    target: SshTarget, sshd: SshServer, tmp_path: Path
) -> None:
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(sshd.known_hosts_line())
    strict = target.model_copy(update={"known_hosts": str(known_hosts)})
    assert not (await stop_ssh_agent(strict, state_dir=str(tmp_path / "state"))).stopped

    known_hosts.write_text("")
    error = await failure(strict)

    assert error.problem is ProvisioningProblem.HOST_KEY_MISMATCH
    assert str(known_hosts) in str(error)
    assert not gpuflow_known_hosts().exists()


async def test_missing_python_is_named(target: SshTarget) -> None:
    error = await failure(target.model_copy(update={"python": "/nonexistent/python3"}))

    assert error.problem is ProvisioningProblem.PYTHON_MISSING
    assert "/nonexistent/python3" in str(error)


async def test_missing_gpuflow_is_named(target: SshTarget, tmp_path: Path) -> None:
    # -I -S: no site-packages, no PYTHONPATH, no current directory, hence no gpuflow
    bare = tmp_path / "bare-python"
    bare.write_text(f'#!/bin/sh\nexec "{sys.executable}" -I -S "$@"\n')
    bare.chmod(0o755)
    bare_target = target.model_copy(update={"python": str(bare)})

    with pytest.raises(ProvisioningError) as agent_error:
        await ensure_ssh_agent(bare_target, state_dir=str(tmp_path / "state"), **AGENT_ARGS)
    with pytest.raises(ProvisioningError) as facts_error:
        await ssh_host_facts(bare_target)

    for caught in (agent_error, facts_error):
        assert caught.value.problem is ProvisioningProblem.GPUFLOW_MISSING
        assert "pip install gpuflow" in str(caught.value)


# --- the models -------------------------------------------------------------------------------


def test_a_key_in_place_of_a_path_is_refused_without_echo(secrets: list[str]) -> None:
    with pytest.raises(ValidationError) as caught:
        SshTarget(host_id="h", hostname="127.0.0.1", identity_file=secrets[0])

    assert "path of a key file" in str(caught.value)
    assert_no_secret(str(caught.value), secrets)


def test_provisioning_error_survives_pickling() -> None:
    error = ProvisioningError("host h: no", host_id="h", problem=ProvisioningProblem.AUTH_FAILED)

    copy = pickle.loads(pickle.dumps(error))

    assert (str(copy), copy.host_id, copy.problem) == ("host h: no", "h", error.problem)


async def test_facts_gpuflow_cannot_read_are_an_error(target: SshTarget) -> None:
    with pytest.raises(ProvisioningError) as caught:
        await ssh_host_facts(target, command=("{python}", "-c", "print('no facts here')"))

    assert caught.value.problem is ProvisioningProblem.REMOTE_COMMAND_FAILED
    assert "same gpuflow version" in str(caught.value)
