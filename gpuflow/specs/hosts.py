"""The hosts of a fleet file (gpuflow/specs/fleet.py): a sim host's declared GPUs, CPUs and
state, an ssh host's address and login, and what both take (labels, taints, blocks)."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import (
    BaseModel,
    Field,
    ValidationInfo,
    field_serializer,
    field_validator,
    model_validator,
)

from gpuflow.specs.job import (
    MAX_ITEMS,
    MAX_TEXT,
    SPEC_CONFIG,
    check_labels,
    check_name,
)
from gpuflow.specs.resources import (
    BACKENDS,
    DEFAULT_BACKEND,
    MAX_CPUS_PER_NODE,
    MAX_GPUS_PER_NODE,
    VENDORS,
    check_version,
    one_of,
)
from gpuflow.specs.units import (
    MAX_MEMORY_MIB,
    SizeMiB,
    check_taints,
    check_text,
    format_size_mib,
    parse_size_mib,
    recorded,
    shown,
    whole_count,
)

__all__ = ["GpuDecl", "HostDecl", "SimulatedUtilization", "check_blocks"]

_HOSTNAME = re.compile(r"(?!-)[A-Za-z0-9_.:\[\]%-]{1,253}")
_USER = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_.@-]{0,63}")


def check_blocks(value: int | str) -> int | str:
    """A host's (or a local fleet's) `blocks`: a whole number 1..MAX_CPUS_PER_NODE, or auto."""
    if isinstance(value, int) and not 1 <= value <= MAX_CPUS_PER_NODE:
        raise ValueError(
            f"{shown(value)} is not a number of blocks; use a whole number, "
            f"1..{MAX_CPUS_PER_NODE}, or auto"
        )
    return value


def _size_json(mib: int) -> str:
    """A size as JSON: with its unit, so that the spec reads back the same (a bare number is
    read as GB); the spec travels as JSON to the control plane (gpuflow/workflows/api.py)."""
    return f"{mib}MB"


class GpuDecl(BaseModel):
    """One GPU model on a declared host, `count` times."""

    model_config = SPEC_CONFIG

    name: str = Field(examples=["A100"])
    """The GPU model, as jobs name it in `resources.gpu` (case does not matter)."""
    memory: SizeMiB = Field(ge=1, examples=["80GB"])
    """Memory of each of these GPUs, a size (write 80GB)."""
    count: int = Field(default=1, ge=1, le=MAX_GPUS_PER_NODE, examples=[4])
    """How many GPUs of this model the host has."""
    vendor: str = Field(default="nvidia", examples=["amd"])
    """The GPU maker; it also decides the host's default `backend`."""
    compute_capability: str | None = Field(default=None, examples=["8.0"])
    """CUDA compute capability, in quotes. Omitted: unknown, so jobs that ask for a minimum
    capability do not fit."""

    @field_validator("count", mode="before")
    @classmethod
    def _count(cls, value: Any) -> Any:
        return whole_count(value, "GPUs", least=1, most=MAX_GPUS_PER_NODE)

    @field_validator("name")
    @classmethod
    def _upper(cls, value: str) -> str:
        return check_text(value.strip(), "GPU name", max_length=64).upper()

    @field_validator("memory", mode="before")
    @classmethod
    def _memory(cls, value: Any) -> int:
        return parse_size_mib(value)

    @field_serializer("memory", when_used="json")
    def _memory_json(self, mib: int) -> str:
        return _size_json(mib)

    @field_validator("vendor")
    @classmethod
    def _vendor(cls, value: str) -> str:
        return one_of(value, VENDORS, "GPU vendor") or value

    @field_validator("compute_capability", mode="before")
    @classmethod
    def _capability(cls, value: Any) -> Any:
        return check_version(value, "compute capability")


class SimulatedUtilization(BaseModel):
    """Where a simulated GPU's utilization comes from."""

    model_config = SPEC_CONFIG

    source: Literal["process_cpu", "constant"] = Field(default="process_cpu", examples=["constant"])
    """`process_cpu`: the CPU load of the job's processes stands in for GPU load; `constant`:
    every simulated GPU reports `value`."""
    value: float = Field(default=0, ge=0, le=100, examples=[75])
    """Utilization in percent that simulated GPUs report when `source` is `constant`."""


