"""The NVML path on a real GPU: what a host agent registers and samples, and what the
utilization policy makes of it.

Everything else in the suite runs NVML code against the stub library (tests/nvml_stub); this
script is for a machine with an NVIDIA driver and PyTorch (for the load it puts on GPU 0):

1. discovery: `inspect_gpus()`, the GpuInfo an agent registers (model name as jobs write it);
2. cost: `NvmlSampler.sample` over every GPU, wall and CPU per pass against the real driver;
3. idle, then busy: GPU 0 read while nothing runs, then while a PyTorch process multiplies
   matrices on it; the readings go through the product's `utilization.update`/`verdict` with
   a policy of `--threshold`% over `--window` seconds (the spec's minimum is a minute; the
   window here is shorter so the check stays short, built past the spec's validation);
4. sharing: a second process holds GPU memory and computes nothing; the sampler reads GPU 0
   for each process alone (`own`, as for a job holding a GPU fraction) and for the whole GPU.

    python benchmarks/nvml_real.py [--json PATH] [--seconds 8]

Prints one line per check and exits non-zero when a check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from gpuflow import utilization  # noqa: E402
from gpuflow.agent.gpus import NvmlSampler, inspect_gpus  # noqa: E402
from gpuflow.specs.job import UtilizationPolicy  # noqa: E402
from gpuflow.utilization import GpuSample  # noqa: E402

BUSY = """
import sys, time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
print("ready", flush=True)
end = time.time() + float(sys.argv[1])
while time.time() < end:
    for _ in range(20):
        a @ a
    torch.cuda.synchronize()
"""
HOLD = """
import sys, time, torch
a = torch.empty(int(sys.argv[1]) << 20, dtype=torch.uint8, device="cuda")
print("ready", flush=True)
time.sleep(float(sys.argv[2]))
"""


def _start(code: str, *args: str) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [sys.executable, "-c", code, *args], stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None
    if process.stdout.readline().strip() != "ready":
        raise RuntimeError(f"load process failed (exit {process.wait()})")
    return process


def _phase(
    sampler: NvmlSampler, seconds: float, own: dict[int, set[int]] | None = None
) -> list[GpuSample]:
    readings: list[GpuSample] = []
    end = time.time() + seconds
    while time.time() < end:
        batch = sampler.sample([0], time.time(), own)
        if batch.errors:
            raise RuntimeError(f"sampling failed: {batch.errors[0].message}")
        readings += batch.samples
        time.sleep(0.5)
    return readings


def _processes(*pids: int) -> dict[str, Any]:
    """What NVML itself says of GPU 0's processes: the PIDs it lists (and whether this host's
    /proc has them: `_own_usage` falls back to the whole GPU when not), and its per-process SM
    samples (or the error): the two readings a GPU fraction's utilization rests on."""
    import pynvml

    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        listed = [
            {
                "pid": int(p.pid),
                "in_proc": os.path.exists(f"/proc/{int(p.pid)}"),
                "memory_mib": int(p.usedGpuMemory or 0) >> 20,
            }
            for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
        ]
        try:
            since = int((time.time() - 5) * 1_000_000)
            samples: Any = [
                {"pid": int(s.pid), "sm": int(s.smUtil)}
                for s in pynvml.nvmlDeviceGetProcessUtilization(handle, since)
            ]
        except pynvml.NVMLError as exc:
            samples = f"NVML error: {exc}"
    finally:
        pynvml.nvmlShutdown()
    print(
        f"our load PIDs {list(pids)}; NVML lists {listed}; per-process samples: "
        f"{samples if isinstance(samples, str) else samples[-6:]}"
    )
    return {"ours": list(pids), "listed": listed, "samples": samples}


def _policy_verdict(readings: list[GpuSample], threshold: int, window_s: int) -> str | None:
    policy = UtilizationPolicy.model_construct(min_gpu_utilization=threshold, time_window=window_s)
    state = utilization.UtilizationState()
    utilization.update(state, 0, readings, policy=policy)
    found = utilization.verdict(state, policy)
    return None if found is None else found.message


