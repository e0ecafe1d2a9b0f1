"""A job that holds a share of a GPU is sampled as its own processes, through the agent's
activities and the real nvidia-ml-py against the stub NVML: the utilization policy then judges
each share by its job alone, not by whoever else runs on the GPU."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.testing import ActivityEnvironment

from gpuflow.agent.activities import HostAgent
from gpuflow.agent.samplers import NvmlGpuSampler
from gpuflow.scheduler.model import NodePlacement
from gpuflow.workflows.models import ProbeInput, StartProcessInput, StopProcessInput
from tests.nvml_stub import NvmlStub, StubProcess

pytestmark = pytest.mark.asyncio(loop_scope="session")


def _start(job_id: str, gpu: int, fraction: float | None) -> StartProcessInput:
    node = NodePlacement(
        rank=0,
        host_id="local/h1",
        host_name="h1",
        fleet="local",
        task_queue="q",
        gpu_indices=[gpu],
        gpu_fraction=fraction,
    )
    return StartProcessInput(
        job_id=job_id, attempt=1, node=node, nodes=1, master_address="", commands=["sleep 60"]
    )


async def test_each_share_of_a_gpu_is_read_as_its_own_job(
    tmp_path: Path, nvml_stub: NvmlStub
) -> None:
    agent = HostAgent(host_id="local/h1", state_dir=tmp_path / "agent", sampler=NvmlGpuSampler())
    env = ActivityEnvironment()
    jobs = {"job-busy-1": (0, 0.5), "job-idle-1": (0, 0.5), "job-whole-1": (1, None)}
    pids = {}
    for job_id, (gpu, fraction) in jobs.items():
        handle = await env.run(agent.start_process, _start(job_id, gpu, fraction))
        pids[job_id] = handle.pid
    try:
        nvml_stub.set_gpus(2)
        nvml_stub.set_utilization(0, 80, memory_used_mib=6_000)
        nvml_stub.set_utilization(1, 5, memory_used_mib=500)
        nvml_stub.set_processes(
            StubProcess(gpu=0, pid=pids["job-busy-1"], sm_utilization=80, memory_used_mib=5_000),
            StubProcess(gpu=0, pid=pids["job-idle-1"], memory_used_mib=1_000),
            StubProcess(gpu=1, pid=pids["job-whole-1"], sm_utilization=5, memory_used_mib=500),
        )
        readings = {}
        for job_id, (gpu, _) in jobs.items():
            probe = ProbeInput(job_id=job_id, attempt=1, rank=0, gpu_indices=[gpu])
            result = await env.run(agent.probe_process, probe)
            assert result.state == "running", result
            (sample,) = result.samples
            readings[job_id] = (sample.gpu, sample.utilization, sample.memory_used_mib)
        assert readings == {
            "job-busy-1": (0, 80.0, 5_000),
            "job-idle-1": (0, 0.0, 1_000),  # the GPU is 80% busy, but not with this job
            "job-whole-1": (1, 5.0, 500),
        }
    finally:
        for job_id in jobs:
            stop = StopProcessInput(job_id=job_id, attempt=1, rank=0, grace_s=2)
            await env.run(agent.stop_process, stop)
