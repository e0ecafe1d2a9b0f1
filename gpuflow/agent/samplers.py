"""The GPU samplers a host agent uses: NVML on real hosts, the declared source on simulated ones.

Both answer `sample(job_key, root_pid, indices, now, shared)` with one GpuSample per readable
GPU; a GPU that cannot be read yields no sample (a gap, which never counts as idle). `shared`:
the GPUs of `indices` the job holds a share of, beside other jobs: on a real GPU their readings
are the job's own processes' (its process group's), where NVML can tell processes apart; a
simulated GPU's reading is always the job's own.
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Mapping
from typing import Any

from gpuflow.agent.gpus import NvmlSampler
from gpuflow.agent.processes import group_pids
from gpuflow.agent.simulated import SimulatedSampler
from gpuflow.specs.fleet import SimulatedUtilization
from gpuflow.utilization import GpuSample


class SamplingFailed(RuntimeError):
    """No GPU of the job could be read; the probe reports the reason."""


class NvmlGpuSampler:
    """Samples a job's GPUs through NVML (nvidia-ml-py), one NVML session per agent."""

    def __init__(self) -> None:
        self._sampler = NvmlSampler()
        self._lock = threading.Lock()

    def sample(
        self,
        job_key: str,
        root_pid: int,
        indices: list[int],
        now: float,
        shared: Collection[int] = (),
    ) -> list[GpuSample]:
        own = None
        if shared:
            pids = group_pids(root_pid)
            own = dict.fromkeys(shared, pids)
        with self._lock:
            batch = self._sampler.sample(indices, now, own)
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

    def sample(
        self,
        job_key: str,
        root_pid: int,
        indices: list[int],
        now: float,
        shared: Collection[int] = (),
    ) -> list[GpuSample]:
        with self._lock:
            known = self._jobs.get(job_key)
            if known is None or known[0] != root_pid:
                sampler = SimulatedSampler(
                    source=self.source, root_pid=root_pid, memory_total_mib=self.memory_total_mib
                )
                known = self._jobs[job_key] = (root_pid, sampler)
        return list(known[1].sample(indices, now).samples)

    def forget(self, job_key: str) -> None:
        with self._lock:
            self._jobs.pop(job_key, None)


def sampler_for_host(config: Mapping[str, Any] | None) -> SimulatedGpuSampler:
    """The sampler of a simulated host, from the fleet's `utilization` declaration."""
    config = dict(config or {})
    memory = int(config.pop("memory_total_mib", 0) or 0)
    return SimulatedGpuSampler(SimulatedUtilization.model_validate(config), memory)
