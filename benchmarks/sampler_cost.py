"""CPU a host agent spends sampling GPUs, as a percentage of one core.

Protocol: build the stub NVML library (tests/nvml_stub, C, loaded by the real nvidia-ml-py),
declare `gpus` H100s with varied utilization, and call the product's `NvmlSampler.sample` on
all of them `calls` times, timing the process's CPU time (time.process_time: user + system,
every thread). One call is one sampling pass over the host; the agent makes one every
SAMPLE_INTERVAL_S (5 s, 720 an hour), so the hourly CPU is the per-call CPU times 720.

What it measures is gpuflow's side (pynvml's ctypes calls, building the samples) plus the
stub's (it re-reads its small state file on every NVML call, which stands in for the driver's
ioctl). A real driver's cost per call differs, so treat the figure as the order of magnitude of
gpuflow's overhead, not of NVML's.

    python benchmarks/sampler_cost.py                 # 8 GPUs, 2000 passes
    python benchmarks/sampler_cost.py --gpus 4 --calls 500

`--simulated JOBS`: the simulated GPUs of a sim fleet instead, whose jobs all run on this
machine (the embedded stack, the benchmarks): JOBS processes in sessions of their own (as the
agent starts jobs), each sampled once a round by the product's `SimulatedSampler`, the samples
spread evenly over SAMPLE_INTERVAL_S of wall time as the agents' probes are; CPU per round, with
scans of /proc shared (simulated.SCAN_REUSE_S, the product) and with a scan per sample (0, as
before), alternated in one run.

    python benchmarks/sampler_cost.py --simulated 200 --rounds 3
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from gpuflow.agent import simulated  # noqa: E402
from gpuflow.agent.gpus import NvmlSampler  # noqa: E402
from gpuflow.agent.simulated import SimulatedSampler  # noqa: E402
from gpuflow.specs.fleet import SimulatedUtilization  # noqa: E402
from gpuflow.utilization import SAMPLE_INTERVAL_S  # noqa: E402
from tests.nvml_stub import NvmlStub, build_stub  # noqa: E402

WARMUP_CALLS = 20


def measure_sampler_cpu(gpus: int = 8, calls: int = 2000) -> float:
    """Percent of one core the agent spends sampling `gpus` GPUs at the real rate."""
    with tempfile.TemporaryDirectory(prefix="gpuflow-sampler-cost-") as scratch:
        directory = Path(scratch)
        stub = NvmlStub(library=build_stub(directory), state_file=directory / "state.tsv")
        stub.set_gpus(gpus)
        for index in range(gpus):
            stub.set_utilization(index, (index * 37) % 101, memory_used_mib=1000 * index)
        saved = {name: os.environ.get(name) for name in stub.env()}
        os.environ.update(stub.env())
        sampler = NvmlSampler()
        try:
            indices = list(range(gpus))
            for _ in range(WARMUP_CALLS):
                _check(sampler.sample(indices, 0.0).samples, gpus)
            start = time.process_time()
            for call in range(calls):
                sampler.sample(indices, float(call))
            cpu_s = time.process_time() - start
        finally:
            sampler.close()
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
    passes_per_hour = 3600 / SAMPLE_INTERVAL_S
    return 100 * (cpu_s / calls) * passes_per_hour / 3600


def _check(samples: Sequence[object], gpus: int) -> None:
    if len(samples) != gpus:
        raise RuntimeError(f"the stub answered {len(samples)} of {gpus} GPUs; is it built right?")


def measure_simulated_cpu(jobs: int, rounds: int) -> dict[str, float]:
    """ms of CPU per round of samples of `jobs` jobs, per scan sharing: shared, and one scan per
    sample (alternated, `rounds` each)."""
    processes = [
        subprocess.Popen(["/bin/sh", "-c", "sleep 600"], start_new_session=True)
        for _ in range(jobs)
    ]
    try:
        samplers = [
            SimulatedSampler(source=SimulatedUtilization(), root_pid=p.pid, memory_total_mib=1)
            for p in processes
        ]
        shared = simulated.SCAN_REUSE_S
        spent: dict[str, list[float]] = {"shared": [], "per sample": []}
        for _ in range(rounds):
            for name, reuse in (("shared", shared), ("per sample", 0.0)):
                simulated.SCAN_REUSE_S = reuse
                pause = SAMPLE_INTERVAL_S / jobs
                start = time.process_time()
                for sampler in samplers:
                    sampler.sample([0], time.time())
                    time.sleep(pause)
                spent[name].append(time.process_time() - start)
        simulated.SCAN_REUSE_S = shared
    finally:
        for process in processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    return {name: 1000 * statistics.median(values) for name, values in spent.items()}


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--simulated", type=int, metavar="JOBS", default=0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    if args.simulated:
        found = measure_simulated_cpu(args.simulated, args.rounds)
        for name, ms in found.items():
            pct = 100 * ms / 1000 / SAMPLE_INTERVAL_S
            print(
                f"{args.simulated} sim jobs, scans {name}: {ms:,.0f} ms CPU a round "
                f"({pct:.1f}% of a core at one round every {SAMPLE_INTERVAL_S:g} s)"
            )
        return found["shared"]
    sampler_cpu_pct = measure_sampler_cpu(gpus=args.gpus, calls=args.calls)
    per_pass_ms = sampler_cpu_pct / 100 * SAMPLE_INTERVAL_S * 1000
    print(
        f"sampler_cpu_pct={sampler_cpu_pct:.4f}  ({args.gpus} GPUs, one pass every "
        f"{SAMPLE_INTERVAL_S:g} s, {per_pass_ms:.3f} ms CPU per pass, {args.calls} passes timed)"
    )
    return sampler_cpu_pct


if __name__ == "__main__":
    main()