class HostDecl(BaseModel):
    """A host of a sim or ssh fleet."""

    model_config = SPEC_CONFIG

    name: str = Field(examples=["gpu-1"])
    """The host's name in gpuflow (`placement.hosts`, `gpuflow fleet list`); unique in the
    fleet."""
    os: Literal["linux", "macos"] = Field(default="linux", examples=["macos"])
    """Sim hosts: the operating system declared (ssh hosts report their own)."""
    arch: Literal["x86_64", "arm64"] = Field(default="x86_64", examples=["arm64"])
    """Sim hosts: the CPU architecture declared (ssh hosts report their own)."""
    gpus: list[GpuDecl] = Field(
        default_factory=list,
        max_length=MAX_GPUS_PER_NODE,
        examples=[[{"name": "A100", "memory": "80GB", "count": 4}]],
    )
    """Sim hosts: the GPUs declared, one entry per model, numbered from 0 in this order (ssh
    hosts report theirs through NVML). Omitted: a host without GPUs."""
    backend: str | None = Field(default=None, examples=["cuda"])
    """Sim hosts: the GPU software stack. Omitted: the first GPU's vendor's (nvidia: cuda,
    amd: rocm, apple: metal)."""
    driver_version: str | None = Field(default=None, examples=["535.104.05"])
    """Sim hosts: the GPU driver version, in quotes. Omitted: unknown, so jobs with
    `min_driver` do not fit."""
    cpus: int = Field(default=8, ge=1, le=MAX_CPUS_PER_NODE, examples=[32])
    """Sim hosts: CPU cores declared (ssh hosts report their own)."""
    memory: SizeMiB = Field(default=64 * 1024, ge=1, examples=["256GB"])
    """Sim hosts: memory declared, a size (write 64GB; at most 64TB; ssh hosts report their
    own)."""
    disk: SizeMiB = Field(default=500 * 1024, ge=0, examples=["2TB"])
    """Sim hosts: free disk declared, a size (ssh hosts report the free space of the agent's
    directory)."""
    labels: dict[str, str] = Field(
        default_factory=dict, max_length=MAX_ITEMS, examples=[{"zone": "eu-1"}]
    )
    """Labels of this host, added to the fleet's `labels` (the host's value wins on the same
    key); a job's `labels` must all be here for the host to take it."""
    taints: list[str] = Field(default_factory=list, max_length=MAX_ITEMS, examples=[["gpu-only"]])
    """`key=value` or `key`: the host takes only jobs whose `tolerations` cover every taint.
    A GPU host without taints takes CPU-only jobs too. Letters, digits, `-`, `_`, `.`; a key of
    at most 253 characters (after an optional `prefix/`, e.g. `example.com/gpu-only`), a value
    of at most 63."""
    blocks: int | Literal["auto"] = Field(default=1, examples=["auto"])
    """Split the host into this many equal blocks of GPUs, CPUs, memory and disk; a job holds
    whole blocks and no GPU fractions are offered. The count must divide the GPUs and CPUs
    evenly; `auto`: the most blocks that do, at most one per GPU."""
    state: Literal["ready", "not_ready", "unreachable", "maintenance"] = Field(
        default="ready", examples=["maintenance"]
    )
    """Sim fleets only: the state the simulated agent reports; only `ready` hosts take jobs."""
    # ssh fleets only; the key file's path is stored, never its content
    hostname: str | None = Field(default=None, examples=["gpu-1.example.com"])
    """Ssh hosts (required there): the DNS name or IP address to connect to."""
    port: int = Field(default=22, ge=1, le=65535, examples=[2222])
    """Ssh hosts: the SSH port."""
    user: str | None = Field(default=None, examples=["ml"])
    """Ssh hosts: the login name. Omitted: the name of the user running gpuflow."""
    identity_file: str | None = Field(default=None, examples=["~/.ssh/id_ed25519"])
    """Ssh hosts: the private key file to log in with, then the only key offered; only its
    path is stored. Omitted: the keys of the SSH agent and the default key files."""
    python: str = Field(default="python3", examples=["/opt/gpuflow/bin/python"])
    """Ssh hosts: the interpreter on the host that has gpuflow installed."""
    known_hosts: str | None = Field(default=None, examples=["~/.ssh/known_hosts"])
    """Ssh hosts: a known_hosts file to check the host key against strictly. Omitted: a new
    host's key is accepted and remembered in GPUFLOW_HOME/known_hosts."""
    agent_dir: str | None = Field(default=None, examples=["/var/lib/gpuflow"])
    """Ssh hosts: where the agent keeps its state, logs and secrets on the host. Omitted:
    ~/.gpuflow/agent."""

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return check_name(value, "host name")

    @field_validator("gpus", mode="before")
    @classmethod
    def _gpus(cls, value: Any) -> Any:
        if isinstance(value, int | float) and not isinstance(value, bool):
            raise ValueError(
                f"{shown(value)} is not a list of GPUs; write one entry per GPU model, "
                "e.g. [{name: A100, memory: 80GB, count: 4}]"
            )
        return value

    @field_validator("cpus", mode="before")
    @classmethod
    def _cpus(cls, value: Any) -> Any:
        return whole_count(value, "CPUs", least=1, most=MAX_CPUS_PER_NODE)

    @field_validator("memory", mode="before")
    @classmethod
    def _memory(cls, value: Any, info: ValidationInfo) -> int:
        mib = parse_size_mib(value)
        if mib > MAX_MEMORY_MIB and not recorded(info):
            asked = shown(value) if isinstance(value, str) else format_size_mib(mib)
            raise ValueError(f"{asked} is above {format_size_mib(MAX_MEMORY_MIB)} per host")
        return mib

    @field_validator("disk", mode="before")
    @classmethod
    def _disk(cls, value: Any) -> int:
        return parse_size_mib(value)

    @field_serializer("memory", "disk", when_used="json")
    def _size_json(self, mib: int) -> str:
        return _size_json(mib)

    @field_validator("backend")
    @classmethod
    def _backend(cls, value: str | None) -> str | None:
        return one_of(value, BACKENDS, "backend")

    @field_validator("driver_version", mode="before")
    @classmethod
    def _driver(cls, value: Any) -> Any:
        return check_version(value, "driver_version")

    @field_validator("labels")
    @classmethod
    def _labels(cls, value: dict[str, str]) -> dict[str, str]:
        return check_labels(value)

    @field_validator("taints")
    @classmethod
    def _taints(cls, value: list[str], info: ValidationInfo) -> list[str]:
        return check_taints(value, "taint", info)

    @field_validator("hostname")
    @classmethod
    def _hostname(cls, value: str | None) -> str | None:
        if value is not None and not _HOSTNAME.fullmatch(value):
            raise ValueError(
                f"hostname {shown(value)} must be a DNS name or an IP address "
                "(letters, digits, '.', '-', ':')"
            )
        return value

    @field_validator("user")
    @classmethod
    def _user(cls, value: str | None) -> str | None:
        if value is not None and not _USER.fullmatch(value):
            raise ValueError(
                f"user {shown(value)} must be a login name (letters, digits, '_', '.', '-')"
            )
        return value

    def ssh_settings(self) -> dict[str, Any]:
        """How to reach this host over SSH, as the store keeps it and gpuflow.ssh reads it back
        into a target (gpuflow.ssh.provisioning.ssh_target): the one list of these fields."""
        return {
            "hostname": self.hostname,
            "port": self.port,
            "user": self.user,
            "identity_file": self.identity_file,
            "python": self.python,
            "known_hosts": self.known_hosts,
            "state_dir": self.agent_dir,
        }

    @field_validator("identity_file", "python", "known_hosts", "agent_dir")
    @classmethod
    def _path(cls, value: str | None) -> str | None:
        return None if value is None else check_text(value, "path", max_length=MAX_TEXT)

    @field_validator("blocks")
    @classmethod
    def _blocks(cls, value: int | str) -> int | str:
        return check_blocks(value)

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
