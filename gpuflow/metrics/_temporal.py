"""The Temporal SDK's own worker metrics, served on gpuflow's endpoint.

The SDK can serve Prometheus itself, but on a second port and only once per process. Instead the
process's Temporal runtime records into a `MetricBuffer`, and this collector drains it (every
second, and at each scrape) into counters, gauges and histograms under the SDK's own names
(`temporal_*`, durations in seconds with a `_seconds` suffix), so Temporal's published
dashboards read them as they are.
"""

from __future__ import annotations

import bisect
import logging
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import Metric
from prometheus_client.registry import Collector
from temporalio.runtime import (
    BUFFERED_METRIC_KIND_COUNTER,
    BUFFERED_METRIC_KIND_GAUGE,
    BufferedMetricUpdate,
    MetricBuffer,
    MetricBufferDurationFormat,
    Runtime,
    TelemetryConfig,
)

log = logging.getLogger("gpuflow.metrics")

LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
"""Seconds. The SDK's histograms are all latencies, from sub-millisecond task handling to
long polls of about a minute."""

BUFFER_SIZE = 100_000
DRAIN_INTERVAL_S = 1.0

Labels = tuple[tuple[str, str], ...]


@dataclass
class _Family:
    name: str
    help: str
    kind: int
    values: dict[Labels, float] = field(default_factory=dict)
    """Counter totals or gauge values, by label set."""
    buckets: dict[Labels, list[int]] = field(default_factory=dict)
    """Histogram counts per bucket (not cumulative; the last one is +Inf), by label set."""
    sums: dict[Labels, float] = field(default_factory=dict)


def _labels(attributes: Mapping[str, Any]) -> Labels:
    return tuple(
        sorted(
            (str(k), str(v).lower() if isinstance(v, bool) else str(v))
            for k, v in attributes.items()
        )
    )


class TemporalMetrics(Collector):
    """Folds the runtime's buffered updates into Prometheus families."""

    def __init__(self, buffer: MetricBuffer | None = None) -> None:
        self.buffer = buffer
        self._families: dict[str, _Family] = {}
        self._lock = threading.Lock()

    def apply(self, updates: Iterable[BufferedMetricUpdate]) -> None:
        """Add updates: counters add their delta, gauges take the value, histograms observe it."""
        with self._lock:
            for update in updates:
                metric = update.metric
                name = metric.name + ("_seconds" if metric.unit == "s" else "")
                family = self._families.get(name)
                if family is None:
                    family = self._families[name] = _Family(
                        name, metric.description or name, metric.kind
                    )
                labels = _labels(update.attributes)
                value = float(update.value)
                if family.kind == BUFFERED_METRIC_KIND_COUNTER:
                    family.values[labels] = family.values.get(labels, 0.0) + value
                elif family.kind == BUFFERED_METRIC_KIND_GAUGE:
                    family.values[labels] = value
                else:
                    counts = family.buckets.setdefault(labels, [0] * (len(LATENCY_BUCKETS) + 1))
                    counts[bisect.bisect_left(LATENCY_BUCKETS, value)] += 1
                    family.sums[labels] = family.sums.get(labels, 0.0) + value

    def drain(self) -> None:
        if self.buffer is None:
            return
        try:
            updates = self.buffer.retrieve_updates()
        except Exception:  # metrics never stop a worker
            log.exception("could not read the Temporal SDK's metrics")
            return
        self.apply(updates)

    def collect(self) -> Iterator[Metric]:
        self.drain()
        with self._lock:
            families = list(self._families.values())
            for family in families:
                yield self._metric(family)

    @staticmethod
    def _metric(family: _Family) -> Metric:
        if family.kind == BUFFERED_METRIC_KIND_COUNTER:
            metric = Metric(family.name, family.help, "counter")
            for labels, value in family.values.items():
                metric.add_sample(family.name + "_total", dict(labels), value)
            return metric
        if family.kind == BUFFERED_METRIC_KIND_GAUGE:
            metric = Metric(family.name, family.help, "gauge")
            for labels, value in family.values.items():
                metric.add_sample(family.name, dict(labels), value)
            return metric
        metric = Metric(family.name, family.help, "histogram")
        for labels, counts in family.buckets.items():
            cumulative = 0
            bounds = [*(str(float(b)) for b in LATENCY_BUCKETS), "+Inf"]
            for bound, count in zip(bounds, counts, strict=True):
                cumulative += count
                metric.add_sample(
                    family.name + "_bucket", {**dict(labels), "le": bound}, cumulative
                )
            metric.add_sample(family.name + "_count", dict(labels), cumulative)
            metric.add_sample(family.name + "_sum", dict(labels), family.sums[labels])
        return metric


_runtime_lock = threading.Lock()
_runtime_metrics: TemporalMetrics | None = None


def bridge_runtime() -> TemporalMetrics:
    """Make this process's default Temporal runtime record into a buffer that gpuflow's endpoint
    serves; once per process (a runtime's telemetry is fixed when it is created). Clients
    connected before keep the runtime they had, so call this before connecting."""
    global _runtime_metrics
    with _runtime_lock:
        if _runtime_metrics is None:
            buffer = MetricBuffer(BUFFER_SIZE, MetricBufferDurationFormat.SECONDS)
            runtime = Runtime(telemetry=TelemetryConfig(metrics=buffer))
            Runtime.set_default(runtime, error_if_already_set=False)
            _runtime_metrics = TemporalMetrics(buffer)
            threading.Thread(
                target=_drain_forever,
                args=(_runtime_metrics,),
                name="gpuflow-temporal-metrics",
                daemon=True,
            ).start()
        return _runtime_metrics


def _drain_forever(metrics: TemporalMetrics) -> None:
    """Keeps the buffer from filling between scrapes (a full buffer drops updates)."""
    stop = threading.Event()
    while not stop.wait(DRAIN_INTERVAL_S):
        metrics.drain()
