"""Host agents over TLS: the agent's flags become its TemporalConfig, provisioning passes them
only when set, and the control worker hands an ssh host its TLS files and API key as files,
never as a command-line word, a log line or a message."""

from __future__ import annotations

import json
import logging
import socket
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gpuflow.agent import main as agent
from gpuflow.agent.main import parse_args, temporal_config
from gpuflow.config import TEMPORAL_VARIABLES
from gpuflow.errors import SpecError
from gpuflow.ssh import agents as ssh
from gpuflow.ssh import provisioning
from gpuflow.ssh.provisioning import AGENT_COMMAND, SshTarget, ensure_ssh_agent

API_KEY = "gpuflow-agent-test-key-5d2e81"
REQUIRED = ["--host-id", "gpu-a/node-1", "--temporal-address", "127.0.0.1:7233"]
REQUIRED += ["--state-dir", "/tmp/gpuflow-unused"]
VARIABLES = (
    *TEMPORAL_VARIABLES,
    "GPUFLOW_AGENT_TEMPORAL_ADDRESS",
    "GPUFLOW_AGENT_TEMPORAL_TLS_SERVER_NAME",
)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GPUFLOW_HOME", str(tmp_path / "home"))  # no secrets.json


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


# ---- the agent's flags -----------------------------------------------------------------------


def test_no_tls_flags_is_plaintext() -> None:
    config = temporal_config(parse_args(REQUIRED))

    assert not config.embedded and not config.uses_tls
    assert (config.tls_ca, config.tls_cert, config.tls_key, config.api_key_file) == (None,) * 4


def test_flags_map_onto_the_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    args = parse_args(
        [
            *REQUIRED,
            "--tls-ca", "~/ca.pem",
            "--tls-cert", "/etc/gpuflow/tls/agent.pem",
            "--tls-key", "/etc/gpuflow/tls/agent.key",
            "--tls-server-name", "temporal.internal",
            "--api-key-file", "/run/credentials/gpuflow/temporal-api-key",
            "--namespace", "gpuflow",
        ]
    )  # fmt: skip
    config = temporal_config(args)

    assert config.uses_tls and config.tls is None
    assert config.tls_ca == tmp_path / "ca.pem"
    assert config.tls_cert == Path("/etc/gpuflow/tls/agent.pem")
    assert config.tls_key == Path("/etc/gpuflow/tls/agent.key")
    assert config.tls_server_name == "temporal.internal"
    assert config.api_key_file == Path("/run/credentials/gpuflow/temporal-api-key")
    assert config.api_key is None and config.namespace == "gpuflow"


