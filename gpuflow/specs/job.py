"""The job file: what users write (in the spirit of dstack task files)."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from gpuflow.naming import SECRET_REF
from gpuflow.specs.resources import ResourcesSpec
from gpuflow.specs.scoring import SCORERS
from gpuflow.specs.units import (
    check_taints,
    check_text,
    parse_duration,
    recorded,
    shown,
    whole_count,
)
from gpuflow.status import RetryEvent

SPEC_CONFIG = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
"""Every spec model: unknown fields are errors, values are immutable, numbers are finite."""

_NAME = re.compile(r"[a-z][a-z0-9-]{0,40}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,255}")
MIN_UTILIZATION_WINDOW_S = 60
MAX_UTILIZATION_WINDOW_S = 7 * 86400
MAX_TEXT = 4096
"""Longest label or path (PATH_MAX on Linux)."""
MAX_COMMAND = 128 * 1024
"""Longest command or environment value (Linux's limit on one argument, MAX_ARG_STRLEN)."""
MAX_ITEMS = 1024
MAX_NODES = 1024
"""Nodes of one job: the bound the field and its refusal both say."""
DEFAULT_QUEUE = "default"
"""The queue of a job that names none; it exists without a queue file (no quota limit)."""
"""Most commands, environment variables, labels, taints or names in one list."""


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
    seconds = parse_duration(value)
    if seconds <= 0:
        raise ValueError(f"max_duration must be positive, or off (got {shown(value)})")
    return seconds


_SECRET_IN = re.compile(r"\$\{\{")
"""The start of a reference (`${{`), wherever it stands in a value: a value holding one must
be a whole secret reference (`SECRET_REF`), so that a misspelt one (`${{ secret.X }}`) is not
passed to the job as text."""


def _not_replaced_here(text: str, field: str, info: ValidationInfo) -> None:
    """A reference (`${{`) is replaced only as a whole env value: in `field` it would reach the
    job as text (a recorded value, written before this check, is read as it is)."""
    if _SECRET_IN.search(text) and not recorded(info):
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
    (written 30m, 2h, 1d; at most a year). An attempt already running is not cut short."""
    max_attempts: int | None = Field(default=None, le=10_000, examples=[3])
    """Most attempts in all, the first one included. Omitted: as many as fit in `duration`."""

    @field_validator("duration", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> int:
        return parse_duration(value)

    @field_validator("max_attempts")
    @classmethod
    def _attempts(cls, value: int | None) -> int | None:
        if value is not None and value < 1:
            raise ValueError(f"max_attempts is {shown(value)}; it must be at least 1")
        return value


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
    """Exact GPUs, `HOST:INDEX` (the host's GPUs counted from 0): the job may use only these
    GPUs, and their hosts are added to `hosts`. Omitted or empty: any GPU of the allowed
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


class JobSpec(BaseModel):
    """One job. Unknown fields are errors so that typos never pass silently."""

    model_config = SPEC_CONFIG

    type: Literal["task"] = Field(default="task", examples=["task"])
    """The kind of file; a job file is always `task` (may be omitted)."""
    name: str = Field(examples=["train-llm"])
    """The job's name, shown by `gpuflow ps` and in logs; names need not be unique (each job
    gets its own id)."""
    commands: list[str] = Field(min_length=1, max_length=MAX_ITEMS, examples=[["python train.py"]])
    """Shell commands run one after another in one shell on every node; the job fails at the
    first that exits non-zero. One command may be written as plain text."""
    env: dict[str, str] = Field(
        default_factory=dict, max_length=MAX_ITEMS, examples=[{"WANDB_MODE": "offline"}]
    )
    """Environment variables for the commands, as a mapping or a list of `KEY=VALUE`: POSIX
    names (letters, digits, '_', not starting with a digit) to text without NUL."""
    working_dir: str | None = Field(default=None, examples=["/data/run-1"])
    """Where the commands run on the host: a path without NUL, at most 4096 characters.
    It is created if missing. Omitted: the job's own directory that gpuflow makes on the host."""
    resources: ResourcesSpec = Field(
        default_factory=ResourcesSpec, examples=[{"gpu": "A100:2", "memory": "64GB.."}]
    )
    """What each node needs (every node of a multi-node job gets the same). Omitted: one CPU
    core and no GPU."""
    alternatives: list[ResourcesSpec] = Field(
        default_factory=list, max_length=16, examples=[[{"gpu": "L4:1"}]]
    )
    """Resources to fall back to, in order, when `resources` fits nowhere: each option is
    tried on every fleet (in `fleets` order) before the next one."""
    nodes: int = Field(default=1, ge=1, le=MAX_NODES, examples=[2])
    """How many hosts the job runs on. Above 1 the job takes that many whole, idle hosts of one
    fleet at once (a host split into blocks counts only with every block free), or waits;
    GPU fractions are not allowed then."""
    priority: int = Field(default=0, ge=MIN_PRIORITY, le=MAX_PRIORITY, examples=[50])
    """Higher is more important within the job's queue: admission starts waiting jobs of a
    queue higher priority first, then by submission time, and may preempt `preemptible` jobs
    of lower priority for it."""
    queue: str = Field(default=DEFAULT_QUEUE, examples=["research"])
    """The queue the job waits in (`gpuflow queue list`); its quota counts the job's GPUs.
    Omitted: the `default` queue, which exists without a queue file."""
    preemptible: bool = Field(default=False, examples=[True])
    """The job may be stopped to admit a higher-priority job of its queue, or to give another
    queue of its cohort back its quota; it then ends `terminated` / `preempted`, an
    interruption (`retry` on `interruption` requeues it: it waits in its queue until the
    retry's `duration` runs out)."""
    retry: RetrySpec | None = Field(default=None, examples=[True])
    """When to try the job again; `true`: on every event, with the default settings of
    `retry`. Omitted or `false`: the job is tried once and fails when nothing fits."""
    max_duration: int | None = Field(default=None, examples=["12h"])
    """How long the job may run before it is terminated (written 30m, 2h, 1d; at most a
    year). Omitted or `off`: unlimited."""
    utilization_policy: UtilizationPolicy | None = Field(
        default=None, examples=[{"min_gpu_utilization": 10, "time_window": "30m"}]
    )
    """Terminate the job when its GPUs sit idle; only for jobs that ask for GPUs. Omitted: never
    terminated for low utilization."""
    fleets: list[str] = Field(
        default_factory=list, max_length=MAX_ITEMS, examples=[["on-prem", "cloud-reserve"]]
    )
    """Fleets to try, in order: the job takes a place on the first that has one. Omitted or
    empty: every fleet."""
    placement: Selection | None = Field(default=None, examples=[{"hosts": ["gpu-1"]}])
    """Pin the job to named hosts or GPUs. Omitted: the scorer chooses among every host that
    fits."""
    scorer: str | None = Field(default=None, examples=["spread"])
    """How to rank the hosts that fit, for this job: `binpack` fills the fullest host first,
    `spread` the emptiest, `fragmentation` keeps whole GPUs and hosts free. Omitted: each
    fleet's own `scorer`."""
    tolerations: list[str] = Field(
        default_factory=list, max_length=MAX_ITEMS, examples=[["gpu-only"]]
    )
    """Host taints this job accepts: `key=value` tolerates exactly that taint, `key` every taint
    with that key. A host with a taint the job does not tolerate is never used for it. Written
    as taints are (letters, digits, `-`, `_`, `.`; see the fleet file's `taints`)."""
    labels: dict[str, str] = Field(
        default_factory=dict, max_length=MAX_ITEMS, examples=[{"zone": "eu-1"}]
    )
    """Host labels the job requires: only hosts that carry every `key: value` here are used.
    Omitted: any host."""

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return check_name(value, "job name")

    @field_validator("queue")
    @classmethod
    def _queue(cls, value: str) -> str:
        return check_name(value, "queue name")

    @field_validator("commands", mode="before")
    @classmethod
    def _commands(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, str):
            return [value]
        if isinstance(value, list):
            # An item not text is left to the field's type: refused at its index, in words.
            for item in value:
                if isinstance(item, str):
                    check_text(item, "command", max_length=MAX_COMMAND, allow_empty=True)
                    _not_replaced_here(item, "commands", info)
        return value

    @field_validator("env", mode="before")
    @classmethod
    def _env(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, list):  # dstack style: ["KEY=value", ...]
            pairs = {}
            for item in value:
                key, sep, val = item.partition("=") if isinstance(item, str) else ("", "", "")
                if not sep:
                    raise ValueError(f"env entry {shown(item)} must be KEY=VALUE")
                pairs[key] = val
            value = pairs
        if isinstance(value, dict):
            for key, item in value.items():
                if not isinstance(key, str) or not _ENV_NAME.fullmatch(key):
                    raise ValueError(
                        f"env name {shown(key)} must be letters, digits and '_', "
                        "not starting with a digit"
                    )
                if isinstance(item, dict | list):
                    raise ValueError(f"env {key}: the value must be text, not {shown(item)}")
            value = {k: str(v) for k, v in value.items()}
            for key, item in value.items():
                check_text(item, f"env {key}", max_length=MAX_COMMAND, allow_empty=True)
                if (
                    _SECRET_IN.search(item)
                    and not SECRET_REF.match(item.strip())
                    and not recorded(info)
                ):
                    raise ValueError(
                        f"env {key}: {shown(item)} is not a secret reference; one is the "
                        "whole value, written ${{ secrets.NAME }} (build a longer value from "
                        "it in the job's commands, e.g. Bearer $KEY)"
                    )
        return value

    @field_validator("priority", mode="before")
    @classmethod
    def _priority(cls, value: Any) -> Any:
        return check_priority(value)

    @field_validator("nodes", mode="before")
    @classmethod
    def _nodes(cls, value: Any) -> Any:
        return whole_count(value, "nodes", hint=f", 1..{MAX_NODES}")

    @field_validator("preemptible", mode="before")
    @classmethod
    def _preemptible(cls, value: Any) -> Any:
        if not isinstance(value, bool):
            raise ValueError(f"{shown(value)} is not true or false")
        return value

    @field_validator("working_dir")
    @classmethod
    def _working_dir(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return None
        _not_replaced_here(value, "working_dir", info)
        return check_text(value, "working_dir", max_length=MAX_TEXT)

    @field_validator("fleets")
    @classmethod
    def _fleets(cls, value: list[str]) -> list[str]:
        for name in value:
            check_name(name, "fleet name")
        return value

    @field_validator("tolerations")
    @classmethod
    def _tolerations(cls, value: list[str], info: ValidationInfo) -> list[str]:
        return check_taints(value, "toleration", info)

    @field_validator("labels")
    @classmethod
    def _labels(cls, value: dict[str, str]) -> dict[str, str]:
        return check_labels(value)

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
        return parse_max_duration(value)

    @field_validator("scorer")
    @classmethod
    def _scorer(cls, value: str | None) -> str | None:
        if value is not None and value not in SCORERS:
            raise ValueError(f"unknown scorer {shown(value)}; allowed: {', '.join(SCORERS)}")
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

    @property
    def may_wait(self) -> bool:
        """Whether the job waits in its queue when nothing fits (its retry covers
        no-capacity); otherwise the first admission pass that cannot admit it refuses it."""
        return self.retry is not None and RetryEvent.NO_CAPACITY in self.retry.on_events

    def resource_options(self) -> list[JobSpec]:
        """The job once per resource option, in the order they are tried: `resources`, then
        each of `alternatives` (as the job's `resources`)."""
        if not self.alternatives:
            return [self]
        return [self.model_copy(update={"alternatives": []})] + [
            self.model_copy(update={"resources": alt, "alternatives": []})
            for alt in self.alternatives
        ]
