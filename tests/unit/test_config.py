"""Where gpuflow finds Temporal: the variables, their errors, the API key's secrecy, and a real
TLS handshake against a throwaway CA on 127.0.0.1."""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client
from temporalio.service import TLSConfig

from gpuflow.config import TEMPORAL_VARIABLES, TemporalConfig, connect_temporal
from gpuflow.errors import ConnectionFailed, SpecError
from tests.pki import Pki, make_pki

API_KEY = "gpuflow-test-api-key-7f3a9c"
SERVER_NAME = "temporal.gpuflow.test"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in TEMPORAL_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    # not the developer's home, whose running stack the config would follow
    monkeypatch.setenv("GPUFLOW_HOME", str(tmp_path / "home"))


def _one_line(error: BaseException) -> str:
    message = str(error)
    assert message and "\n" not in message, message
    return message


# ---- parsing ---------------------------------------------------------------------------------


def test_no_address_is_the_embedded_server_and_ignores_tls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUFLOW_TEMPORAL_TLS_CA", "/nonexistent/ca.pem")
    monkeypatch.setenv("GPUFLOW_TEMPORAL_API_KEY", API_KEY)
    monkeypatch.setenv("GPUFLOW_TEMPORAL_TLS", "not-a-boolean")
    config = TemporalConfig.from_env()
    assert config == TemporalConfig(address="127.0.0.1:7233")
    assert config.embedded and not config.uses_tls and not config.has_api_key


