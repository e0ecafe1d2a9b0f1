"""Command-line flags that override a job file: each is checked by its field's own parser, and an
error names the flag (`--gpu`), not the file."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from gpuflow.errors import SpecError
from gpuflow.specs.job import (
    UtilizationPolicy,
    check_name,
    check_priority,
    parse_max_duration,
    parse_time_window,
)
from gpuflow.specs.resources import GPUSpec
from gpuflow.specs.units import shown

_POLICY_FLAGS = {"min_gpu_utilization": "--min-gpu-utilization", "time_window": "--time-window"}


@dataclass(frozen=True, kw_only=True)
class JobFlags:
    """What `gpuflow apply` flags say about a job; None leaves the file's (or profile's) value."""

    gpu: str | None = None
    """--gpu: replaces resources.gpu, e.g. A100:2."""
    fleets: tuple[str, ...] = ()
    """--fleet (repeated): replaces fleets."""
    max_duration: str | None = None
    """--max-duration: e.g. 2h, or off."""
    min_gpu_utilization: int | None = None
    """--min-gpu-utilization: percent, 0..100."""
    time_window: str | None = None
    """--time-window: 1m..7d."""
    queue: str | None = None
    """--queue: the queue to wait in."""
    priority: int | None = None
    """--priority: 0..100, within the queue."""

    def overrides(self) -> dict[str, Any]:
        """The flags as job fields (raw, for the one validation after merging), each checked
        here first so that a bad value is reported against its flag."""
        fields: dict[str, Any] = {}
        if self.gpu is not None:
            _check("--gpu", GPUSpec.parse, self.gpu)
            fields["resources"] = {"gpu": self.gpu}
        if self.fleets:
            for name in self.fleets:
                _check("--fleet", lambda v: check_name(v, "fleet name"), name)
            fields["fleets"] = list(self.fleets)
        if self.max_duration is not None:
            _check("--max-duration", parse_max_duration, self.max_duration)
            fields["max_duration"] = self.max_duration
        if self.queue is not None:
            _check("--queue", lambda v: check_name(v, "queue name"), self.queue)
            fields["queue"] = self.queue
        if self.priority is not None:
            _check("--priority", check_priority, self.priority)
            fields["priority"] = self.priority
        policy: dict[str, Any] = {}
        if self.min_gpu_utilization is not None:
            try:  # the policy's own field decides what a threshold may be
                UtilizationPolicy.model_validate(
                    {"min_gpu_utilization": self.min_gpu_utilization, "time_window": "10m"}
                )
            except ValidationError:
                raise SpecError(
                    f"--min-gpu-utilization: {shown(self.min_gpu_utilization)} is not a "
                    "percentage; use 0..100"
                ) from None
            policy["min_gpu_utilization"] = self.min_gpu_utilization
        if self.time_window is not None:
            _check("--time-window", parse_time_window, self.time_window)
            policy["time_window"] = self.time_window
        if policy:
            fields["utilization_policy"] = policy
        return fields

    def check_policy(self, merged: Any, *, source: str) -> None:
        """A policy flag alone must find the rest of the policy in the job file or profile."""
        given = {f for f in _POLICY_FLAGS if getattr(self, f) is not None}
        if not given or not isinstance(merged, dict):
            return
        for field, flag in _POLICY_FLAGS.items():
            if field not in given and merged.get(field) is None:
                other = _POLICY_FLAGS[next(iter(given))]
                raise SpecError(
                    f"{other} needs {flag} too: neither {source} nor its profile sets "
                    f"utilization_policy.{field}"
                )


def _check(flag: str, parse: Any, value: Any) -> None:
    try:
        parse(value)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise SpecError(f"{flag}: {first['msg'].removeprefix('Value error, ')}") from None
    except ValueError as exc:
        raise SpecError(f"{flag}: {exc}") from None
