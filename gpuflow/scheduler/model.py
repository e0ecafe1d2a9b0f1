"""Data the scheduler reads and returns.

The snapshot types are plain dataclasses: the scheduler runs thousands of passes a second over
them and they never cross Temporal. What placement returns (Placement, Unschedulable) are
pydantic models, because activities return them to the job workflow.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field

from gpuflow.status import HostState


@dataclass
class GpuSlot:
    index: int
    name: str
    """Upper-case model name, e.g. `A100`."""
    vendor: str
    memory_mib: int
    compute_capability: str | None = None
    uuid: str | None = None
    used: float = 0.0
    """Share of this GPU already allocated: 0 free, 1 fully taken, in between shared."""


@dataclass
class HostSnapshot:
    id: str
    """`<fleet>/<name>`; unique across fleets."""
    name: str
    fleet: str
    state: HostState
    os: str
    arch: str
    cpus: int
    memory_mib: int
    disk_mib: int
    gpus: list[GpuSlot] = field(default_factory=list)
    backend: str | None = None
    """cuda, rocm, metal or None (no GPU runtime)."""
    driver_version: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    taints: list[str] = field(default_factory=list)
    """`key=value` or `key`; a job must tolerate every taint of a host it lands on."""
    blocks: int = 1
    """Equal parts the host is split into; 1 means not split."""
    blocks_used: set[int] = field(default_factory=set)
    """Indices of blocks taken. Block i holds GPUs [i*g, (i+1)*g) with g = len(gpus)/blocks."""
    cpus_used: float = 0.0
    memory_used_mib: int = 0
    disk_used_mib: int = 0
    state_detail: str | None = None
    """Why the host is not ready, for explanations, e.g. `last heartbeat 3m ago`."""
    simulated: bool = False
    address: str = "127.0.0.1"
    """Where other nodes of a multi-node job reach this host (MASTER_ADDR)."""
    task_queue: str = ""

    @property
    def idle(self) -> bool:
        """Nothing allocated at all (what gangs need)."""
        return (
            not self.blocks_used
            and self.cpus_used == 0
            and self.memory_used_mib == 0
            and all(gpu.used == 0 for gpu in self.gpus)
        )


@dataclass(frozen=True)
class TypicalRequest:
    """One kind of request a fleet usually sees, with its share of the requests.

    The fragmentation scorer keeps capacity usable for this mix; the store can derive it from
    the fleet's recent jobs (one entry per distinct request, `weight` = how often it came).
    """

    weight: float
    gpus: int = 0
    """Whole GPUs per node; 0 with `gpu_fraction` unset means a CPU-only job."""
    gpu_fraction: float | None = None
    """Share of one GPU, for GPU-sharing jobs."""
    cpus: float = 0
    memory_mib: int = 0
    gpu_names: frozenset[str] = frozenset()
    """Acceptable GPU models (upper case); empty accepts any."""


@dataclass
class FleetSnapshot:
    name: str
    kind: str
    scorer: str = "fragmentation"
    scorer_weights: dict[str, float] = field(default_factory=dict)
    hosts: list[HostSnapshot] = field(default_factory=list)
    workload: list[TypicalRequest] = field(default_factory=list)
    """The fleet's usual request mix (fragmentation scorer); empty uses a built-in mix."""


@dataclass
class Snapshot:
    fleets: list[FleetSnapshot] = field(default_factory=list)

    def hosts(self) -> list[HostSnapshot]:
        return [host for fleet in self.fleets for host in fleet.hosts]


class NodePlacement(BaseModel):
    """What one node of a job gets on one host."""

    model_config = ConfigDict(frozen=True)

    rank: int
    host_id: str
    host_name: str
    fleet: str
    task_queue: str
    address: str = "127.0.0.1"
    gpu_indices: list[int] = Field(default_factory=list)
    gpu_names: list[str] = Field(default_factory=list)
    gpu_fraction: float | None = None
    """Set when the job shares one GPU: its share of `gpu_indices[0]`."""
    blocks: list[int] = Field(default_factory=list)
    cpus: float = 0
    memory_mib: int = 0
    disk_mib: int = 0
    simulated: bool = False


class Placement(BaseModel):
    model_config = ConfigDict(frozen=True)

    fleet: str
    nodes: list[NodePlacement]
    score: float = 0.0
    scorer: str = ""


class Rejection(BaseModel):
    """Why one host (or a whole fleet) cannot take the job; rendered as `host: reason`. A
    long list grouped by reason (scheduler/offers.py `by_reason`) has lines that stand for
    several hosts: `hosts` counts them and `host` names the first few."""

    model_config = ConfigDict(frozen=True)

    host: str
    filter: str
    reason: str
    hosts: int = 1

    def __str__(self) -> str:
        if self.hosts == 1:
            return f"{self.host}: {self.reason}"
        named = f" ({self.host})" if self.host else ""
        return f"{self.hosts:,} hosts{named}: {self.reason}"


class Unschedulable(BaseModel):
    model_config = ConfigDict(frozen=True)

    rejections: list[Rejection]

    @property
    def lines(self) -> list[str]:
        return [str(rejection) for rejection in self.rejections]

    def message(self) -> str:
        if not self.rejections:
            return "no hosts to place on: apply a fleet first (gpuflow fleet apply -f FILE)"
        return "no host fits the job:\n  " + "\n  ".join(self.lines)
