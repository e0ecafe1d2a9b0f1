"""The parts of a job file besides JobSpec itself: the limits and checks its fields share with
the other spec files, and its nested blocks (`retry`, `utilization_policy`, `placement`)."""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from gpuflow.specs.units import check_text, parse_duration, recorded, shown, whole_count
from gpuflow.status import RetryEvent

SPEC_CONFIG = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
"""Every spec model: unknown fields are errors, values are immutable, numbers are finite."""

_NAME = re.compile(r"[a-z][a-z0-9-]{0,40}")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,255}")
MIN_UTILIZATION_WINDOW_S = 60
MAX_UTILIZATION_WINDOW_S = 7 * 86400
MAX_TEXT = 4096
"""Longest label or path (PATH_MAX on Linux)."""
MAX_COMMAND = 128 * 1024
"""Longest command or environment value (Linux's limit on one argument, MAX_ARG_STRLEN)."""
MAX_ITEMS = 1024
"""Most commands, environment variables, labels, taints or names in one list."""
MAX_NODES = 1024
"""Nodes of one job: the bound the field and its refusal both say."""
MAX_ATTEMPTS = 10_000
"""Most attempts of one job (`retry.max_attempts`)."""
DEFAULT_QUEUE = "default"
"""The queue of a job that names none; it exists without a queue file (no quota limit)."""


MIN_PRIORITY, MAX_PRIORITY = 0, 100
"""A job's priority within its queue: the one range every way of setting it checks."""


def check_priority(value: object) -> int:
    """The value as a priority, or ValueError saying what one is (a job file's field, `apply
    --priority`, `set-priority`, and the signal a job's workflow takes it by)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(
            f"{shown(value)} is not a priority; use a whole number, {MIN_PRIORITY}..{MAX_PRIORITY}"
        )
    if not MIN_PRIORITY <= value <= MAX_PRIORITY:
        raise ValueError(f"{value} is not a priority; use {MIN_PRIORITY}..{MAX_PRIORITY}")
    return value


def check_name(value: str, what: str = "name") -> str:
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        raise ValueError(
            f"{what} {shown(value)} must start with a letter and hold only lowercase letters, "
            "digits and '-' (at most 41 characters)"
        )
    return value


def check_labels(value: dict[str, str]) -> dict[str, str]:
    for key, item in value.items():
        check_text(key, "label name", max_length=MAX_TEXT)
        check_text(item, f"label {shown(key)}", max_length=MAX_TEXT, allow_empty=True)
    return value


def parse_time_window(value: Any) -> int:
    """A utilization policy's window in seconds, 1 minute to 7 days."""
    seconds = parse_duration(value)
    if not MIN_UTILIZATION_WINDOW_S <= seconds <= MAX_UTILIZATION_WINDOW_S:
        raise ValueError(f"time_window {shown(value)} is outside 1m..7d; write e.g. 10m, 2h or 1d")
    return seconds


def parse_max_duration(value: Any) -> int | None:
    """Seconds a job may run (1 second to a year), or None for `off`."""
    if value is None or value is False or value == "off":
        return None
    return parse_duration(value, minimum=1, too_short="; for no limit write off")


SECRET_IN = re.compile(r"\$\{\{")
"""The start of a reference (`${{`), wherever it stands in a value: a value holding one must
be a whole secret reference (`SECRET_REF`), so that a misspelt one (`${{ secret.X }}`) is not
passed to the job as text."""


def not_replaced_here(text: str, field: str, info: ValidationInfo) -> None:
    """A reference (`${{`) is replaced only as a whole env value: in `field` it would reach the
    job as text (a recorded value, written before this check, is read as it is)."""
    if SECRET_IN.search(text) and not recorded(info):
        raise ValueError(
            f"{shown(text)}: ${{{{ ... }}}} is not replaced in {field}; name the secret in env "
            "(KEY: ${{ secrets.NAME }}) and use $KEY"
        )


