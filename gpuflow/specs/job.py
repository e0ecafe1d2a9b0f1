"""The job file: what users write (in the spirit of dstack task files)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationInfo, field_validator, model_validator

from gpuflow.naming import SECRET_REF
from gpuflow.specs.job_parts import (
    DEFAULT_QUEUE,
    ENV_NAME,
    MAX_COMMAND,
    MAX_ITEMS,
    MAX_NODES,
    MAX_PRIORITY,
    MAX_TEXT,
    MIN_PRIORITY,
    SECRET_IN,
    SPEC_CONFIG,
    RetrySpec,
    Selection,
    UtilizationPolicy,
    check_labels,
    check_name,
    check_priority,
    not_replaced_here,
    parse_max_duration,
    parse_time_window,
)
from gpuflow.specs.resources import ResourcesSpec
from gpuflow.specs.scoring import SCORERS
from gpuflow.specs.units import check_taints, check_text, recorded, shown, whole_count
from gpuflow.status import RetryEvent

__all__ = [
    "DEFAULT_QUEUE",
    "MAX_COMMAND",
    "MAX_ITEMS",
    "MAX_NODES",
    "MAX_PRIORITY",
    "MAX_TEXT",
    "MIN_PRIORITY",
    "SPEC_CONFIG",
    "JobSpec",
    "RetrySpec",
    "Selection",
    "UtilizationPolicy",
    "check_labels",
    "check_name",
    "check_priority",
    "parse_max_duration",
    "parse_time_window",
]


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
    names (letters, digits, '_', not starting with a digit) to text without NUL, each name
    once. An empty value is written `KEY: ""` (a bare `KEY:` is YAML's null, refused)."""
    working_dir: str | None = Field(default=None, examples=["/data/run-1"])
    """Where the commands run on the host, created if missing: an absolute path; `~` or
    `~/...` in the home directory of the user the host agent runs as; or a path relative to
    the job's own directory that gpuflow makes on the host (a new one for each attempt and
    node). A path without NUL, at most 4096 characters. Omitted: the job's own directory."""
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
    """How long the job may run before it is terminated (written 30m, 2h, 1d; 1s to a
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
                    not_replaced_here(item, "commands", info)
        return value

    @field_validator("env", mode="before")
    @classmethod
    def _env(cls, value: Any, info: ValidationInfo) -> Any:
        # The messages name the variable, not `env`: the field's name comes before them.
        if isinstance(value, list):  # dstack style: ["KEY=value", ...]
            value = _env_pairs(value)
        if isinstance(value, dict):
            for key, item in value.items():
                if not isinstance(key, str) or not ENV_NAME.fullmatch(key):
                    raise ValueError(
                        f"name {shown(key)} must be letters, digits and '_', "
                        "not starting with a digit"
                    )
                if item is None:  # YAML's null (`KEY:` or `KEY: null`), never the text None
                    raise ValueError(f'{key} has no value (null); for an empty one write {key}: ""')
                if isinstance(item, dict | list):
                    raise ValueError(f"{key} must be text, not {shown(item)}")
            # Numbers and bools given by code are taken as Python spells them (a file's are
            # given back as the file spelled them before: specs/load.py, _env_as_written).
            value = {k: str(v) for k, v in value.items()}
            for key, item in value.items():
                check_text(item, f"the value of {key}", max_length=MAX_COMMAND, allow_empty=True)
                if (
                    SECRET_IN.search(item)
                    and not SECRET_REF.match(item.strip())
                    and not recorded(info)
                ):
                    raise ValueError(
                        f"the value of {key}, {shown(item)}, is not a secret reference; one is "
                        "the whole value, written ${{ secrets.NAME }} (build a longer value "
                        "from it in the job's commands, e.g. Bearer $KEY)"
                    )
        return value

    @field_validator("priority", mode="before")
    @classmethod
    def _priority(cls, value: Any) -> Any:
        return check_priority(value)

    @field_validator("nodes", mode="before")
    @classmethod
    def _nodes(cls, value: Any) -> Any:
        return whole_count(value, "nodes", least=1, most=MAX_NODES)

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
        not_replaced_here(value, "working_dir", info)
        other_home = value.startswith("~") and value != "~" and not value.startswith("~/")
        if other_home and not recorded(info):  # the agent expands only its own user's `~`
            raise ValueError(
                f"{shown(value)}: only ~ and ~/... (the home of the user the host agent "
                "runs as) are expanded; write another user's directory in full"
            )
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


def _env_pairs(items: list[Any]) -> dict[str, Any]:
    """`env` written as a list of `KEY=VALUE` (as dstack writes it), each name once."""
    pairs: dict[str, Any] = {}
    for item in items:
        key, sep, val = item.partition("=") if isinstance(item, str) else ("", "", "")
        if not sep:
            raise ValueError(f"entry {shown(item)} must be KEY=VALUE")
        if key in pairs:
            raise ValueError(f"{key} is given twice in the list; keep one")
        pairs[key] = val
    return pairs
