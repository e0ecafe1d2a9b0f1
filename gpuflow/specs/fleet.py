"""Fleet files: a `local` fleet (this machine), a `sim` fleet (declared hosts without real GPUs)
and an `ssh` fleet (hosts reached with asyncssh)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gpuflow.specs.job import SCORERS, check_name
from gpuflow.specs.resources import BACKENDS, DEFAULT_BACKEND, VENDORS
from gpuflow.specs.units import parse_size_mib

__all__ = ["SCORERS", "FleetSpec", "GpuDecl", "HostDecl", "SimulatedUtilization"]


class GpuDecl(BaseModel):
    """One GPU model on a declared host, `count` times."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    memory: int
    """MiB (write 80GB)."""
    count: int = Field(default=1, ge=1, le=64)
    vendor: str = "nvidia"
    compute_capability: str | None = None

    @field_validator("name")
    @classmethod
    def _upper(cls, value: str) -> str:
        return value.strip().upper()

    @field_validator("memory", mode="before")
    @classmethod
    def _memory(cls, value: Any) -> int:
        return parse_size_mib(value)

    @field_validator("vendor")
    @classmethod
    def _vendor(cls, value: str) -> str:
        if value.lower() not in VENDORS:
            raise ValueError(f"unknown GPU vendor {value!r}; allowed: {', '.join(VENDORS)}")
        return value.lower()


class SimulatedUtilization(BaseModel):
    """Where a simulated GPU's utilization comes from."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: Literal["process_cpu", "constant"] = "process_cpu"
    """process_cpu: the job process tree's CPU load stands in for GPU load."""
    value: float = Field(default=0, ge=0, le=100)
    """Percent, for source=constant."""


class HostDecl(BaseModel):
    """A host of a sim or ssh fleet."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    os: Literal["linux", "macos"] = "linux"
    arch: Literal["x86_64", "arm64"] = "x86_64"
    gpus: list[GpuDecl] = Field(default_factory=list)
    backend: str | None = None
    """cuda, rocm or metal; defaults from the GPU vendor."""
    driver_version: str | None = None
    cpus: int = Field(default=8, ge=1)
    memory: int = 64 * 1024
    """MiB (write 64GB)."""
    disk: int = 500 * 1024
    labels: dict[str, str] = Field(default_factory=dict)
    taints: list[str] = Field(default_factory=list)
    blocks: int | Literal["auto"] = 1
    """Split the host into this many equal blocks (auto: as many as divide GPUs and CPUs)."""
    state: Literal["ready", "not_ready", "unreachable", "maintenance"] = "ready"
    """Sim fleets only: the state the simulated agent reports."""
    # ssh fleets only; the key file's path is stored, never its content
    hostname: str | None = None
    port: int = 22
    user: str | None = None
    identity_file: str | None = None
    python: str = "python3"
    """ssh hosts: the interpreter on the host that has gpuflow installed."""
    known_hosts: str | None = None
    """ssh hosts: a known_hosts file to check the host key against strictly; by default a new
    host's key is accepted and remembered in GPUFLOW_HOME/known_hosts."""
    agent_dir: str | None = None
    """ssh hosts: where the agent keeps its state, logs and secrets on the host
    (default ~/.gpuflow/agent)."""

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return check_name(value, "host name")

    @field_validator("memory", "disk", mode="before")
    @classmethod
    def _size(cls, value: Any) -> int:
        return parse_size_mib(value)

    @field_validator("backend")
    @classmethod
    def _backend(cls, value: str | None) -> str | None:
        if value is not None and value.lower() not in BACKENDS:
            raise ValueError(f"unknown backend {value!r}; allowed: {', '.join(BACKENDS)}")
        return None if value is None else value.lower()

    @field_validator("blocks")
    @classmethod
    def _blocks(cls, value: int | str) -> int | str:
        if isinstance(value, int) and value < 1:
            raise ValueError(f"blocks is {value}; it must be at least 1 or auto")
        return value

    @property
    def gpu_count(self) -> int:
        return sum(gpu.count for gpu in self.gpus)

    @property
    def effective_backend(self) -> str | None:
        if self.backend:
            return self.backend
        return DEFAULT_BACKEND.get(self.gpus[0].vendor) if self.gpus else None

    def block_count(self) -> int:
        """Blocks after resolving `auto`; checks that GPUs and CPUs divide evenly."""
        gpus = self.gpu_count
        if self.blocks == "auto":
            best = 1
            for n in range(1, max(gpus, 1) + 1):
                if gpus % n == 0 and self.cpus % n == 0:
                    best = n
            return best
        assert isinstance(self.blocks, int)
        return self.blocks

    @model_validator(mode="after")
    def _blocks_divide(self) -> HostDecl:
        if (
            isinstance(self.blocks, int)
            and self.blocks > 1
            and (self.gpu_count % self.blocks or self.cpus % self.blocks)
        ):
            raise ValueError(
                f"host {self.name}: blocks={self.blocks} must divide its "
                f"{self.gpu_count} GPUs and {self.cpus} CPUs evenly"
            )
        return self


class FleetSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["fleet"] = "fleet"
    name: str
    kind: Literal["local", "sim", "ssh"]
    hosts: list[HostDecl] = Field(default_factory=list)
    scorer: str = "fragmentation"
    scorer_weights: dict[str, float] = Field(default_factory=dict)
    """Weights of the scorer terms (configuration, not code)."""
    labels: dict[str, str] = Field(default_factory=dict)
    """Labels applied to every host of the fleet."""
    blocks: int | Literal["auto"] | None = None
    """Local fleet only: split this machine into blocks."""
    utilization: SimulatedUtilization = Field(default_factory=SimulatedUtilization)
    """Sim fleets only: where simulated GPU utilization comes from."""

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return check_name(value, "fleet name")

    @field_validator("scorer")
    @classmethod
    def _scorer(cls, value: str) -> str:
        if value not in SCORERS:
            raise ValueError(f"unknown scorer {value!r}; allowed: {', '.join(SCORERS)}")
        return value

    @field_validator("scorer_weights")
    @classmethod
    def _scorer_weights(cls, value: dict[str, float]) -> dict[str, float]:
        # The scheduler owns the weights and their defaults (imported here, not at module
        # level: the scheduler reads job specs).
        from gpuflow.scheduler.scorers import DEFAULT_WEIGHTS

        unknown = sorted(set(value) - set(DEFAULT_WEIGHTS))
        if unknown:
            raise ValueError(
                f"unknown scorer weight {', '.join(map(repr, unknown))}; "
                f"allowed: {', '.join(DEFAULT_WEIGHTS)}"
            )
        negative = sorted(name for name, weight in value.items() if not weight >= 0)
        if negative:
            raise ValueError(f"scorer weights must be 0 or more: {', '.join(negative)}")
        return value

    @model_validator(mode="after")
    def _hosts(self) -> FleetSpec:
        if self.kind == "local" and self.hosts:
            raise ValueError("a local fleet describes this machine itself; remove `hosts`")
        if self.kind in ("sim", "ssh") and not self.hosts:
            raise ValueError(f"a {self.kind} fleet needs at least one entry in `hosts`")
        names = [host.name for host in self.hosts]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"host names must be unique; repeated: {', '.join(duplicates)}")
        if self.kind == "ssh":
            for host in self.hosts:
                if not host.hostname:
                    raise ValueError(f"ssh host {host.name} needs `hostname`")
        return self
