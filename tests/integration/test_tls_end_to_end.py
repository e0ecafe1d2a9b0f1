"""gpuflow over TLS against the real dev server: a TLS-terminating proxy on 127.0.0.1 (mutual
TLS, a throwaway CA) in front of the dev server's plaintext port, and a job run end to end by a
control worker and a client that reach Temporal only through it."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from temporalio.testing import WorkflowEnvironment

from gpuflow.client import Client
from gpuflow.config import TemporalConfig, connect_temporal
from gpuflow.control.worker import ControlWorker
from gpuflow.errors import ConnectionFailed
from gpuflow.specs import FleetSpec, JobSpec
from gpuflow.status import JobStatus
from gpuflow.store.db import Store
from tests.pki import Pki, make_pki

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

SERVER_NAME = "temporal.gpuflow.test"


@dataclass
class TlsProxy:
    address: str
    pki: Pki
    peers: list[str] = field(default_factory=list)
    """Common name of the client certificate of every connection it let through."""


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError, OSError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    with contextlib.suppress(ConnectionError, OSError):
        writer.close()


@pytest.fixture
async def tls_proxy(dev_env: WorkflowEnvironment, tmp_path: Path) -> AsyncIterator[TlsProxy]:
    pki = make_pki(tmp_path, SERVER_NAME)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(pki.server_cert, pki.server_key)
    context.load_verify_locations(pki.ca)
    context.verify_mode = ssl.CERT_REQUIRED  # mutual TLS: no client certificate, no entry
    context.set_alpn_protocols(["h2"])
    host, port = dev_env.client.service_client.config.target_host.rsplit(":", 1)
    proxy = TlsProxy(address="", pki=pki)
    tasks: set[asyncio.Task[None]] = set()

    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        cert = writer.get_extra_info("peercert") or {}
        names = [v for rdn in cert.get("subject", ()) for k, v in rdn if k == "commonName"]
        proxy.peers.append(names[0] if names else "")
        upstream_reader, upstream_writer = await asyncio.open_connection(host, int(port))
        await asyncio.gather(_pipe(reader, upstream_writer), _pipe(upstream_reader, writer))

    def track(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.ensure_future(relay(reader, writer))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    server = await asyncio.start_server(track, "127.0.0.1", 0, ssl=context)
    proxy.address = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        yield proxy
    finally:
        server.close()
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _config(proxy: TlsProxy, pki: Pki, *, client_cert: bool = True) -> TemporalConfig:
    return TemporalConfig(
        address=proxy.address,
        embedded=False,
        tls_ca=pki.ca,
        tls_cert=pki.client_cert if client_cert else None,
        tls_key=pki.client_key if client_cert else None,
        tls_server_name=SERVER_NAME,
    )


async def test_a_job_runs_end_to_end_over_mutual_tls(
    tls_proxy: TlsProxy, sqlite_store: Store, tmp_path: Path
) -> None:
    pki = tls_proxy.pki
    temporal = await connect_temporal(_config(tls_proxy, pki))
    client = Client(temporal=temporal)
    fleet = f"tls{uuid.uuid4().hex[:6]}"
    spec = FleetSpec.model_validate(
        {
            "type": "fleet",
            "name": fleet,
            "kind": "sim",
            "hosts": [{"name": "h1", "gpus": [{"name": "A100", "memory": "80GB"}]}],
        }
    )
    async with ControlWorker(temporal, sqlite_store, home=tmp_path / "home"):
        await client.apply_fleet(spec)
        job = await client.submit(
            JobSpec(name="tls", commands=["echo over tls"], resources={"gpu": 1}, fleets=[fleet])
        )
        result = await client.wait(job.id, timeout_s=60)
        output = "".join([chunk async for chunk in client.logs(job.id)])
    assert result.status == JobStatus.DONE
    assert "over tls" in output
    assert tls_proxy.peers and set(tls_proxy.peers) == {"gpuflow-agent"}

    # Without a client certificate the proxy (like a cluster with mTLS) refuses the client,
    # and gpuflow says so in one line.
    with pytest.raises(ConnectionFailed) as refused:
        await connect_temporal(_config(tls_proxy, pki, client_cert=False))
    assert "\n" not in str(refused.value)
    assert str(refused.value).startswith(f"cannot reach Temporal at {tls_proxy.address} over TLS")
