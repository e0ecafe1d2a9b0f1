"""GPUFLOW_TEMPORAL_ADDRESS is HOST[:PORT], and a failed connection is said in words: a URL
had the SDK warn of its scheme and fail on a mangled target (`[http://127.0.0.1:7233]:7233`),
and a refused port printed the transport's debug output (`tonic::transport::Error(...)`)."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from gpuflow.config import TEMPORAL_VARIABLES, TemporalConfig, connect_reason, connect_temporal
from gpuflow.errors import ConnectionFailed, SpecError
from tests.integration.stack_cli import free_port


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in TEMPORAL_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GPUFLOW_HOME", str(tmp_path / "home"))


def _one_line(error: BaseException) -> str:
    message = str(error)
    assert message and "\n" not in message, message
    return message


@pytest.mark.parametrize(
    ("given", "example"),
    [
        ("http://127.0.0.1:7233", "127.0.0.1:7233"),
        ("https://temporal.example.com/", "temporal.example.com"),
        ("dns:///temporal.internal:7233", "temporal.example.com:7233"),
        ("temporal.internal:7233/default", "temporal.internal:7233"),
        ("temporal.internal:http", "temporal.example.com:7233"),
        ("temporal.internal:70000", "temporal.example.com:7233"),
    ],
)
def test_an_address_is_host_and_port_not_a_url(
    monkeypatch: pytest.MonkeyPatch, recwarn: pytest.WarningsRecorder, given: str, example: str
) -> None:
    """`http://127.0.0.1:7233` had the SDK warn of its scheme, then fail on a mangled target
    (`[http://127.0.0.1:7233]:7233`)."""
    monkeypatch.setenv("GPUFLOW_TEMPORAL_ADDRESS", given)
    with pytest.raises(SpecError) as caught:
        TemporalConfig.from_env()
    assert _one_line(caught.value) == (
        "GPUFLOW_TEMPORAL_ADDRESS must be HOST[:PORT], without a scheme or path "
        f"(e.g. {example}), not {given!r}"
    )
    assert not recwarn.list


def test_a_url_is_refused_by_the_cli_in_one_line_without_a_warning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from typer.testing import CliRunner

    from gpuflow.cli.main import app

    monkeypatch.setenv("GPUFLOW_TEMPORAL_ADDRESS", "http://127.0.0.1:7233")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the SDK's UserWarning would end the command here
        result = CliRunner().invoke(app, ["ps"])
    assert result.exit_code == 1
    assert result.output.strip() == (
        "error: GPUFLOW_TEMPORAL_ADDRESS must be HOST[:PORT], without a scheme or path "
        "(e.g. 127.0.0.1:7233), not 'http://127.0.0.1:7233'"
    )


async def test_a_refused_connection_is_said_in_words() -> None:
    address = f"127.0.0.1:{free_port()}"  # nothing listens there
    with pytest.raises(ConnectionFailed) as caught:
        await connect_temporal(TemporalConfig(address=address, embedded=False))
    assert _one_line(caught.value) == (
        f"cannot reach Temporal at {address} (connection refused); check "
        "GPUFLOW_TEMPORAL_ADDRESS, or GPUFLOW_TEMPORAL_TLS=true if it needs TLS"
    )


_CONNECT = "Failed client connect: Server connection error: tonic::transport::Error(Transport, "


@pytest.mark.parametrize(
    ("sdk_said", "reason"),
    [
        (
            _CONNECT + 'ConnectError(ConnectError("tcp connect error", [::1]:1, Os { code: 111, '
            'kind: ConnectionRefused, message: "Connection refused" })))',
            "connection refused",
        ),
        (
            _CONNECT + 'ConnectError(ConnectError("dns error", Custom { kind: Uncategorized, '
            'error: "failed to lookup address information: Name or service not known" })))',
            "cannot resolve the host: failed to lookup address information: Name or service "
            "not known",
        ),
        (
            _CONNECT + "ConnectError(Custom { kind: InvalidData, error: "
            "InvalidCertificate(UnknownIssuer) }))",
            "invalid certificate: unknown issuer",
        ),
        (
            _CONNECT + 'ConnectError(Custom { kind: UnexpectedEof, error: "tls handshake eof" }))',
            "tls handshake eof",
        ),
        (
            "Failed client connect: `get_system_info` call error after connection: Status { "
            'code: Cancelled, message: "operation was canceled", source: Some(tonic::transport'
            '::Error(Transport, hyper::Error(Canceled, "connection closed"))) }',
            "connected, but no Temporal answered: connection closed",
        ),
        (_CONNECT + "Something(TimedOut))", "the connection failed"),
        ("Frontend is not healthy yet\nmore", "Frontend is not healthy yet"),
    ],
)
def test_transport_errors_are_said_in_words(sdk_said: str, reason: str) -> None:
    assert connect_reason(RuntimeError(sdk_said)) == reason
