"""The GPU samplers a host agent uses: NVML on real hosts, the declared source on simulated ones.

Both answer `sample(run, now)` with one GpuSample per readable GPU of the run; a GPU that
cannot be read yields no sample (a gap, which never counts as idle). A GPU the run holds a
share of (`run.shared`) is read, on a real host, for the run's own processes (its process
group's) where NVML can tell processes apart; a simulated GPU's reading is always the run's
own.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from gpuflow.agent.gpus import NvmlSampler
from gpuflow.agent.processes import group_pids
from gpuflow.agent.simulated import SimulatedSampler
from gpuflow.metrics import SampledRun
from gpuflow.specs.fleet import SimulatedUtilization
from gpuflow.utilization import GpuSample


class SamplingFailed(RuntimeError):
    """No GPU of the job could be read; the probe reports the reason."""


class NvmlGpuSampler:
    """Samples a job's GPUs through NVML (nvidia-ml-py), one NVML session per agent."""

    def __init__(self) -> None:
        self._sampler = NvmlSampler()
        self._lock = threading.Lock()

    def sample(self, run: SampledRun, now: float) -> list[GpuSample]:
        own = dict.fromkeys(run.shared, group_pids(run.pgid)) if run.shared else None
        with self._lock:
            batch = self._sampler.sample(list(run.gpus), now, own)
        if batch.errors and not batch.samples:
            raise SamplingFailed("; ".join(error.message for error in batch.errors))
        return list(batch.samples)

    def forget(self, job_key: str) -> None:
        return None


class SimulatedGpuSampler:
    """A simulated host's GPUs: the job process tree's CPU load (or a constant) stands in for
    GPU load, and every sample says it is simulated."""

    def __init__(self, source: SimulatedUtilization, memory_total_mib: int = 0) -> None:
        self.source = source
        self.memory_total_mib = memory_total_mib
        self._jobs: dict[str, tuple[int, SimulatedSampler]] = {}
        self._lock = threading.Lock()

    def sample(self, run: SampledRun, now: float) -> list[GpuSample]:
        with self._lock:
            known = self._jobs.get(run.key)
            if known is None or known[0] != run.pgid:
                sampler = SimulatedSampler(
                    source=self.source, root_pid=run.pgid, memory_total_mib=self.memory_total_mib
                )
                known = self._jobs[run.key] = (run.pgid, sampler)
        return list(known[1].sample(list(run.gpus), now).samples)

    def forget(self, job_key: str) -> None:
        with self._lock:
            self._jobs.pop(job_key, None)


def sampler_for_host(config: Mapping[str, Any] | None) -> SimulatedGpuSampler:
    """The sampler of a simulated host, from the fleet's `utilization` declaration."""
    config = dict(config or {})
    memory = int(config.pop("memory_total_mib", 0) or 0)
    return SimulatedGpuSampler(SimulatedUtilization.model_validate(config), memory)
