"""Fleet files: a `local` fleet (this machine), a `sim` fleet (declared hosts without real GPUs)
and an `ssh` fleet (hosts reached with asyncssh)."""

from __future__ import annotations

from typing import Literal

from pydantic import (
    BaseModel,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from gpuflow.specs.hosts import GpuDecl as GpuDecl
from gpuflow.specs.hosts import HostDecl as HostDecl
from gpuflow.specs.hosts import SimulatedUtilization as SimulatedUtilization
from gpuflow.specs.hosts import check_blocks
from gpuflow.specs.job import (
    MAX_ITEMS,
    SPEC_CONFIG,
    check_labels,
    check_name,
)
from gpuflow.specs.scoring import DEFAULT_SCORER, DEFAULT_WEIGHTS, SCORERS
from gpuflow.specs.units import recorded, shown

MAX_HOSTS = 4096
"""Most hosts in one fleet file."""
MAX_SCORER_WEIGHT = 1000.0

__all__ = ["SCORERS", "FleetSpec", "GpuDecl", "HostDecl", "SimulatedUtilization"]


_SIM_ONLY = frozenset(
    {"os", "arch", "gpus", "backend", "driver_version", "cpus", "memory", "disk", "state"}
)
"""Host fields only a sim host reads (an ssh host reports its own facts and state)."""
_SSH_ONLY = frozenset(
    {"hostname", "port", "user", "identity_file", "python", "known_hosts", "agent_dir"}
)
_SSH_HINT = (
    " (an ssh host reports its own facts; to take it out of use, remove it from the file: "
    "its running jobs finish first)"
)


class FleetSpec(BaseModel):
    model_config = SPEC_CONFIG

    type: Literal["fleet"] = Field(default="fleet", examples=["fleet"])
    """The kind of file: a fleet file must say `fleet`."""
    name: str = Field(examples=["on-prem"])
    """The fleet's name, as jobs list it in `fleets`; applying a file with the same name
    updates that fleet."""
    kind: Literal["local", "sim", "ssh"] = Field(examples=["sim"])
    """`local`: this machine, found by itself (no `hosts`); `sim`: the `hosts` declared, with
    simulated GPUs, jobs running on this machine; `ssh`: the `hosts`, reached over SSH."""
    hosts: list[HostDecl] = Field(
        default_factory=list,
        max_length=MAX_HOSTS,
        examples=[[{"name": "gpu-1", "hostname": "gpu-1.example.com"}]],
    )
    """The hosts of a sim or ssh fleet (at least one, names unique); a local fleet has none."""
    scorer: str = Field(default=DEFAULT_SCORER, examples=["binpack"])
    """How to rank the hosts that fit a job (a job's own `scorer` wins): `fragmentation` keeps
    whole GPUs and hosts free for the jobs that need them, `binpack` fills the fullest host
    first, `spread` the emptiest."""
    scorer_weights: dict[str, float] = Field(
        default_factory=dict, examples=[{"cpu": 0.5, "memory": 0}]
    )
    """Weights of the scorer terms, each 0 to 1000; omitted ones keep their defaults.
    `gpu`, `cpu`, `memory` (1, 0.25, 0.25) weigh resources for binpack and spread;
    `fragmentation`, `binpack` (1, 0.05), `capacity`, `capacity_whole` (1, 0.1), `scarcity`
    and `idle` (1, 1) tune the fragmentation scorer."""
    labels: dict[str, str] = Field(
        default_factory=dict, max_length=MAX_ITEMS, examples=[{"team": "research"}]
    )
    """Labels applied to every host of the fleet (a host's own `labels` win on the same key)."""
    blocks: int | Literal["auto"] | None = Field(default=None, examples=[2])
    """Local fleet only: split this machine into equal blocks, as `hosts[].blocks`. Omitted:
    one block."""
    utilization: SimulatedUtilization = Field(
        default_factory=SimulatedUtilization, examples=[{"source": "constant", "value": 75}]
    )
    """Sim fleets only: where simulated GPU utilization comes from."""

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return check_name(value, "fleet name")

    @field_validator("scorer")
    @classmethod
    def _scorer(cls, value: str) -> str:
        if value not in SCORERS:
            raise ValueError(f"unknown scorer {shown(value)}; allowed: {', '.join(SCORERS)}")
        return value

    @field_validator("labels")
    @classmethod
    def _labels(cls, value: dict[str, str]) -> dict[str, str]:
        return check_labels(value)

    @field_validator("blocks")
    @classmethod
    def _blocks(cls, value: int | str | None) -> int | str | None:
        return None if value is None else check_blocks(value)

    @field_validator("scorer_weights")
    @classmethod
    def _scorer_weights(cls, value: dict[str, float]) -> dict[str, float]:
        unknown = sorted(set(value) - set(DEFAULT_WEIGHTS))
        if unknown:
            raise ValueError(
                f"unknown scorer weight {', '.join(map(shown, unknown))}; "
                f"allowed: {', '.join(DEFAULT_WEIGHTS)}"
            )
        negative = sorted(name for name, weight in value.items() if not weight >= 0)
        if negative:
            raise ValueError(f"scorer weights must be 0 or more: {', '.join(negative)}")
        too_big = sorted(name for name, weight in value.items() if weight > MAX_SCORER_WEIGHT)
        if too_big:
            raise ValueError(
                f"scorer weights must be at most {MAX_SCORER_WEIGHT:g}: {', '.join(too_big)}"
            )
        return value

    @model_validator(mode="after")
    def _hosts(self, info: ValidationInfo) -> FleetSpec:
        if not recorded(info):
            self._only_what_the_kind_reads()
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

    def _only_what_the_kind_reads(self) -> None:
        """Refuse a field this kind of fleet does not read, given a value other than its
        default (a spec's JSON, read back, holds every field): it was accepted and ignored, so
        an ssh host set to `state: maintenance` to drain it kept taking jobs."""
        ignored = {"sim": _SSH_ONLY, "ssh": _SIM_ONLY, "local": frozenset()}[self.kind]
        for index, host in enumerate(self.hosts):
            given = sorted(
                name
                for name in ignored & host.model_fields_set
                if getattr(host, name)
                != HostDecl.model_fields[name].get_default(call_default_factory=True)
            )
            if given:
                raise ValueError(
                    f"hosts.{index} ({host.name}): {', '.join(given)} "
                    f"{'is' if len(given) == 1 else 'are'} not read for {self.kind} hosts"
                    + (_SSH_HINT if self.kind == "ssh" else "")
                )
        if self.kind != "local" and self.blocks is not None:
            raise ValueError("blocks at the fleet's level is for a local fleet; use hosts[].blocks")
        if self.kind != "sim" and self.utilization != SimulatedUtilization():
            raise ValueError("utilization is for sim fleets (a real GPU reports its own)")