class RetrySpec(BaseModel):
    """When a job is tried again. `retry: true` retries on every event. An attempt after an
    `error` or an `interruption` other than a preemption starts after a wait: 10 s, doubling
    while attempts keep ending within 10 minutes of their start, at most 5 minutes (none when
    the wait would pass `duration`: the job ends with its last failure)."""

    model_config = SPEC_CONFIG

    on_events: list[RetryEvent] = Field(
        default_factory=lambda: list(RetryEvent), max_length=16, examples=[["no-capacity"]]
    )
    """Events that start another attempt: `no-capacity` (nothing fits now: keep waiting for a
    place), `interruption` (its host was lost, or starting on it failed), `error` (a command exited
    non-zero). Omitted: all three."""
    duration: int = Field(default=3600, examples=["2h"])
    """How long after submission a new attempt may still start, waits for capacity included
    (written 30m, 2h, 1d; 1s to a year). An attempt already running is not cut short."""
    max_attempts: int | None = Field(default=None, ge=1, le=MAX_ATTEMPTS, examples=[3])
    """Most attempts in all, the first one included. Omitted: as many as fit in `duration`."""

    @field_validator("on_events")
    @classmethod
    def _events(cls, value: list[RetryEvent], info: ValidationInfo) -> list[RetryEvent]:
        if not value and not recorded(info):
            raise ValueError(
                "an empty list starts no other attempt; list one or more of "
                f"{', '.join(event.value for event in RetryEvent)}, or write retry: false"
            )
        return value

    @field_validator("duration", mode="before")
    @classmethod
    def _duration(cls, value: Any, info: ValidationInfo) -> int:
        return parse_duration(
            value,
            minimum=0 if recorded(info) else 1,
            too_short=": no attempt could start after the first (for none, write retry: false)",
        )

    @field_validator("max_attempts", mode="before")
    @classmethod
    def _attempts(cls, value: Any) -> Any:
        if value is None:
            return None
        return whole_count(value, "attempts", least=1, most=MAX_ATTEMPTS)


class UtilizationPolicy(BaseModel):
    """Terminate the job when a GPU stays below `min_gpu_utilization` for `time_window`."""

    model_config = SPEC_CONFIG

    min_gpu_utilization: int = Field(ge=0, le=100, examples=[10])
    """GPU utilization in percent (0..100): a GPU of the job that stays below it for
    `time_window` terminates the job (`0` never does). A share of a GPU (a count below 1) is
    judged by the job's own processes: their SM utilization on it, as NVML reports it per
    process (the whole GPU's where the driver cannot)."""
    time_window: int = Field(examples=["30m"])
    """How long a GPU may stay below `min_gpu_utilization` before the job is terminated
    (written 10m, 2h, 1d; 1 minute to 7 days)."""

    @field_validator("time_window", mode="before")
    @classmethod
    def _window(cls, value: Any) -> int:
        return parse_time_window(value)


class Selection(BaseModel):
    """Manual placement: the hosts, or the exact GPUs (`host:index`), the job may use."""

    model_config = SPEC_CONFIG

    hosts: list[str] = Field(default_factory=list, max_length=MAX_ITEMS, examples=[["gpu-1"]])
    """Host names (as in the fleet file) the job may run on; no other host is considered.
    Omitted or empty: any host (unless `gpus` names some)."""
    gpus: list[str] = Field(default_factory=list, max_length=MAX_ITEMS, examples=[["gpu-1:0"]])
    """Exact GPUs, `HOST:INDEX` (the host's GPUs counted from 0). A host named here may run
    the job only on its GPUs listed here, and is allowed as if it were in `hosts`; a host named
    in `hosts` and not here keeps all its GPUs. Omitted or empty: any GPU of the allowed
    hosts."""

    @field_validator("hosts")
    @classmethod
    def _hosts(cls, value: list[str]) -> list[str]:
        for host in value:
            check_name(host, "host name")
        return value

    @field_validator("gpus")
    @classmethod
    def _gpus(cls, value: list[str]) -> list[str]:
        for item in value:
            host, sep, index = item.rpartition(":")
            if not sep or not _NAME.fullmatch(host) or not re.fullmatch(r"[0-9]{1,3}", index):
                raise ValueError(f"GPU {shown(item)} must be written HOST:INDEX, e.g. gpu-1:0")
        return value
