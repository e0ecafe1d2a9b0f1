"""Placement benchmark on the openb GPU-cluster trace (Alibaba, FGD paper, USENIX ATC '23).

Protocol (as in the paper's simulator; see ../shared/data/openb/README.md): the 1,213 GPU nodes
of `openb_node_list_gpu_node.csv` form one fleet; the pods of a trace are sorted by name,
shuffled with a seed, then tuned to 130% of the cluster's GPU capacity (random copies drawn with
replacement are appended, or random pods removed) and placed one at a time, with no departures.
Each pod becomes a JobSpec and goes through `gpuflow.scheduler.place` (the product's function)
and `apply_placement`; a pod that fits nowhere is skipped. Reported per trace and scorer:
the share of GPU capacity left unallocated when the arrived GPU demand reaches 100% and 130% of
capacity (mean over seeds), and `place` calls per second (one core, placing + applying only).

    python benchmarks/placement.py                  # everything (4 traces, 10 seeds, 5 scorers)
    python benchmarks/placement.py --quick          # one seed, default trace, default scorer
    python benchmarks/placement.py --json out.json --scorers fragmentation,binpack
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from gpuflow.scheduler import (  # noqa: E402
    FleetSnapshot,
    GpuSlot,
    HostSnapshot,
    Placement,
    Snapshot,
    TypicalRequest,
    apply_placement,
    place,
)
from gpuflow.scheduler.scorers import DEFAULT_WEIGHTS  # noqa: E402
from gpuflow.specs import GPUSpec, JobSpec, ResourcesSpec  # noqa: E402
from gpuflow.status import HostState  # noqa: E402

TRACES = ("default", "gpushare100", "multigpu50", "gpuspec33")
SCORERS = ("fragmentation", "fgd", "binpack", "spread", "random")
VARIANTS = {
    "fgd": (
        "fragmentation",
        {"capacity": 0.0, "capacity_whole": 0.0, "scarcity": 0.0, "idle": 0.0},
    ),
}
"""Benchmark labels for scorer configurations: `fgd` is gpuflow's fragmentation scorer set to
FGD's own fragmentation measure (weights are configuration), the reference it improves on."""
SEEDS = tuple(range(42, 52))
TUNE_RATIO = 1.3
PAPER = {"FGD": 4.77, "BestFit": 7.14, "GpuPacking": 8.22, "Random": 13.70}
"""Unallocated GPU share (%) at 100% arrived demand on `default`, from the paper."""

# GPU memory is not in the trace; it only matters for display.
GPU_MEMORY_MIB = {"V100M16": 16384, "V100M32": 32768, "T4": 15360, "P100": 16384, "A10": 24576}


@dataclass(frozen=True)
class Node:
    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str


@dataclass(frozen=True)
class Pod:
    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int
    gpu_spec: str

    @property
    def gpu_milli_total(self) -> int:
        return self.num_gpu * self.gpu_milli


@dataclass
class Run:
    unallocated_at_100: float
    unallocated_at_130: float
    placements: int
    failed: int
    seconds: float


def load_nodes(path: Path) -> list[Node]:
    with path.open() as handle:
        return [
            Node(
                row["sn"],
                int(row["cpu_milli"]),
                int(row["memory_mib"]),
                int(row["gpu"]),
                row["model"],
            )
            for row in csv.DictReader(handle)
        ]


def load_pods(path: Path) -> list[Pod]:
    with path.open() as handle:
        return [
            Pod(
                row["name"],
                int(row["cpu_milli"]),
                int(row["memory_mib"]),
                int(row["num_gpu"]),
                int(row["gpu_milli"]),
                row.get("gpu_spec") or "",
            )
            for row in csv.DictReader(handle)
        ]


