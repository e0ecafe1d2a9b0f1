"""Per-GPU utilization and memory of running jobs, from the samples a host agent takes.

`MeteredSampler` wraps an agent's sampler: every sample it returns is also the latest value of
its GPU's series, and `forget` (the job's process ended or was stopped) removes the job's
series, so a finished job leaves no stale GPU behind. Series carry `host`, `gpu` (the index on
the host), `job_id` (the workflow id, `job-<name>-<suffix>`; bounded by the jobs running now)
and `source` (`nvml` or `simulated`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import PurePath
from typing import Protocol

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpuflow.utilization import GpuSample

MIB = 1024 * 1024
STALE_AFTER_S = 600.0
"""A series no probe has refreshed for this long is dropped even without `forget` (a job whose
workflow stopped probing). Longer than the slowest monitor tick (three minutes)."""

LABELS = ["host", "gpu", "job_id", "source"]
"""Not `job`: Prometheus gives every target a `job` label and would rename ours."""


@dataclass(frozen=True)
class SampledRun:
    """One run (job, attempt, rank) whose GPUs a host agent samples."""

    key: str
    """The run's state directory (`.../jobs/<job id>/<attempt>-<rank>`)."""
    pgid: int
    """Its process group."""
    gpus: tuple[int, ...]
    shared: frozenset[int] = frozenset()
    """Those of `gpus` it holds a share of, beside other jobs: a real GPU is read for the
    run's own processes there (gpuflow/agent/samplers.py)."""


class Sampler(Protocol):
    """What a host agent samples a run's GPUs with (gpuflow/agent/samplers.py)."""

    def sample(self, run: SampledRun, now: float) -> list[GpuSample]: ...

    def forget(self, job_key: str) -> None: ...


@dataclass(frozen=True)
class _Reading:
    host: str
    job: str
    sample: GpuSample
    seen: float


def job_of(job_key: str) -> str:
    """The job id in an agent's job key, the job's state directory `.../jobs/<job id>/<attempt>-
    <rank>`; the key itself when it has another shape."""
    path = PurePath(job_key)
    if len(path.parts) >= 3 and path.parent.parent.name == "jobs":
        return path.parent.name
    return job_key


class GpuSamples(Collector):
    """The latest sample of every GPU of every running job this process samples."""

    def __init__(self) -> None:
        self._readings: dict[tuple[str, str, int], _Reading] = {}
        self._lock = threading.Lock()

    def record(self, host: str, job_key: str, samples: list[GpuSample]) -> None:
        now = time.monotonic()
        job = job_of(job_key)
        with self._lock:
            for sample in samples:
                self._readings[(host, job_key, sample.gpu)] = _Reading(host, job, sample, now)

    def forget(self, host: str, job_key: str) -> None:
        with self._lock:
            for key in [k for k in self._readings if k[0] == host and k[1] == job_key]:
                del self._readings[key]

    def collect(self) -> Iterator[Metric]:
        utilization = GaugeMetricFamily(
            "gpuflow_gpu_utilization_percent",
            "GPU utilization of a running job, percent of time a kernel ran (latest sample)",
            labels=LABELS,
        )
        used = GaugeMetricFamily(
            "gpuflow_gpu_memory_used_bytes", "GPU memory in use (latest sample)", labels=LABELS
        )
        total = GaugeMetricFamily(
            "gpuflow_gpu_memory_total_bytes", "GPU memory of the GPU", labels=LABELS
        )
        cutoff = time.monotonic() - STALE_AFTER_S
        with self._lock:
            for key in [k for k, r in self._readings.items() if r.seen < cutoff]:
                del self._readings[key]
            readings = list(self._readings.values())
        for reading in readings:
            sample = reading.sample
            source = "simulated" if sample.simulated else "nvml"
            labels = [reading.host, str(sample.gpu), reading.job, source]
            utilization.add_metric(labels, sample.utilization)
            used.add_metric(labels, sample.memory_used_mib * MIB)
            total.add_metric(labels, sample.memory_total_mib * MIB)
        yield utilization
        yield used
        yield total


GPU_SAMPLES = GpuSamples()
"""This process's GPU series (the embedded stack's local and simulated agents share it)."""


class MeteredSampler:
    """An agent's sampler whose samples also feed this process's GPU metrics."""

    def __init__(self, inner: Sampler, *, host_id: str, samples: GpuSamples = GPU_SAMPLES):
        self.inner = inner
        self.host_id = host_id
        self.samples = samples

    def sample(self, run: SampledRun, now: float) -> list[GpuSample]:
        taken = self.inner.sample(run, now)
        self.samples.record(self.host_id, run.key, taken)
        return taken

    def forget(self, job_key: str) -> None:
        self.inner.forget(job_key)
        self.samples.forget(self.host_id, job_key)
