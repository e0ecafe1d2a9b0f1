"""The openb trace (Alibaba's GPU cluster, FGD paper, USENIX ATC '23) as gpuflow sees it: its
GPU nodes and pods read from the CSV files, fleets of other shapes made from the same GPUs, the
nodes as a fleet snapshot and each pod as a job spec. Shared by the benchmarks that replay the
trace (placement.py, queueing.py, fleet_scale.py, admission_scale.py); see
../shared/data/openb/README.md for the files.
"""

from __future__ import annotations

import csv
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from gpuflow.scheduler import FleetSnapshot, GpuSlot, HostSnapshot, Snapshot, TypicalRequest
from gpuflow.scheduler.mix import LearnedMix, MixLearner, half_life, kind_of
from gpuflow.specs import GPUSpec, JobSpec, ResourcesSpec
from gpuflow.status import HostState

FLEETS = ("openb", "2gpu", "1gpu", "lowcpu")
"""`openb`: the trace's GPU nodes. The others are shapes of our own making from the same GPUs
(to check that defaults are not fitted to openb's): every node split into nodes of 2 GPUs (or
1), CPUs and memory split with them; or the openb nodes with 4 CPUs per GPU at most (openb: 8 to
52, mostly 12; `--cpus-per-gpu`)."""
LOW_CPUS_PER_GPU = 4

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


POD_LISTS = "openb_pod_list_"


def trace_names(trace_dir: Path) -> list[str]:
    """The traces in a folder: NAME for each `openb_pod_list_NAME.csv` (the openb release has
    24: `default` and its variants with more GPU sharing, multi-GPU, GPU-model-bound or CPU-only
    pods)."""
    found = sorted(trace_dir.glob(f"{POD_LISTS}*.csv"))
    return [path.name[len(POD_LISTS) : -len(".csv")] for path in found]


def unknown_traces(trace_dir: Path, names: list[str]) -> str | None:
    """Why some of these traces cannot be read from the folder, or None when all can."""
    if not (trace_dir / "openb_node_list_gpu_node.csv").is_file():
        return f"{trace_dir}: no openb_node_list_gpu_node.csv (--trace-dir: openb's csv folder)"
    known = trace_names(trace_dir)
    missing = [name for name in names if name not in known]
    if not missing:
        return None
    return (
        f"no {', '.join(POD_LISTS + name + '.csv' for name in missing)} in {trace_dir}; "
        f"traces there: {', '.join(known) or 'none'}"
    )


def load_pods(path: Path) -> list[Pod]:
    with path.open() as handle:
        return [pod_of(row) for row in csv.DictReader(handle)]


def pod_of(row: dict[str, str]) -> Pod:
    """A row of an `openb_pod_list_*.csv` file; queue_sim.py reads its times and QoS itself."""
    return Pod(
        row["name"],
        int(row["cpu_milli"]),
        int(row["memory_mib"]),
        int(row["num_gpu"]),
        int(row["gpu_milli"]),
        row.get("gpu_spec") or "",
    )


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


class OnlineMix:
    """A fleet's request mix learned as the product learns it, from the jobs that arrived so far
    (a job counts once submitted): each arrival goes through the product's MixLearner, and the
    fleet's `workload` is replaced whenever the learned mix has drifted from the one in use
    (`MixLearner.refreshed`, what a control worker's stored mix in use follows)."""

    def __init__(self, fleet: FleetSnapshot) -> None:
        self.fleet = fleet
        self.learner = MixLearner(half_life(sum(len(host.gpus) for host in fleet.hosts)))
        self.in_use: LearnedMix | None = None

    def arrived(self, job: JobSpec) -> None:
        self.learner.observe(*kind_of(job))
        fresh = self.learner.refreshed(self.in_use)
        if fresh is not None:
            self.in_use = fresh
            self.fleet.workload = list(fresh.requests)


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


def fleet_of(nodes: list[Node], shape: str, cpus_per_gpu: int = LOW_CPUS_PER_GPU) -> list[Node]:
    """The openb nodes, or a synthetic fleet of the same GPUs (see FLEETS)."""
    if shape == "openb":
        return nodes
    if shape == "lowcpu":
        return [
            Node(n.name, min(n.cpu_milli, cpus_per_gpu * 1000 * n.gpus), *_rest(n)) for n in nodes
        ]
    size = {"2gpu": 2, "1gpu": 1}[shape]
    out = []
    for node in nodes:
        parts = max(1, node.gpus // size)
        for i in range(parts):
            gpus = node.gpus - size * (parts - 1) if i == parts - 1 else size
            out.append(
                Node(
                    f"{node.name}-{i}",
                    node.cpu_milli * gpus // node.gpus,
                    node.memory_mib * gpus // node.gpus,
                    gpus,
                    node.model,
                )
            )
    return out


def _rest(node: Node) -> tuple[int, int, str]:
    return node.memory_mib, node.gpus, node.model