def run(seconds: float, threshold: int, window_s: int) -> dict[str, Any]:
    found = inspect_gpus()
    result: dict[str, Any] = {"discovery": found.model_dump(mode="json")}
    print(f"driver {found.driver_version}; unavailable: {found.unavailable_reason}")
    for gpu in found.gpus:
        print(
            f"GPU {gpu.index}: {gpu.name} ({gpu.full_name}), {gpu.memory_mib} MiB, "
            f"compute {gpu.compute_capability}, {gpu.uuid}"
        )
    if not found.gpus:
        raise SystemExit("no GPU: nothing more to check")
    sampler = NvmlSampler()
    indices = [gpu.index for gpu in found.gpus]
    sampler.sample(indices, time.time())
    wall, cpu, passes = time.perf_counter(), time.process_time(), 200
    for _ in range(passes):
        sampler.sample(indices, time.time())
    result["pass_wall_ms"] = 1000 * (time.perf_counter() - wall) / passes
    result["pass_cpu_ms"] = 1000 * (time.process_time() - cpu) / passes
    print(
        f"sample pass over {len(indices)} GPUs: {result['pass_wall_ms']:.3f} ms wall, "
        f"{result['pass_cpu_ms']:.3f} ms CPU"
    )

    idle = _phase(sampler, seconds)
    hold = _start(HOLD, "2048", str(4 * seconds + 30))
    busy_process = _start(BUSY, str(3 * seconds + 10))
    time.sleep(2)
    busy = _phase(sampler, seconds)
    mine = _phase(sampler, seconds, {0: {busy_process.pid}})
    theirs = _phase(sampler, seconds, {0: {hold.pid}})
    result["processes"] = _processes(busy_process.pid, hold.pid)
    busy_process.kill()
    hold.kill()
    busy_process.wait()
    hold.wait()

    def summary(name: str, readings: list[GpuSample]) -> dict[str, float]:
        values = [r.utilization for r in readings]
        memory = [r.memory_used_mib for r in readings]
        row = {
            "samples": len(values),
            "util_min": min(values),
            "util_max": max(values),
            "util_mean": sum(values) / len(values),
            "memory_mib_max": max(memory),
        }
        print(
            f"{name:>24}: {row['samples']} samples, utilization {row['util_min']:.0f}-"
            f"{row['util_max']:.0f}% (mean {row['util_mean']:.1f}), memory up to "
            f"{row['memory_mib_max']} MiB"
        )
        return row

    result["idle"] = summary("idle", idle)
    result["busy"] = summary("busy (whole GPU)", busy)
    result["own_busy"] = summary("busy process alone", mine)
    result["own_idle"] = summary("memory-only process alone", theirs)
    result["verdict_idle"] = _policy_verdict(idle, threshold, window_s)
    result["verdict_busy"] = _policy_verdict(busy, threshold, window_s)
    result["verdict_own_idle"] = _policy_verdict(theirs, threshold, window_s)
    for key in ("verdict_idle", "verdict_busy", "verdict_own_idle"):
        print(f"policy <{threshold}% for {window_s} s, {key[8:]}: {result[key]}")
    checks = {
        "idle reads below the threshold": result["idle"]["util_max"] < threshold,
        "busy reads above the threshold": result["busy"]["util_min"] >= threshold,
        "policy fires on idle": result["verdict_idle"] is not None,
        "policy spares busy": result["verdict_busy"] is None,
        "busy process's own reading is busy": result["own_busy"]["util_mean"] >= threshold,
        "memory-only process's own reading is idle": result["own_idle"]["util_max"] < threshold,
        "memory-only process's own memory is its own": (
            1900 <= result["own_idle"]["memory_mib_max"] <= 2600
        ),
    }
    result["checks"] = checks
    for name, ok in checks.items():
        print(f"{'ok  ' if ok else 'FAIL'} {name}")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path)
    parser.add_argument("--seconds", type=float, default=8.0, help="length of each phase")
    parser.add_argument("--threshold", type=int, default=10)
    args = parser.parse_args(argv)
    window = max(2, int(args.seconds) - 2)
    result = run(args.seconds, args.threshold, window)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0 if all(result["checks"].values()) else 1


if __name__ == "__main__":
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    raise SystemExit(main())