def snapshot_of(
    nodes: list[Node],
    scorer: str,
    workload: list[TypicalRequest],
    weights: dict[str, float] | None = None,
) -> Snapshot:
    hosts = [
        HostSnapshot(
            id=f"openb/{node.name}",
            name=node.name,
            fleet="openb",
            state=HostState.READY,
            os="linux",
            arch="x86_64",
            cpus=node.cpu_milli // 1000,
            memory_mib=node.memory_mib,
            disk_mib=1 << 30,
            backend="cuda",
            simulated=True,
            gpus=[
                GpuSlot(
                    index=i,
                    name=node.model,
                    vendor="nvidia",
                    memory_mib=GPU_MEMORY_MIB.get(node.model, 32768),
                )
                for i in range(node.gpus)
            ],
        )
        for node in nodes
    ]
    fleet = FleetSnapshot(
        name="openb",
        kind="sim",
        scorer=scorer,
        hosts=hosts,
        workload=workload,
        scorer_weights=dict(weights or {}),
    )
    return Snapshot(fleets=[fleet])


def job_of(pod: Pod) -> JobSpec:
    """The pod as a gpuflow job: CPU, memory and GPUs (a fraction below 1000 milli-GPU)."""
    gpu: GPUSpec | None = None
    if pod.num_gpu > 0:
        count = pod.gpu_milli / 1000 if pod.gpu_milli < 1000 else pod.num_gpu
        names = [name for name in pod.gpu_spec.split("|") if name]
        gpu = GPUSpec(names=names, count={"min": count, "max": count})
    resources = ResourcesSpec(
        gpu=gpu,
        cpu={"min": pod.cpu_milli / 1000, "max": pod.cpu_milli / 1000},
        memory={"min": pod.memory_mib, "max": pod.memory_mib},
    )
    return JobSpec(name="pod", commands=["true"], resources=resources)


def workload_of(pods: list[Pod]) -> list[TypicalRequest]:
    """The trace's request mix, as the fleet's typical requests (what FGD assumes is known)."""
    counts = Counter((p.num_gpu, p.gpu_milli, p.cpu_milli, p.memory_mib, p.gpu_spec) for p in pods)
    mix = []
    for (num_gpu, milli, cpu, memory, spec), count in counts.items():
        shared = num_gpu == 1 and 0 < milli < 1000
        mix.append(
            TypicalRequest(
                weight=count,
                gpus=0 if shared else num_gpu,
                gpu_fraction=milli / 1000 if shared else None,
                cpus=cpu / 1000,
                memory_mib=memory,
                gpu_names=frozenset(n for n in spec.split("|") if n),
            )
        )
    return mix


def arrivals(pods: list[Pod], capacity_milli: int, seed: int) -> list[Pod]:
    """Sorted by name, shuffled, then tuned to TUNE_RATIO x capacity (copies or removals)."""
    rng = random.Random(seed)
    order = sorted(pods, key=lambda p: p.name)
    rng.shuffle(order)
    target = TUNE_RATIO * capacity_milli
    total = sum(p.gpu_milli_total for p in order)
    if total > target:
        while total > target and order:
            removed = order.pop(rng.randrange(len(order)))
            total -= removed.gpu_milli_total
        return order
    while True:
        pod = pods[rng.randrange(len(pods))]
        if total + pod.gpu_milli_total > target:
            return order
        order.append(pod)
        total += pod.gpu_milli_total