@pytest.mark.parametrize(("flag", "tls"), [("--tls", True), ("--no-tls", False)])
def test_tls_can_be_forced_either_way(flag: str, tls: bool) -> None:
    config = temporal_config(parse_args([*REQUIRED, flag]))

    assert config.tls is tls and config.uses_tls is tls


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--tls-cert", "/c.pem"],
            "--tls-cert is set but --tls-key is not; mTLS needs both the client certificate "
            "and its key",
        ),
        (
            ["--tls-key", "/c.key"],
            "--tls-key is set but --tls-cert is not; mTLS needs both the client certificate "
            "and its key",
        ),
        (["--no-tls", "--tls-ca", "/ca.pem"], "--no-tls is given but --tls-ca is set"),
    ],
)
def test_contradictions_are_one_line_in_the_words_of_the_flags(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert agent.main([*REQUIRED, *flags]) == 1

    err = capsys.readouterr().err
    assert err.startswith(f"error: {message}") and err.count("\n") == 1
    assert "GPUFLOW_TEMPORAL" not in err


def test_unreadable_file_names_the_flag_and_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nope.pem"
    assert agent.main([*REQUIRED, "--tls-ca", str(missing)]) == 1

    err = capsys.readouterr().err
    assert err == f"error: --tls-ca: cannot read {missing} (No such file or directory)\n"


@pytest.mark.parametrize("form", [["--api-key", API_KEY], [f"--api-key={API_KEY}"]])
def test_there_is_no_api_key_flag_and_the_value_is_not_echoed(
    form: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as caught:
        parse_args([*REQUIRED, *form])

    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert "--api-key is not taken" in err and "--api-key-file" in err
    assert API_KEY not in err


def test_api_key_from_its_file_stays_out_of_errors_and_logs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    key_file = tmp_path / "api-key"
    key_file.write_text(API_KEY + "\n")
    port = _free_port()  # nothing listens there
    argv = [*REQUIRED[:2], "--temporal-address", f"127.0.0.1:{port}", *REQUIRED[4:]]

    config = temporal_config(parse_args([*argv, "--api-key-file", str(key_file)]))
    with caplog.at_level(logging.DEBUG):
        code = agent.main([*argv, "--api-key-file", str(key_file)])

    assert API_KEY not in repr(config)
    assert code == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: cannot reach Temporal at 127.0.0.1:{port} over TLS (")
    assert err.rstrip().endswith("check --temporal-address and the --tls* flags")
    assert err.count("\n") == 1
    assert API_KEY not in err and API_KEY not in caplog.text


# ---- the command line provisioning builds ----------------------------------------------------


TARGET = SshTarget(host_id="gpu-a/node-1", hostname="127.0.0.1", port=2222, python="python3")
BASE = {"temporal_address": "127.0.0.1:7233", "namespace": "default", "task_queue": "q"}


@pytest.fixture
def requests(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """What ensure_ssh_agent would send to the host, answered as if the agent had started."""
    sent: list[dict[str, Any]] = []

    async def answer(target: SshTarget, request: dict[str, Any]) -> dict[str, Any]:
        sent.append(json.loads(json.dumps(request)))  # as it travels
        return {"started": True, "pid": 4242, "log_path": "/tmp/agent.log"}

    monkeypatch.setattr(provisioning, "_agent_control_over_ssh", answer)
    return sent


def _argv(request: dict[str, Any]) -> list[str]:
    """The argv the host would build (without its `~` expansion)."""
    values = {**request["values"], "state_dir": request["state_dir"]}
    return [item.format(**values) for item in request["argv_template"]]


async def test_no_tls_options_keep_the_command_line_unchanged(
    requests: list[dict[str, Any]],
) -> None:
    await ensure_ssh_agent(TARGET, state_dir="/srv/agent", **BASE)

    (request,) = requests
    assert request["argv_template"] == list(AGENT_COMMAND)
    assert request["files"] == []
    assert not any(word.startswith(("--tls", "--no-tls", "--api")) for word in _argv(request))


async def test_tls_options_become_flags_only_when_set(requests: list[dict[str, Any]]) -> None:
    await ensure_ssh_agent(
        TARGET,
        state_dir="/srv/agent",
        tls_ca="~/.gpuflow/agent/x/temporal/ca.pem",
        api_key_file="/srv/agent/temporal/api-key",
        **BASE,
    )
    await ensure_ssh_agent(
        TARGET,
        state_dir="/srv/agent",
        tls=True,
        tls_cert="/srv/{odd}/client.pem",
        tls_key="/srv/{odd}/client.key",
        tls_server_name="temporal.internal",
        **BASE,
    )
    await ensure_ssh_agent(TARGET, state_dir="/srv/agent", tls=False, **BASE)

    some, others, off = (_argv(request) for request in requests)
    base = len(AGENT_COMMAND)
    assert some[base:] == [
        "--tls-ca", "~/.gpuflow/agent/x/temporal/ca.pem",
        "--api-key-file", "/srv/agent/temporal/api-key",
    ]  # fmt: skip
    assert others[base:] == [
        "--tls",
        "--tls-cert", "/srv/{odd}/client.pem",
        "--tls-key", "/srv/{odd}/client.key",
        "--tls-server-name", "temporal.internal",
    ]  # fmt: skip
    assert off[base:] == ["--no-tls"]
    assert requests[0]["files"] == ["tls_ca", "api_key_file"]
    assert requests[1]["files"] == ["tls_cert", "tls_key"]


# ---- what the control worker hands an ssh host -----------------------------------------------


@pytest.fixture
def pushed(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    pushes: list[dict[str, Any]] = []

    async def push(target: SshTarget, *, files: dict[str, bytes], mode: int) -> None:
        for remote_path, content in files.items():
            pushes.append({"remote_path": remote_path, "content": content, "mode": mode})

    monkeypatch.setattr(ssh, "push_ssh_files", push)
    return pushes


def _target_of(host: Any) -> tuple[str, dict[str, Any]]:
    return host.id, host.ssh


def _host(state_dir: str = "/srv/agent") -> Any:
    ssh_fields = {"hostname": "127.0.0.1", "port": 2222, "python": "python3", "user": None}
    return SimpleNamespace(id="gpu-a/node-1", ssh={**ssh_fields, "state_dir": state_dir})


async def test_api_key_and_tls_files_travel_as_files_only(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    pushed: list[dict[str, Any]],
    requests: list[dict[str, Any]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    for name, text in (("ca.pem", "CA"), ("client.pem", "CERT"), ("client.key", "KEY")):
        (tmp_path / name).write_text(f"-----BEGIN {text}-----\n")
    monkeypatch.setenv("GPUFLOW_TEMPORAL_ADDRESS", "temporal.internal:7233")
    monkeypatch.setenv("GPUFLOW_TEMPORAL_TLS_CA", str(tmp_path / "ca.pem"))
    monkeypatch.setenv("GPUFLOW_TEMPORAL_TLS_CERT", str(tmp_path / "client.pem"))
    monkeypatch.setenv("GPUFLOW_TEMPORAL_TLS_KEY", str(tmp_path / "client.key"))
    monkeypatch.setenv("GPUFLOW_TEMPORAL_API_KEY", f" {API_KEY}\n")
    monkeypatch.setenv("GPUFLOW_AGENT_TEMPORAL_ADDRESS", "10.0.0.5:7233")
    monkeypatch.setenv("GPUFLOW_AGENT_TEMPORAL_TLS_SERVER_NAME", "temporal.internal")

    with caplog.at_level(logging.DEBUG):
        error = await ssh.ensure_host_agent(*_target_of(_host()))

    assert error is None
    directory = "/srv/agent/gpu-a_node-1/temporal"
    assert {(f["remote_path"], f["content"], f["mode"]) for f in pushed} == {
        (f"{directory}/ca.pem", b"-----BEGIN CA-----\n", 0o600),
        (f"{directory}/client.pem", b"-----BEGIN CERT-----\n", 0o600),
        (f"{directory}/client.key", b"-----BEGIN KEY-----\n", 0o600),
        (f"{directory}/api-key", API_KEY.encode(), 0o600),
    }
    (request,) = requests
    argv = _argv(request)
    assert argv[len(AGENT_COMMAND) :] == [
        "--tls-ca", f"{directory}/ca.pem",
        "--tls-cert", f"{directory}/client.pem",
        "--tls-key", f"{directory}/client.key",
        "--api-key-file", f"{directory}/api-key",
        "--tls-server-name", "temporal.internal",
    ]  # fmt: skip
    assert request["values"]["temporal_address"] == "10.0.0.5:7233"
    assert API_KEY not in json.dumps(request) and API_KEY not in caplog.text


async def test_plaintext_control_worker_gives_agents_no_tls(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    pushed: list[dict[str, Any]],
    requests: list[dict[str, Any]],
) -> None:
    monkeypatch.setenv("GPUFLOW_TEMPORAL_ADDRESS", "temporal.internal:7233")

    assert await ssh.ensure_host_agent(*_target_of(_host())) is None
    assert pushed == []
    assert requests[0]["argv_template"] == list(AGENT_COMMAND)

    monkeypatch.setenv("GPUFLOW_AGENT_TEMPORAL_TLS_SERVER_NAME", "temporal.internal")
    error = await ssh.ensure_host_agent(*_target_of(_host()))
    assert error is not None and "\n" not in error
    assert error.startswith("host gpu-a/node-1: ")
    assert "GPUFLOW_AGENT_TEMPORAL_TLS_SERVER_NAME is set but" in error
    assert len(requests) == 1


async def test_agents_follow_a_control_worker_that_turns_tls_off(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    pushed: list[dict[str, Any]],
    requests: list[dict[str, Any]],
) -> None:
    """GPUFLOW_TEMPORAL_TLS=false with an API key (a TLS-terminating proxy): the agent gets the
    same choice, and the key still only as a file."""
    monkeypatch.setenv("GPUFLOW_TEMPORAL_ADDRESS", "127.0.0.1:7233")
    monkeypatch.setenv("GPUFLOW_TEMPORAL_TLS", "false")
    monkeypatch.setenv("GPUFLOW_TEMPORAL_API_KEY", API_KEY)

    assert await ssh.ensure_host_agent(*_target_of(_host())) is None
    key_path = "/srv/agent/gpu-a_node-1/temporal/api-key"
    assert [(f["remote_path"], f["content"]) for f in pushed] == [(key_path, API_KEY.encode())]
    assert _argv(requests[0])[len(AGENT_COMMAND) :] == ["--no-tls", "--api-key-file", key_path]


async def test_unreadable_or_empty_local_files_are_named_without_content(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    pushed: list[dict[str, Any]],
    requests: list[dict[str, Any]],
) -> None:
    monkeypatch.setenv("GPUFLOW_TEMPORAL_ADDRESS", "temporal.internal:7233")
    monkeypatch.setenv("GPUFLOW_TEMPORAL_TLS_CA", str(tmp_path / "missing.pem"))
    error = await ssh.ensure_host_agent(*_target_of(_host()))
    assert error == (
        "host gpu-a/node-1: the agent's Temporal connection: GPUFLOW_TEMPORAL_TLS_CA: cannot "
        f"read {tmp_path / 'missing.pem'} (No such file or directory)"
    )

    monkeypatch.delenv("GPUFLOW_TEMPORAL_TLS_CA")
    (tmp_path / "key").write_text(" \n")
    monkeypatch.setenv("GPUFLOW_TEMPORAL_API_KEY_FILE", str(tmp_path / "key"))
    error = await ssh.ensure_host_agent(*_target_of(_host()))
    assert error is not None and error.endswith(f"{tmp_path / 'key'} is empty")
    assert pushed == [] and requests == []


def test_an_agents_address_without_a_port_uses_temporals() -> None:
    """As GPUFLOW_TEMPORAL_ADDRESS: `--temporal-address temporal.internal` reached port 80."""
    args = parse_args(
        ["--host-id", "f/h", "--temporal-address", "temporal.internal", "--state-dir", "/tmp/s"]
    )
    assert temporal_config(args).address == "temporal.internal:7233"


@pytest.mark.parametrize("address", ["http://127.0.0.1:7233", "127.0.0.1:7233/ns", "host:0"])
def test_an_agents_address_is_host_and_port_never_a_url(address: str) -> None:
    """A URL passed: the SDK only warned of its scheme, then failed to connect to a target it
    had mangled (`[http://127.0.0.1:7233]:7233`), an error that named no flag."""
    args = parse_args(["--host-id", "f/h", "--temporal-address", address, "--state-dir", "/x"])
    with pytest.raises(SpecError, match="--temporal-address must be HOST"):
        temporal_config(args)
