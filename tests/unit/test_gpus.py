"""GPU discovery and sampling through the real nvidia-ml-py against the stub NVML library, and
the simulated samplers of sim hosts."""

from __future__ import annotations

import contextlib
import ctypes.util
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuflow.agent import simulated
from gpuflow.agent.gpus import (
    LIBRARY_ENV,
    NvmlError,
    NvmlSampler,
    discover_gpus,
    inspect_gpus,
    model_name,
)
from gpuflow.agent.processes import group_pids
from gpuflow.agent.samplers import NvmlGpuSampler
from gpuflow.agent.simulated import ProcessCpuSampler, SimulatedSampler
from gpuflow.metrics import SampledRun
from gpuflow.specs.fleet import SimulatedUtilization
from tests.nvml_stub import NOT_SUPPORTED, NvmlStub, StubProcess

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("full", "short"),
    [
        ("NVIDIA H100 80GB HBM3", "H100"),
        ("NVIDIA H100 PCIe", "H100"),
        ("NVIDIA H100 NVL", "H100NVL"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("NVIDIA A100 80GB PCIe", "A100"),
        ("Tesla V100-SXM2-16GB", "V100"),
        ("Tesla T4", "T4"),
        ("NVIDIA A10G", "A10G"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA GeForce RTX 4090", "RTX4090"),
        ("NVIDIA RTX A6000", "RTXA6000"),
        ("NVIDIA GH200 480GB", "GH200"),
    ],
)
def test_model_name_is_what_jobs_write(full: str, short: str) -> None:
    assert model_name(full) == short


def test_discovery_reads_the_gpus_through_nvml(nvml_stub: NvmlStub) -> None:
    nvml_stub.set_gpus(2, name="NVIDIA A100-SXM4-80GB", memory_total_mib=81920,
                       compute_capability=(8, 0))  # fmt: skip
    nvml_stub.driver_version = "535.104.05"
    nvml_stub.write()
    found = inspect_gpus()
    assert found.unavailable_reason is None
    assert found.driver_version == "535.104.05"
    assert [gpu.model_dump() for gpu in found.gpus] == [
        {
            "index": i,
            "uuid": f"GPU-00000000-0000-0000-0000-{i:012d}",
            "name": "A100",
            "full_name": "NVIDIA A100-SXM4-80GB",
            "memory_mib": 81920,
            "driver_version": "535.104.05",
            "compute_capability": "8.0",
            "vendor": "nvidia",
        }
        for i in range(2)
    ]
    assert [gpu.index for gpu in discover_gpus(indices=[1])] == [1]


def test_samples_follow_the_driver(nvml_stub: NvmlStub) -> None:
    nvml_stub.set_gpus(8)
    sampler = NvmlSampler()
    inits = nvml_stub.init_calls()
    nvml_stub.set_utilization(3, 87, memory_used_mib=40_000)
    batch = sampler.sample([0, 3], 100.0)
    assert batch.errors == []
    assert [(s.gpu, s.ts, s.utilization, s.memory_used_mib, s.memory_total_mib, s.simulated)
            for s in batch.samples] == [
        (0, 100.0, 0.0, 0, 81559, False),
        (3, 100.0, 87.0, 40_000, 81559, False),
    ]  # fmt: skip
    nvml_stub.set_utilization(3, 12)
    for step in range(5):
        batch = sampler.sample([0, 3], 105.0 + step)
    assert batch.samples[1].utilization == 12
    assert nvml_stub.init_calls() - inits == 1  # NVML initialised once, handles kept
    sampler.close()


def test_no_driver_is_a_reason_not_a_crash(nvml_stub: NvmlStub) -> None:
    nvml_stub.unload_driver()
    found = inspect_gpus()
    assert found.gpus == []
    assert found.unavailable_reason is not None
    assert "NVIDIA driver is not loaded" in found.unavailable_reason
    assert discover_gpus() == []
    with pytest.raises(NvmlError, match="GPUs 0, 1 cannot be read: the NVIDIA driver is not"):
        discover_gpus(indices=[0, 1])

    sampler = NvmlSampler()
    batch = sampler.sample([0, 1], 10.0)
    assert batch.samples == []
    assert [(e.gpu, e.code) for e in batch.errors] == [(0, 9), (1, 9)]
    assert "NVIDIA driver is not loaded" in batch.errors[0].message
    # The driver comes back: the same sampler initialises NVML again.
    nvml_stub.unload_driver(False)
    assert [s.gpu for s in sampler.sample([0, 1], 15.0).samples] == [0, 1]
    # It goes away while NVML is initialised: every GPU says so, and NVML starts over later.
    nvml_stub.unload_driver()
    batch = sampler.sample([0, 1], 20.0)
    assert [(e.gpu, e.code) for e in batch.errors] == [(0, 9), (1, 9)]
    assert batch.errors[1].message.startswith("GPU sampling failed: the NVIDIA driver is not")
    nvml_stub.unload_driver(False)
    inits = nvml_stub.init_calls()
    assert len(sampler.sample([0, 1], 25.0).samples) == 2
    assert nvml_stub.init_calls() == inits + 1
    sampler.close()


def test_lost_gpu_is_an_error_for_that_gpu_only(nvml_stub: NvmlStub) -> None:
    nvml_stub.set_gpus(4)
    nvml_stub.set_utilization(2, 60)
    sampler = NvmlSampler()
    assert len(sampler.sample([1, 2], 1.0).samples) == 2
    nvml_stub.lose_gpu(1)
    batch = sampler.sample([1, 2], 2.0)
    assert [(s.gpu, s.utilization) for s in batch.samples] == [(2, 60.0)]
    [error] = batch.errors
    assert (error.gpu, error.code) == (1, 15)
    assert error.message.startswith("GPU 1 is lost (fell off the bus or stopped answering)")
    assert "(NVML: GPU is lost)" in error.message

    found = inspect_gpus()
    assert [gpu.index for gpu in found.gpus] == [0, 2, 3]
    assert list(found.unreadable) == [1]
    with pytest.raises(NvmlError, match="GPU 1 is lost") as raised:
        discover_gpus(indices=[0, 1])
    assert raised.value.gpu == 1

    nvml_stub.lose_gpu(1, False)
    assert [s.gpu for s in sampler.sample([1, 2], 3.0).samples] == [1, 2]
    sampler.close()


def test_unknown_gpu_index_is_named(nvml_stub: NvmlStub) -> None:
    batch = NvmlSampler().sample([0, 5], 1.0)
    assert [s.gpu for s in batch.samples] == [0]
    assert batch.errors[0].message.startswith("GPU 5 does not exist on this host")
    with pytest.raises(NvmlError, match="GPU 5 not found on this host"):
        discover_gpus(indices=[5])


def test_library_that_cannot_be_loaded_is_named(
    nvml_stub: NvmlStub, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    missing = tmp_path / "libnvidia-ml.so.1"
    monkeypatch.setenv(LIBRARY_ENV, str(missing))
    reason = inspect_gpus().unavailable_reason
    assert reason is not None
    assert reason.startswith(f"{LIBRARY_ENV}={missing} cannot be loaded")
    assert NvmlSampler().sample([0], 1.0).errors[0].message.startswith("GPU sampling failed")


def _discover_in_subprocess(env: dict[str, str]) -> dict[str, Any]:
    code = "from gpuflow.agent.gpus import inspect_gpus as i; print(i().model_dump_json())"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
        check=True, timeout=60,
    )  # fmt: skip
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def test_a_subprocess_agent_is_pointed_at_the_stub(nvml_stub: NvmlStub) -> None:
    nvml_stub.set_gpus(3)
    env = {k: v for k, v in os.environ.items() if k not in nvml_stub.env()}
    found = _discover_in_subprocess({**env, **nvml_stub.env()})
    assert [gpu["name"] for gpu in found["gpus"]] == ["H100"] * 3


@pytest.mark.skipif(
    ctypes.util.find_library("nvidia-ml") is not None, reason="this host has a real NVML"
)
def test_host_without_nvml_says_why() -> None:
    env = {k: v for k, v in os.environ.items() if k not in (LIBRARY_ENV, "LD_PRELOAD")}
    found = _discover_in_subprocess(env)
    assert found["gpus"] == []
    assert "libnvidia-ml.so.1 was not found" in str(found["unavailable_reason"])


# -- simulated GPUs ------------------------------------------------------------------------

BUSY = "while True: pass"
IDLE = "import time; time.sleep(120)"


@pytest.fixture
def spawn() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        # each runs in its own session: kill the whole group, grandchildren included
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def _start(spawn: list[subprocess.Popen[bytes]], *argv: str) -> int:
    process = subprocess.Popen(list(argv), start_new_session=True)
    spawn.append(process)
    return process.pid


def _load_after(sampler: ProcessCpuSampler, seconds: float) -> float:
    assert sampler.cpu_percent() is None  # the first reading is the baseline
    time.sleep(seconds)
    load = sampler.cpu_percent()
    assert load is not None
    return load


def test_process_cpu_reads_a_busy_process_high_and_an_idle_one_low(
    spawn: list[subprocess.Popen[bytes]],
) -> None:
    busy = ProcessCpuSampler(_start(spawn, sys.executable, "-c", BUSY))
    idle = ProcessCpuSampler(_start(spawn, sys.executable, "-c", IDLE))
    time.sleep(0.3)
    busy.cpu_percent()
    idle.cpu_percent()
    time.sleep(1.5)
    busy_load = busy.cpu_percent()
    idle_load = idle.cpu_percent()
    # Other work on the machine takes its share of the busy process's core: compare loosely.
    assert busy_load is not None and idle_load is not None
    assert busy_load > max(10, 4 * idle_load)
    assert idle_load < 5
    assert busy.memory_used_mib > 0


def test_process_cpu_counts_the_whole_tree(spawn: list[subprocess.Popen[bytes]]) -> None:
    # The root only waits; the load is its grandchild's.
    script = f'"{sys.executable}" -c "{BUSY}" & wait'
    root = _start(spawn, "/bin/sh", "-c", f"/bin/sh -c '{script}' & wait")
    time.sleep(0.3)
    assert _load_after(ProcessCpuSampler(root), 1.5) > 10


def test_process_cpu_is_cpu_seconds_over_wall_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    # (pid, start time, CPU ticks, RSS bytes); 100 ticks a second.
    # (scan time, tree); the rate is over the times /proc was read
    readings = iter(
        [
            (1000.0, [(10, 1, 100, 0)]),
            (1005.0, [(10, 1, 300, 0), (11, 5, 50, 2 << 20)]),  # +200 ticks, a new child: 50
            (1005.0, [(10, 1, 300, 0), (11, 5, 50, 2 << 20)]),  # the same scan: the same
            (1010.0, [(10, 1, 900, 0), (11, 5, 50, 2 << 20)]),  # +600 in 5 s: one core at most
            None,  # the root exited
        ]
    )
    monkeypatch.setattr(simulated, "_process_tree", lambda root: next(readings))
    monkeypatch.setattr(simulated, "_CLOCK_TICKS", 100)
    sampler = ProcessCpuSampler(10)
    assert sampler.cpu_percent() is None
    assert sampler.cpu_percent() == pytest.approx(50.0)  # 2.5 CPU s over 5 s
    assert sampler.memory_used_mib == 2
    assert sampler.cpu_percent() == pytest.approx(50.0)
    assert sampler.cpu_percent() == 100.0
    assert sampler.cpu_percent() is None


def test_jobs_sampled_together_share_one_scan_of_proc(
    spawn: list[subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sim fleet runs every job on this machine: each job read every process's stat, so a
    round of samples cost jobs x processes reads. Jobs sampled within SCAN_REUSE_S of a scan
    share it, and each still reads its own tree (busy high, idle low)."""
    scans = [0]
    listdir = os.listdir

    def counted(path: Any) -> list[str]:
        if str(path) == "/proc":
            scans[0] += 1
        return listdir(path)

    monkeypatch.setattr(simulated.os, "listdir", counted)
    monkeypatch.setattr(simulated, "SCAN_REUSE_S", 0.5)
    busy = [ProcessCpuSampler(_start(spawn, sys.executable, "-c", BUSY)) for _ in range(2)]
    idle = [ProcessCpuSampler(_start(spawn, sys.executable, "-c", IDLE)) for _ in range(6)]
    time.sleep(0.6)
    assert all(sampler.cpu_percent() is None for sampler in busy + idle)
    assert scans[0] == 1
    time.sleep(1.5)
    loads = [sampler.cpu_percent() for sampler in busy + idle]
    assert scans[0] == 2
    assert all(load is not None for load in loads)
    assert min(loads[:2]) > max(10, 4 * max(loads[2:]))  # type: ignore[type-var]


def test_process_cpu_of_a_finished_job_is_no_sample(spawn: list[subprocess.Popen[bytes]]) -> None:
    pid = _start(spawn, sys.executable, "-c", "pass")
    spawn[0].wait()
    sampler = SimulatedSampler(source=SimulatedUtilization(), root_pid=pid, memory_total_mib=1024)
    assert sampler.sample([0], time.time()).samples == []


def test_simulated_samples_say_so(spawn: list[subprocess.Popen[bytes]]) -> None:
    constant = SimulatedSampler(
        source=SimulatedUtilization(source="constant", value=35), memory_total_mib=24576
    )
    batch = constant.sample([0, 1], 50.0)
    assert [
        (s.gpu, s.ts, s.utilization, s.memory_total_mib, s.simulated) for s in batch.samples
    ] == [(0, 50.0, 35, 24576, True), (1, 50.0, 35, 24576, True)]

    pid = _start(spawn, sys.executable, "-c", BUSY)
    tree = SimulatedSampler(source=SimulatedUtilization(), root_pid=pid, memory_total_mib=1)
    assert tree.sample([2], time.time()).samples == []  # baseline
    time.sleep(1.0)
    [sample] = tree.sample([2], time.time()).samples
    assert sample.simulated and sample.utilization > 10
    assert sample.memory_used_mib <= 1


# -- a job's own share of a GPU ---------------------------------------------------------------


def test_a_shared_gpu_reads_as_the_named_processes_own(
    nvml_stub: NvmlStub, spawn: list[subprocess.Popen[bytes]]
) -> None:
    """Two jobs share GPU 0: each reading is its own processes' SM utilization (the mean of
    their samples, summed) and memory, not the GPU's 90%; a job whose processes used no SMs
    reads 0 (NVML has no sample of them), one with no process on the GPU 0 MiB."""
    busy, idle, other = (_start(spawn, "sleep", "60") for _ in range(3))
    nvml_stub.set_gpus(2)
    nvml_stub.set_utilization(0, 90, memory_used_mib=7_000)
    nvml_stub.set_processes(
        StubProcess(gpu=0, pid=busy, sm_utilization=70, memory_used_mib=4_000),
        StubProcess(gpu=0, pid=other, sm_utilization=20, memory_used_mib=1_000),
        StubProcess(gpu=0, pid=idle, sm_utilization=0, memory_used_mib=2_000),
    )
    sampler = NvmlSampler()
    now = time.time()

    def reading(pids: set[int]) -> tuple[float, int]:
        (sample,) = sampler.sample([0], now, {0: pids}).samples
        return sample.utilization, sample.memory_used_mib

    assert reading({busy}) == (70.0, 4_000)
    assert reading({busy, other}) == (90.0, 5_000)
    assert reading({idle}) == (0.0, 2_000)
    assert reading({os.getpid()}) == (0.0, 0)
    # the whole GPU where no processes are named: GPU 0 as a whole, GPU 1 beside it
    whole = sampler.sample([0, 1], now, {1: {busy}}).samples
    assert [(s.gpu, s.utilization, s.memory_used_mib) for s in whole] == [
        (0, 90.0, 7_000),
        (1, 0.0, 0),
    ]
    # no process used the SMs lately: NVML answers NOT_FOUND, which is 0, not an error
    nvml_stub.set_processes(StubProcess(gpu=0, pid=idle, memory_used_mib=2_000))
    assert reading({idle}) == (0.0, 2_000)
    sampler.close()


@pytest.mark.parametrize("why", ["not supported", "another PID namespace"])
def test_a_shared_gpu_reads_whole_where_nvml_cannot_tell_processes_apart(
    nvml_stub: NvmlStub, spawn: list[subprocess.Popen[bytes]], why: str
) -> None:
    """Without per-process readings (an old driver, a GPU that has none) or with processes
    NVML names that this host's /proc does not show (an agent in a container), the job's
    reading is the whole GPU's: an idle share is then kept, never a busy one terminated.
    (A process that ended a moment ago but is still listed makes that one reading whole.)"""
    job = _start(spawn, "sleep", "60")
    nvml_stub.set_gpus(1)
    nvml_stub.set_utilization(0, 55, memory_used_mib=3_000)
    if why == "not supported":
        nvml_stub.per_process_error = NOT_SUPPORTED
        nvml_stub.set_processes(StubProcess(gpu=0, pid=job, sm_utilization=10))
    else:
        gone = _start(spawn, "true")
        spawn[-1].wait()  # its pid is no process of this host's any more
        nvml_stub.set_processes(
            StubProcess(gpu=0, pid=gone, sm_utilization=45),
            StubProcess(gpu=0, pid=job, sm_utilization=10),  # a pid that happens to exist here
        )
    sampler = NvmlSampler()
    (sample,) = sampler.sample([0], time.time(), {0: {job}}).samples
    assert (sample.utilization, sample.memory_used_mib) == (55.0, 3_000)
    sampler.close()


def test_the_agent_sampler_names_the_job_process_group(
    nvml_stub: NvmlStub, spawn: list[subprocess.Popen[bytes]]
) -> None:
    """NvmlGpuSampler reads a shared GPU for every process of the job's group (the leader's
    children too), and the whole GPU for a GPU the job has to itself."""
    leader = _start(spawn, "bash", "-c", "sleep 60 & sleep 60 & wait")
    deadline = time.time() + 5
    while len(group_pids(leader)) < 3 and time.time() < deadline:
        time.sleep(0.02)
    children = sorted(group_pids(leader) - {leader})
    assert len(children) == 2
    nvml_stub.set_gpus(2)
    nvml_stub.set_utilization(0, 95)
    nvml_stub.set_utilization(1, 95)
    nvml_stub.set_processes(
        StubProcess(gpu=0, pid=children[0], sm_utilization=30, memory_used_mib=100),
        StubProcess(gpu=0, pid=children[1], sm_utilization=15, memory_used_mib=50),
        StubProcess(gpu=1, pid=children[0], sm_utilization=30),
    )
    sampler = NvmlGpuSampler()
    samples = sampler.sample(SampledRun("job", leader, (0, 1), frozenset({0})), time.time())
    assert [(s.gpu, s.utilization, s.memory_used_mib) for s in samples] == [
        (0, 45.0, 150),
        (1, 95.0, 0),
    ]


def test_a_step_of_the_wall_clock_does_not_read_as_idle(
    spawn: list[subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The load is CPU seconds over the seconds between two scans of /proc, by the monotonic
    clock: the wall clock set an hour forward between two samples (NTP, a suspended VM) would
    have read a busy job as idle, which the utilization policy ends."""
    busy = ProcessCpuSampler(_start(spawn, sys.executable, "-c", BUSY))
    time.sleep(0.3)
    assert busy.cpu_percent() is None
    wall = time.time
    monkeypatch.setattr(simulated.time, "time", lambda: wall() + 3600)
    time.sleep(1.5)
    load = busy.cpu_percent()
    assert load is not None and load > 10
