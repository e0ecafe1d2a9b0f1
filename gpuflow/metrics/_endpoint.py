"""Where a gpuflow process serves its metrics, and starting that endpoint.

GPUFLOW_METRICS_ADDRESS: unset is 127.0.0.1:9464; `HOST:PORT`, `[::1]:PORT`, `:PORT` (every
interface) or a bare port (on 127.0.0.1); empty or `off` serves nothing. One endpoint per
process: the embedded stack runs the control worker, the local agent and the simulated hosts'
agents in one process, so they share it.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from typing import Any

from prometheus_client import start_http_server

from gpuflow.errors import GpuflowError, SpecError
from gpuflow.metrics._gpus import GPU_SAMPLES
from gpuflow.metrics._registry import REGISTRY
from gpuflow.metrics._temporal import bridge_runtime

log = logging.getLogger("gpuflow.metrics")

VARIABLE = "GPUFLOW_METRICS_ADDRESS"
DEFAULT_ADDRESS = "127.0.0.1:9464"
_OFF = ("", "off", "none", "false", "no", "0", "disabled")


@dataclass(frozen=True)
class MetricsAddress:
    host: str
    port: int
    explicit: bool = True
    """Given by the user. A default address that is taken is a warning; an explicit one, an
    error."""

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"


def metrics_address(raw: str | None = None) -> MetricsAddress | None:
    """The endpoint GPUFLOW_METRICS_ADDRESS asks for (or `raw`); None when it is off."""
    explicit = True
    if raw is None:
        raw = os.environ.get(VARIABLE)
        if raw is None:
            raw, explicit = DEFAULT_ADDRESS, False
    value = raw.strip()
    if value.lower() in _OFF:
        return None
    host, sep, port = value.rpartition(":")
    if not sep:
        host, port = "127.0.0.1", value
    host = host.strip("[]") or "0.0.0.0"
    if not port.isdigit() or not 0 < int(port) < 65536 or any(c in host for c in "/ "):
        raise SpecError(
            f"{VARIABLE} must be HOST:PORT (e.g. 127.0.0.1:9464 or 0.0.0.0:9464), a port, or "
            f"off; not {raw!r}"
        )
    return MetricsAddress(host=host, port=int(port), explicit=explicit)


@dataclass
class MetricsEndpoint:
    address: MetricsAddress
    server: Any
    """The HTTP server, serving from a daemon thread for the life of the process."""


_lock = threading.Lock()
_endpoint: MetricsEndpoint | None = None


def serve_metrics(chosen: MetricsAddress | None) -> MetricsEndpoint | None:
    """Start this process's endpoint at `chosen` (usually `metrics_address()`; once per process,
    later calls return it) and make the Temporal SDK report into it. Call before connecting to
    Temporal: clients connected earlier keep a runtime that reports nowhere. None when metrics
    are off or the default port is taken."""
    global _endpoint
    if chosen is None:
        return None
    with _lock:
        if _endpoint is not None:
            return _endpoint
        try:
            server, _ = start_http_server(chosen.port, chosen.host, registry=REGISTRY)
        except OSError as exc:
            reason = exc.strerror or str(exc)
            if chosen.explicit:
                raise GpuflowError(
                    f"cannot serve metrics on {chosen.host}:{chosen.port} ({reason}); "
                    f"set {VARIABLE} to a free HOST:PORT, or off"
                ) from None
            log.warning(
                "metrics not served: %s:%s (%s); set %s to a free HOST:PORT",
                chosen.host,
                chosen.port,
                reason,
                VARIABLE,
            )
            return None
        REGISTRY.register(GPU_SAMPLES)
        REGISTRY.register(bridge_runtime())
        _endpoint = MetricsEndpoint(chosen, server)
        log.info("metrics at %s", chosen.url)
        return _endpoint
