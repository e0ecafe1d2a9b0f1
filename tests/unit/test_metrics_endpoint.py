"""gpuflow's metrics endpoint address and the Temporal SDK bridge, read back through
Prometheus's own text format."""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from typing import Any

import pytest
from temporalio.runtime import (
    BUFFERED_METRIC_KIND_COUNTER,
    BUFFERED_METRIC_KIND_GAUGE,
    BUFFERED_METRIC_KIND_HISTOGRAM,
)

from gpuflow.errors import GpuflowError, SpecError
from gpuflow.metrics import MetricsAddress, metrics_address, serve_metrics
from gpuflow.metrics._temporal import TemporalMetrics
from tests.prometheus_text import scrape as _scrape
from tests.prometheus_text import value as _value

# --- the address -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("127.0.0.1:9464", ("127.0.0.1", 9464)),
        ("0.0.0.0:9100", ("0.0.0.0", 9100)),
        ("[::1]:9464", ("::1", 9464)),
        (":9464", ("0.0.0.0", 9464)),
        ("9500", ("127.0.0.1", 9500)),
        (" off ", None),
        ("", None),
    ],
)
def test_metrics_address_forms(raw: str, expected: tuple[str, int] | None) -> None:
    address = metrics_address(raw)
    assert (address and (address.host, address.port)) == expected


def test_metrics_address_default_is_loopback_and_not_explicit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("GPUFLOW_METRICS_ADDRESS", raising=False)
    address = metrics_address()
    assert address is not None and not address.explicit
    assert address.url == "http://127.0.0.1:9464/metrics"
    monkeypatch.setenv("GPUFLOW_METRICS_ADDRESS", "off")
    assert metrics_address() is None


@pytest.mark.parametrize("raw", ["127.0.0.1:http", "host:99999", "a b:1", "127.0.0.1:0"])
def test_metrics_address_refuses_bad_values(raw: str) -> None:
    with pytest.raises(SpecError, match="GPUFLOW_METRICS_ADDRESS must be HOST:PORT"):
        metrics_address(raw)


def test_a_taken_port_is_an_error_only_when_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    # Another test in this process may have started the (once per process) endpoint already.
    monkeypatch.setattr("gpuflow.metrics._endpoint._endpoint", None)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert serve_metrics(MetricsAddress("127.0.0.1", port, explicit=False)) is None
        with pytest.raises(GpuflowError, match=f"cannot serve metrics on 127.0.0.1:{port}"):
            serve_metrics(MetricsAddress("127.0.0.1", port, explicit=True))
    assert serve_metrics(None) is None


# --- the Temporal SDK bridge ----------------------------------------------------------------


@dataclass(frozen=True)
class _Metric:
    name: str
    kind: int
    unit: str | None = None
    description: str | None = "help"


@dataclass(frozen=True)
class _Update:
    metric: _Metric
    value: float
    attributes: dict[str, Any] = field(default_factory=dict)


def test_temporal_updates_become_prometheus_families() -> None:
    requests = _Metric("temporal_request", BUFFERED_METRIC_KIND_COUNTER)
    slots = _Metric("temporal_worker_task_slots_available", BUFFERED_METRIC_KIND_GAUGE)
    latency = _Metric("temporal_request_latency", BUFFERED_METRIC_KIND_HISTOGRAM, unit="s")
    bridge = TemporalMetrics()
    bridge.apply(
        [
            _Update(requests, 1, {"operation": "StartWorkflowExecution"}),
            _Update(requests, 2, {"operation": "StartWorkflowExecution"}),
            _Update(requests, 1, {"operation": "GetSystemInfo"}),
            _Update(slots, 100, {"worker_type": "ActivityWorker", "eager": True}),
            _Update(slots, 97, {"worker_type": "ActivityWorker", "eager": True}),
            _Update(latency, 0.003, {"operation": "X"}),
            _Update(latency, 0.2, {"operation": "X"}),
            _Update(latency, 500, {"operation": "X"}),
        ]
    )
    samples = _scrape(bridge)
    assert _value(samples, "temporal_request_total", operation="StartWorkflowExecution") == 3
    assert _value(samples, "temporal_request_total", operation="GetSystemInfo") == 1
    assert (
        _value(
            samples,
            "temporal_worker_task_slots_available",
            worker_type="ActivityWorker",
            eager="true",
        )
        == 97
    )
    name = "temporal_request_latency_seconds"
    assert _value(samples, name + "_count", operation="X") == 3
    assert _value(samples, name + "_bucket", operation="X", le="0.005") == 1
    assert _value(samples, name + "_bucket", operation="X", le="0.25") == 2
    assert _value(samples, name + "_bucket", operation="X", le="+Inf") == 3
    assert abs((_value(samples, name + "_sum", operation="X") or 0) - 500.203) < 1e-9
