"""A host agent's GPU sampler for tests that need an agent but no GPU readings of their own."""

from __future__ import annotations

from collections.abc import Callable

from gpuflow.metrics import SampledRun
from gpuflow.utilization import GpuSample


class FixedSampler:
    """GPU i of a run reads `utilization(i)` percent and `memory_used_mib(i)` of
    `memory_total_mib`; `silent` reads nothing. Keeps the runs it was asked to read and the
    keys it was told to forget."""

    def __init__(
        self,
        *,
        utilization: Callable[[int], float] = lambda gpu: 42.0,
        memory_used_mib: Callable[[int], int] = lambda gpu: 1,
        memory_total_mib: int = 2,
        simulated: bool = False,
        silent: bool = False,
    ) -> None:
        self.utilization = utilization
        self.memory_used_mib = memory_used_mib
        self.memory_total_mib = memory_total_mib
        self.simulated = simulated
        self.silent = silent
        self.runs: list[SampledRun] = []
        self.forgotten: list[str] = []

    def sample(self, run: SampledRun, now: float) -> list[GpuSample]:
        self.runs.append(run)
        if self.silent:
            return []
        return [
            GpuSample(
                gpu=gpu,
                ts=now,
                utilization=self.utilization(gpu),
                memory_used_mib=self.memory_used_mib(gpu),
                memory_total_mib=self.memory_total_mib,
                simulated=self.simulated,
            )
            for gpu in run.gpus
        ]

    def forget(self, job_key: str) -> None:
        self.forgotten.append(job_key)
