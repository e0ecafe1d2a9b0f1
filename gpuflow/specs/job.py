"""The job file: what users write (in the spirit of dstack task files)."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gpuflow.specs.resources import ResourcesSpec
from gpuflow.specs.units import parse_duration
from gpuflow.status import RetryEvent

SCORERS = ("fragmentation", "binpack", "spread")
"""Placement scorers a fleet or a job may choose."""

_NAME = re.compile(r"^[a-z][a-z0-9-]{0,40}$")
MIN_UTILIZATION_WINDOW_S = 60
MAX_UTILIZATION_WINDOW_S = 7 * 86400


def check_name(value: str, what: str = "name") -> str:
    if not _NAME.match(value):
        raise ValueError(
            f"{what} {value!r} must start with a letter and hold only lowercase letters, "
            "digits and '-' (at most 41 characters)"
        )
    return value


class RetrySpec(BaseModel):
    """When a job is tried again. `retry: true` retries on every event."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    on_events: list[RetryEvent] = Field(default_factory=lambda: list(RetryEvent))
    """Events that start another attempt: no-capacity, interruption, error."""
    duration: int = 3600
    """Seconds from submission after which no new attempt starts (also bounds capacity waits)."""
    max_attempts: int | None = None
    """Most attempts in all, the first included; None bounds attempts by `duration` only."""

    @field_validator("duration", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> int:
        return parse_duration(value)

    @field_validator("max_attempts")
    @classmethod
    def _attempts(cls, value: int | None) -> int | None:
        if value is not None and value < 1:
            raise ValueError(f"max_attempts is {value}; it must be at least 1")
        return value


class UtilizationPolicy(BaseModel):
    """Terminate the job when a GPU stays below `min_gpu_utilization` for `time_window`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    min_gpu_utilization: int = Field(ge=0, le=100)
    """Percent, 0..100."""
    time_window: int
    """Seconds, 1 minute to 7 days (write 10m, 2h, 1d)."""

    @field_validator("time_window", mode="before")
    @classmethod
    def _window(cls, value: Any) -> int:
        seconds = parse_duration(value)
        if not MIN_UTILIZATION_WINDOW_S <= seconds <= MAX_UTILIZATION_WINDOW_S:
            raise ValueError(f"time_window {value!r} is outside 1m..7d; write e.g. 10m, 2h or 1d")
        return seconds


class Selection(BaseModel):
    """Manual placement: the hosts, or the exact GPUs (`host:index`), the job may use."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    hosts: list[str] = Field(default_factory=list)
    gpus: list[str] = Field(default_factory=list)

    @field_validator("gpus")
    @classmethod
    def _gpus(cls, value: list[str]) -> list[str]:
        for item in value:
            host, sep, index = item.rpartition(":")
            if not sep or not host or not index.isdigit():
                raise ValueError(f"GPU {item!r} must be written HOST:INDEX, e.g. gpu-1:0")
        return value


class JobSpec(BaseModel):
    """One job. Unknown fields are errors so that typos never pass silently."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["task"] = "task"
    name: str
    commands: list[str] = Field(min_length=1)
    env: dict[str, str] = Field(default_factory=dict)
    working_dir: str | None = None
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec)
    alternatives: list[ResourcesSpec] = Field(default_factory=list, max_length=16)
    """Resources to fall back to, in order, when `resources` fits nowhere: each option is
    tried on every fleet (in `fleets` order) before the next one."""
    nodes: int = Field(default=1, ge=1, le=1024)
    priority: int = Field(default=0, ge=0, le=100)
    retry: RetrySpec | None = None
    max_duration: int | None = None
    """Seconds the job may run before it is terminated; None is unlimited."""
    utilization_policy: UtilizationPolicy | None = None
    fleets: list[str] = Field(default_factory=list)
    """Fleets to try, in order; empty means every fleet."""
    placement: Selection | None = None
    scorer: str | None = None
    """binpack, spread or fragmentation; None uses the fleet's."""
    tolerations: list[str] = Field(default_factory=list)
    """Taints (`key=value` or `key`) this job accepts."""
    labels: dict[str, str] = Field(default_factory=dict)
    """Host labels the job requires."""

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return check_name(value, "job name")

    @field_validator("commands", mode="before")
    @classmethod
    def _commands(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [value]
        if isinstance(value, list):
            for item in value:
                if not isinstance(item, str):
                    raise ValueError(
                        f"command {item!r} is not text: YAML read it as a "
                        f"{type(item).__name__}; put it in quotes"
                    )
        return value

    @field_validator("env", mode="before")
    @classmethod
    def _env(cls, value: Any) -> Any:
        if isinstance(value, list):  # dstack style: ["KEY=value", ...]
            pairs = {}
            for item in value:
                key, sep, val = str(item).partition("=")
                if not sep:
                    raise ValueError(f"env entry {item!r} must be KEY=VALUE")
                pairs[key] = val
            return pairs
        if isinstance(value, dict):
            return {str(k): str(v) for k, v in value.items()}
        return value

    @field_validator("retry", mode="before")
    @classmethod
    def _retry(cls, value: Any) -> Any:
        if value is True:
            return RetrySpec()
        if value is False:
            return None
        return value

    @field_validator("max_duration", mode="before")
    @classmethod
    def _max_duration(cls, value: Any) -> Any:
        if value in (None, "off", False):
            return None
        seconds = parse_duration(value)
        if seconds <= 0:
            raise ValueError("max_duration must be positive, or off")
        return seconds

    @field_validator("scorer")
    @classmethod
    def _scorer(cls, value: str | None) -> str | None:
        if value is not None and value not in SCORERS:
            raise ValueError(f"unknown scorer {value!r}; allowed: {', '.join(SCORERS)}")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> JobSpec:
        for where, resources in self._named_options():
            gpu = resources.gpu
            if self.nodes > 1 and gpu is not None and gpu.fraction is not None:
                raise ValueError(f"{where}: a multi-node job cannot ask for a fraction of a GPU")
            if self.utilization_policy is not None and not resources.wants_gpu:
                raise ValueError(
                    f"{where}: utilization_policy needs a job that asks for GPUs ({where}.gpu)"
                )
        return self

    def _named_options(self) -> list[tuple[str, ResourcesSpec]]:
        named = [("resources", self.resources)]
        named += [(f"alternatives[{i}]", alt) for i, alt in enumerate(self.alternatives)]
        return named

    def resource_options(self) -> list[JobSpec]:
        """The job once per resource option, in the order they are tried: `resources`, then
        each of `alternatives` (as the job's `resources`)."""
        if not self.alternatives:
            return [self]
        return [self.model_copy(update={"alternatives": []})] + [
            self.model_copy(update={"resources": alt, "alternatives": []})
            for alt in self.alternatives
        ]