def test_address_alone_is_plaintext(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUFLOW_TEMPORAL_ADDRESS", "temporal.internal:7233")
    monkeypatch.setenv("GPUFLOW_TEMPORAL_NAMESPACE", "gpuflow")
    config = TemporalConfig.from_env()
    assert (config.address, config.namespace, config.embedded) == (
        "temporal.internal:7233",
        "gpuflow",
        False,
    )
    assert not config.uses_tls


def test_mtls_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUFLOW_TEMPORAL_ADDRESS", "temporal.internal:7233")
    monkeypatch.setenv("GPUFLOW_TEMPORAL_TLS_CERT", "/etc/gpuflow/client.pem")
    monkeypatch.setenv("GPUFLOW_TEMPORAL_TLS_KEY", "/etc/gpuflow/client.key")
    monkeypatch.setenv("GPUFLOW_TEMPORAL_TLS_CA", "/etc/gpuflow/ca.pem")
    monkeypatch.setenv("GPUFLOW_TEMPORAL_TLS_SERVER_NAME", SERVER_NAME)
    config = TemporalConfig.from_env()
    assert config.tls_cert == Path("/etc/gpuflow/client.pem")
    assert config.tls_key == Path("/etc/gpuflow/client.key")
    assert config.tls_ca == Path("/etc/gpuflow/ca.pem")
    assert config.tls_server_name == SERVER_NAME
    assert config.tls is None and config.uses_tls


@pytest.mark.parametrize(
    ("variables", "uses_tls"),
    [
        ({"GPUFLOW_TEMPORAL_TLS_CA": "/ca.pem"}, True),
        ({"GPUFLOW_TEMPORAL_TLS_SERVER_NAME": SERVER_NAME}, True),
        ({"GPUFLOW_TEMPORAL_API_KEY": API_KEY}, True),
        ({"GPUFLOW_TEMPORAL_API_KEY_FILE": "/key"}, True),
        ({"GPUFLOW_TEMPORAL_TLS": "true"}, True),
        ({"GPUFLOW_TEMPORAL_TLS": "false"}, False),
        ({"GPUFLOW_TEMPORAL_TLS": ""}, False),
        # A key sent in the clear, e.g. to a TLS-terminating sidecar on loopback: only on request.
        ({"GPUFLOW_TEMPORAL_TLS": "false", "GPUFLOW_TEMPORAL_API_KEY": API_KEY}, False),
    ],
)
def test_tls_is_implied_unless_turned_off(
    monkeypatch: pytest.MonkeyPatch, variables: dict[str, str], uses_tls: bool
) -> None:
    monkeypatch.setenv("GPUFLOW_TEMPORAL_ADDRESS", "temporal.internal:7233")
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    assert TemporalConfig.from_env().uses_tls is uses_tls


@pytest.mark.parametrize(
    ("raw", "value"), [("1", True), ("TRUE", True), (" yes ", True), ("off", False), ("0", False)]
)
def test_boolean_spellings(monkeypatch: pytest.MonkeyPatch, raw: str, value: bool) -> None:
    monkeypatch.setenv("GPUFLOW_TEMPORAL_ADDRESS", "temporal.internal:7233")
    monkeypatch.setenv("GPUFLOW_TEMPORAL_TLS", raw)
    assert TemporalConfig.from_env().tls is value


# ---- errors ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("variables", "expected"),
    [
        (
            {"GPUFLOW_TEMPORAL_TLS": "sure"},
            "GPUFLOW_TEMPORAL_TLS must be true or false, not 'sure'",
        ),
        (
            {"GPUFLOW_TEMPORAL_TLS_CERT": "/c.pem"},
            "GPUFLOW_TEMPORAL_TLS_CERT is set but GPUFLOW_TEMPORAL_TLS_KEY is not",
        ),
        (
            {"GPUFLOW_TEMPORAL_TLS_KEY": "/c.key"},
            "GPUFLOW_TEMPORAL_TLS_KEY is set but GPUFLOW_TEMPORAL_TLS_CERT is not",
        ),
        (
            {"GPUFLOW_TEMPORAL_TLS": "false", "GPUFLOW_TEMPORAL_TLS_CA": "/ca.pem"},
            "GPUFLOW_TEMPORAL_TLS is false but GPUFLOW_TEMPORAL_TLS_CA is set",
        ),
        (
            {"GPUFLOW_TEMPORAL_API_KEY_FILE": "/key"},
            "set GPUFLOW_TEMPORAL_API_KEY or GPUFLOW_TEMPORAL_API_KEY_FILE, not both",
        ),
        ({"GPUFLOW_TEMPORAL_API_KEY": "   "}, "GPUFLOW_TEMPORAL_API_KEY is empty"),
    ],
)
def test_bad_settings_are_one_line_spec_errors(
    monkeypatch: pytest.MonkeyPatch, variables: dict[str, str], expected: str
) -> None:
    monkeypatch.setenv("GPUFLOW_TEMPORAL_ADDRESS", "temporal.internal:7233")
    monkeypatch.setenv("GPUFLOW_TEMPORAL_API_KEY", API_KEY)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SpecError) as caught:
        TemporalConfig.from_env()
    message = _one_line(caught.value)
    assert expected in message
    assert API_KEY not in message