def run(
    nodes: list[Node],
    pods: list[Pod],
    *,
    seed: int,
    scorer: str,
    jobs: dict[Pod, JobSpec] | None = None,
    weights: dict[str, float] | None = None,
) -> Run:
    """Place one seeded arrival sequence; the allocation is read at 100% and 130% demand."""
    capacity = sum(node.gpus for node in nodes) * 1000
    base, preset = VARIANTS.get(scorer, (scorer, {}))
    snapshot = snapshot_of(nodes, base, workload_of(pods), {**preset, **(weights or {})})
    jobs = {} if jobs is None else jobs
    sequence = arrivals(pods, capacity, seed)
    prepared = []
    for i, pod in enumerate(sequence):
        job = jobs.get(pod)
        if job is None:
            job = jobs[pod] = job_of(pod)
        if scorer == "random":  # random scores hash the job's name: give each arrival its own
            job = job.model_copy(update={"name": f"pod-{seed}-{i}"})
        prepared.append((pod, job))
    arrived = allocated = failed = 0
    at_100: float | None = None
    seconds = 0.0
    clock = time.process_time
    for pod, job in prepared:
        arrived += pod.gpu_milli_total
        start = clock()
        result = place(job, snapshot)
        if isinstance(result, Placement):
            apply_placement(snapshot, result)
            seconds += clock() - start
            allocated += pod.gpu_milli_total
        else:
            seconds += clock() - start
            failed += 1
        if at_100 is None and arrived >= capacity:
            at_100 = allocated
    unallocated = 100 - allocated / capacity * 100
    return Run(
        unallocated_at_100=100 - (allocated if at_100 is None else at_100) / capacity * 100,
        unallocated_at_130=unallocated,
        placements=len(prepared),
        failed=failed,
        seconds=seconds,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace-dir", type=Path, default=ROOT.parent / "shared/data/openb")
    parser.add_argument("--traces", default=",".join(TRACES))
    parser.add_argument("--seeds", default=",".join(str(s) for s in SEEDS))
    parser.add_argument(
        "--scorers", default=None, help=f"default: {','.join(SCORERS)} (--quick: fragmentation)"
    )
    parser.add_argument("--json", type=Path, help="write the results here as JSON")
    parser.add_argument("--quick", action="store_true", help="one seed, default trace")
    parser.add_argument(
        "--weights", default="", help="scorer weights, e.g. binpack=0.05,fragmentation=1"
    )
    args = parser.parse_args(argv)
    traces = ["default"] if args.quick else _split(args.traces)
    seeds = [42] if args.quick else [int(s) for s in _split(args.seeds)]
    scorers = _split(args.scorers or ("fragmentation" if args.quick else ",".join(SCORERS)))
    try:
        weights = {
            key.strip(): float(value)
            for key, _, value in (item.partition("=") for item in _split(args.weights))
        }
    except ValueError:
        parser.error(f"--weights: expected name=number pairs, got {args.weights!r}")
    unknown = sorted(set(weights) - set(DEFAULT_WEIGHTS))
    if unknown:
        parser.error(
            f"--weights: unknown {', '.join(unknown)}; allowed: {', '.join(DEFAULT_WEIGHTS)}"
        )

    from rich.console import Console
    from rich.table import Table

    console = Console()
    nodes = load_nodes(args.trace_dir / "openb_node_list_gpu_node.csv")
    results: dict[str, dict[str, dict[str, float]]] = {}
    for trace in traces:
        pods = load_pods(args.trace_dir / f"openb_pod_list_{trace}.csv")
        jobs: dict[Pod, JobSpec] = {}
        for scorer in scorers:
            runs = []
            with console.status(f"{trace} / {scorer}"):
                for seed in seeds:
                    runs.append(
                        run(nodes, pods, seed=seed, scorer=scorer, jobs=jobs, weights=weights)
                    )
                    console.log(
                        f"{trace} {scorer} seed {seed}: "
                        f"{runs[-1].unallocated_at_100:.2f}% / {runs[-1].unallocated_at_130:.2f}% "
                        f"unallocated, {runs[-1].placements / runs[-1].seconds:,.0f} placements/s"
                    )
            results.setdefault(trace, {})[scorer] = {
                "unallocated_pct_at_100": statistics.fmean(r.unallocated_at_100 for r in runs),
                "unallocated_pct_at_130": statistics.fmean(r.unallocated_at_130 for r in runs),
                "placements_per_s": sum(r.placements for r in runs) / sum(r.seconds for r in runs),
                "failed_pods": statistics.fmean(r.failed for r in runs),
                "seeds": len(runs),
            }
    table = Table(title=f"openb placement, {len(seeds)} seed(s); lower unallocated is better")
    for column in ("trace", "scorer", "unallocated @100%", "unallocated @130%", "placements/s"):
        table.add_column(column, justify="left" if column in ("trace", "scorer") else "right")
    for trace, by_scorer in results.items():
        for scorer, row in by_scorer.items():
            table.add_row(
                trace,
                scorer,
                f"{row['unallocated_pct_at_100']:.2f}%",
                f"{row['unallocated_pct_at_130']:.2f}%",
                f"{row['placements_per_s']:,.0f}",
            )
    console.print(table)
    console.print(
        "paper, default trace, unallocated at 100%: "
        + ", ".join(f"{name} {value:.2f}%" for name, value in PAPER.items())
    )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


def _split(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


if __name__ == "__main__":
    sys.exit(main())