def test_bad_embedded_port(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUFLOW_TEMPORAL_PORT", "72x33")
    with pytest.raises(SpecError, match="GPUFLOW_TEMPORAL_PORT must be a port number, not '72x33'"):
        TemporalConfig.from_env()


def test_embedded_config_refuses_tls_settings() -> None:
    with pytest.raises(SpecError, match="not the embedded dev server"):
        TemporalConfig(address="127.0.0.1:7233", api_key=API_KEY)
    with pytest.raises(SpecError, match="not the embedded dev server"):
        TemporalConfig(address="127.0.0.1:7233", tls_ca=Path("/ca.pem"))
    assert not TemporalConfig(address="127.0.0.1:7233", tls=False).uses_tls


@pytest.mark.parametrize("variable", ["GPUFLOW_TEMPORAL_TLS_CA", "GPUFLOW_TEMPORAL_TLS_CERT"])
async def test_missing_file_names_variable_and_path(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, variable: str
) -> None:
    missing = tmp_path / "nowhere.pem"
    monkeypatch.setenv("GPUFLOW_TEMPORAL_ADDRESS", "127.0.0.1:1")
    monkeypatch.setenv("GPUFLOW_TEMPORAL_API_KEY", API_KEY)
    monkeypatch.setenv(variable, str(missing))
    if variable == "GPUFLOW_TEMPORAL_TLS_CERT":
        (tmp_path / "client.key").write_text("key")
        monkeypatch.setenv("GPUFLOW_TEMPORAL_TLS_KEY", str(tmp_path / "client.key"))
    with pytest.raises(ConnectionFailed) as caught:
        await connect_temporal()
    message = _one_line(caught.value)
    assert message == f"{variable}: cannot read {missing} (No such file or directory)"
    assert API_KEY not in message


async def test_unreadable_file_names_variable_and_path(tmp_path: Path) -> None:
    # A directory where a file belongs: unreadable for every user, root included.
    config = TemporalConfig(address="127.0.0.1:1", embedded=False, tls_ca=tmp_path)
    with pytest.raises(ConnectionFailed) as caught:
        await connect_temporal(config)
    assert (
        _one_line(caught.value)
        == f"GPUFLOW_TEMPORAL_TLS_CA: cannot read {tmp_path} (Is a directory)"
    )


async def test_empty_api_key_file(tmp_path: Path) -> None:
    key_file = tmp_path / "api-key"
    key_file.write_text("\n")
    config = TemporalConfig(address="127.0.0.1:1", embedded=False, api_key_file=key_file)
    with pytest.raises(
        ConnectionFailed, match=f"GPUFLOW_TEMPORAL_API_KEY_FILE: {key_file} is empty"
    ):
        await connect_temporal(config)


# ---- secrecy ---------------------------------------------------------------------------------


def test_api_key_is_not_in_repr(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUFLOW_TEMPORAL_ADDRESS", "temporal.internal:7233")
    monkeypatch.setenv("GPUFLOW_TEMPORAL_API_KEY", API_KEY)
    config = TemporalConfig.from_env()
    assert config.api_key == API_KEY
    assert API_KEY not in repr(config)
    assert API_KEY not in str(config)
    assert API_KEY not in f"{config!r} {config}"


async def test_api_key_is_not_in_connection_errors_or_logs(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("GPUFLOW_TEMPORAL_ADDRESS", "127.0.0.1:1")  # nothing listens there
    monkeypatch.setenv("GPUFLOW_TEMPORAL_API_KEY", API_KEY)
    with caplog.at_level(logging.DEBUG), pytest.raises(ConnectionFailed) as caught:
        await connect_temporal()
    message = _one_line(caught.value)
    assert message.startswith("cannot reach Temporal at 127.0.0.1:1 over TLS (")
    assert API_KEY not in message
    assert API_KEY not in caplog.text


async def test_api_key_echoed_by_the_sdk_is_scrubbed(monkeypatch: pytest.MonkeyPatch) -> None:
    async def echoing_connect(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"rejected bearer {kwargs['api_key']}\nsecond line")

    monkeypatch.setattr(Client, "connect", echoing_connect)
    config = TemporalConfig(address="temporal.internal:7233", embedded=False, api_key=API_KEY)
    with pytest.raises(ConnectionFailed) as caught:
        await connect_temporal(config)
    message = _one_line(caught.value)
    assert "rejected bearer <api key>" in message
    assert API_KEY not in message


# ---- what reaches the SDK --------------------------------------------------------------------


@pytest.fixture
def sdk_calls(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = []

    async def recording_connect(target_host: str, **kwargs: Any) -> Any:
        calls.append({"target_host": target_host, **kwargs})
        return object()

    monkeypatch.setattr(Client, "connect", recording_connect)
    return calls


async def test_files_are_read_when_connecting(
    tmp_path: Path, sdk_calls: list[dict[str, Any]]
) -> None:
    for name, content in [("ca.pem", b"CA"), ("c.pem", b"CERT"), ("c.key", b"KEY")]:
        (tmp_path / name).write_bytes(content)
    (tmp_path / "api-key").write_text(f"{API_KEY}\n")
    config = TemporalConfig(
        address="temporal.internal:7233",
        embedded=False,
        tls_ca=tmp_path / "ca.pem",
        tls_cert=tmp_path / "c.pem",
        tls_key=tmp_path / "c.key",
        tls_server_name=SERVER_NAME,
        api_key_file=tmp_path / "api-key",
    )
    (tmp_path / "ca.pem").write_bytes(b"ROTATED CA")  # after the config was made
    await connect_temporal(config)
    [call] = sdk_calls
    assert call["tls"] == TLSConfig(
        server_root_ca_cert=b"ROTATED CA",
        domain=SERVER_NAME,
        client_cert=b"CERT",
        client_private_key=b"KEY",
    )
    assert call["api_key"] == API_KEY
    assert API_KEY not in repr(config)


async def test_embedded_and_plain_connections_use_no_tls(sdk_calls: list[dict[str, Any]]) -> None:
    await connect_temporal(TemporalConfig(address="127.0.0.1:7233"))
    await connect_temporal(TemporalConfig(address="temporal.internal:7233", embedded=False))
    assert [(c["tls"], c["api_key"]) for c in sdk_calls] == [(False, None), (False, None)]


# ---- a real TLS handshake on loopback ---------------------------------------------------------


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"), SERVER_NAME)


@dataclass
class TlsServer:
    """A TLS listener that is not Temporal: it records each completed handshake and hangs up."""

    address: str
    sni: list[str | None] = field(default_factory=list)
    peers: list[str] = field(default_factory=list)
    """Common name of the client certificate of each completed handshake ('' without one)."""


@pytest.fixture
async def tls_server(pki: Pki) -> AsyncIterator[TlsServer]:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(pki.server_cert, pki.server_key)
    context.load_verify_locations(pki.ca)
    context.verify_mode = ssl.CERT_OPTIONAL
    context.set_alpn_protocols(["h2"])
    server_info = TlsServer(address="")

    def record_sni(_sock: Any, server_name: str | None, _context: Any) -> None:
        server_info.sni.append(server_name)

    context.sni_callback = record_sni

    async def handshake_done(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peercert") or {}
        names = [
            value for rdn in peer.get("subject", ()) for key, value in rdn if key == "commonName"
        ]
        server_info.peers.append(names[0] if names else "")
        writer.close()

    server = await asyncio.start_server(handshake_done, "127.0.0.1", 0, ssl=context)
    port = server.sockets[0].getsockname()[1]
    server_info.address = f"127.0.0.1:{port}"
    async with server:
        yield server_info


async def test_tls_with_the_ca_gets_past_the_handshake(pki: Pki, tls_server: TlsServer) -> None:
    config = TemporalConfig(
        address=tls_server.address,
        embedded=False,
        tls_ca=pki.ca,
        tls_server_name=SERVER_NAME,
        api_key=API_KEY,
    )
    with pytest.raises(ConnectionFailed) as caught:
        await connect_temporal(config)
    message = _one_line(caught.value)
    # The handshake completed (the server verified nothing but saw SNI), and the failure came
    # afterwards, from a server that does not speak Temporal's API.
    # (The SDK may dial more than once; every handshake counts the same.)
    assert tls_server.peers and set(tls_server.peers) == {""}
    assert set(tls_server.sni) == {SERVER_NAME}
    assert message.startswith(f"cannot reach Temporal at {tls_server.address} over TLS (")
    assert "connected, but no Temporal answered: " in message
    assert API_KEY not in message


async def test_mtls_presents_the_client_certificate(pki: Pki, tls_server: TlsServer) -> None:
    config = TemporalConfig(
        address=tls_server.address,
        embedded=False,
        tls_ca=pki.ca,
        tls_cert=pki.client_cert,
        tls_key=pki.client_key,
        tls_server_name=SERVER_NAME,
    )
    with pytest.raises(ConnectionFailed):
        await connect_temporal(config)
    assert tls_server.peers and set(tls_server.peers) == {"gpuflow-agent"}


async def test_tls_without_the_ca_fails_the_handshake(tls_server: TlsServer) -> None:
    # The throwaway CA is in no trust store, so the system roots reject the server too.
    config = TemporalConfig(
        address=tls_server.address, embedded=False, tls=True, tls_server_name=SERVER_NAME
    )
    with pytest.raises(ConnectionFailed) as caught:
        await connect_temporal(config)
    message = _one_line(caught.value)
    assert tls_server.peers == []
    assert message.startswith(f"cannot reach Temporal at {tls_server.address} over TLS (")
    assert "certificate" in message.lower()
    assert message.endswith(
        "check GPUFLOW_TEMPORAL_ADDRESS and the GPUFLOW_TEMPORAL_TLS_* variables"
    )


async def test_plaintext_to_a_tls_server_never_handshakes(tls_server: TlsServer) -> None:
    config = TemporalConfig(address=tls_server.address, embedded=False)
    with pytest.raises(ConnectionFailed) as caught:
        await connect_temporal(config)
    assert tls_server.peers == []
    assert "GPUFLOW_TEMPORAL_TLS=true" in _one_line(caught.value)


def test_the_variable_list_names_every_variable_the_config_reads() -> None:
    # Tests clear TEMPORAL_VARIABLES to start from a clean environment: a variable read but not
    # listed would leak the developer's setting into them.
    import re

    import gpuflow.config

    source = Path(gpuflow.config.__file__).read_text()
    assert set(re.findall(r'"(GPUFLOW_TEMPORAL_[A-Z_]+)"', source)) == set(TEMPORAL_VARIABLES)


def test_a_starting_server_is_tried_again_until_it_answers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A dev server opens its port before its frontend is healthy: `gpuflow up` connects once
    it answers, and gives up with the server's own words after the time it allows."""
    from gpuflow.config import connect_when_ready

    tries: list[int] = []
    ready_after = 3

    async def connect(*_: Any, **__: Any) -> str:
        tries.append(1)
        if len(tries) < ready_after:
            raise RuntimeError("Frontend is not healthy yet")
        return "client"

    monkeypatch.setattr(Client, "connect", connect)
    config = TemporalConfig.from_env()
    assert asyncio.run(connect_when_ready(config, within_s=10)) == "client"
    assert len(tries) == ready_after
    tries.clear()
    ready_after = 10**6
    with pytest.raises(ConnectionFailed, match="Frontend is not healthy yet"):
        asyncio.run(connect_when_ready(config, within_s=1.2))
    assert 2 <= len(tries) <= 4  # every half second, then the error
    tries.clear()
    with pytest.raises(ConnectionFailed):  # a cluster's client: one try, at once
        asyncio.run(connect_when_ready(config, within_s=0))
    assert len(tries) == 1


@pytest.mark.parametrize(
    ("given", "used"),
    [
        ("temporal.internal", "temporal.internal:7233"),
        ("temporal.internal:7300", "temporal.internal:7300"),
        (" localhost ", "localhost:7233"),
        ("::1", "[::1]:7233"),
        ("[::1]", "[::1]:7233"),
        ("[::1]:7300", "[::1]:7300"),
    ],
)
def test_an_address_without_a_port_uses_temporals(
    monkeypatch: pytest.MonkeyPatch, given: str, used: str
) -> None:
    """`GPUFLOW_TEMPORAL_ADDRESS=localhost` connected to port 80."""
    monkeypatch.setenv("GPUFLOW_TEMPORAL_ADDRESS", given)
    assert TemporalConfig.from_env().address == used
