"""Queue files: where jobs wait, with a nominal GPU quota shared within a cohort (in the spirit
of Kueue's ClusterQueue; docs/architecture.md, "Queues and admission")."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from gpuflow.specs.job import SPEC_CONFIG, check_name
from gpuflow.specs.units import check_text, shown

MAX_QUOTA_GPUS = 1_000_000
"""Most GPUs a quota or a limit may name."""
MAX_QUOTA_MODELS = 64
ANY_MODEL = "*"
"""The quota key of a queue whose quota is a total over every GPU model."""

__all__ = ["ANY_MODEL", "MAX_QUOTA_GPUS", "QueueSpec", "unknown_queue"]


def _yaml(value: Any) -> str:
    """A value as a file spells it: `true`, not Python's `True`."""
    return str(value).lower() if isinstance(value, bool) else shown(value)


def _gpus(value: Any, what: str) -> int:
    """A whole number of GPUs, 0..MAX_QUOTA_GPUS, with a one-line error naming the field."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{what} must be a whole number of GPUs, not {_yaml(value)}")
    if not 0 <= value <= MAX_QUOTA_GPUS:
        raise ValueError(f"{what} is {value}; it must be 0..{MAX_QUOTA_GPUS} GPUs")
    return value


class QueueSpec(BaseModel):
    """A queue: jobs wait in it, and it may run jobs up to its nominal quota of GPUs plus what it
    borrows from the idle quota of the other queues of its cohort."""

    model_config = SPEC_CONFIG

    type: Literal["queue"] = Field(default="queue", examples=["queue"])
    """The kind of file: a queue file must say `queue`."""
    name: str = Field(examples=["research"])
    """The queue's name, as jobs name it in `queue`; applying a file with the same name updates
    that queue."""
    gpus: int | dict[str, int] = Field(examples=[16, {"A100": 8, "T4": 4}])
    """Nominal quota: GPUs this queue is entitled to, a total over every model, or per GPU model
    (upper-case names as in fleet files; a model not listed has a quota of 0). A GPU share
    counts as its fraction."""
    cohort: str | None = Field(default=None, examples=["lab"])
    """Queues of one cohort lend each other the quota they do not use. Omitted: the queue
    never borrows or lends."""
    borrowing_limit: int | None = Field(default=None, examples=[8])
    """Most GPUs (per model, for a per-model quota) this queue may use beyond its quota, taken
    from idle quota of its cohort. Omitted: as many as the cohort lends."""
    lending_limit: int | None = Field(default=None, examples=[4])
    """Most GPUs (per model, for a per-model quota) of this queue's idle quota that the cohort
    may borrow. Omitted: all of it."""

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return check_name(value, "queue name")

    @field_validator("cohort")
    @classmethod
    def _cohort(cls, value: str | None) -> str | None:
        return None if value is None else check_name(value, "cohort name")

    @field_validator("gpus", mode="before")
    @classmethod
    def _quota(cls, value: Any) -> Any:
        if isinstance(value, dict):
            if len(value) > MAX_QUOTA_MODELS:
                raise ValueError(f"gpus lists {len(value)} models; at most {MAX_QUOTA_MODELS}")
            quota: dict[str, int] = {}
            for model, count in value.items():
                if not isinstance(model, str):
                    raise ValueError(f"GPU model {shown(model)} must be a name such as A100")
                key = check_text(model.strip(), "GPU model", max_length=64).upper()
                if key in quota:
                    raise ValueError(f"GPU model {key} is listed twice in gpus")
                quota[key] = _gpus(count, f"gpus.{key}")
            return quota
        return _gpus(value, "gpus")

    @field_validator("borrowing_limit", "lending_limit", mode="before")
    @classmethod
    def _limit(cls, value: Any, info: Any) -> Any:
        return None if value is None else _gpus(value, str(info.field_name))

    @model_validator(mode="after")
    def _limits(self) -> QueueSpec:
        if self.cohort is None:
            for field in ("borrowing_limit", "lending_limit"):
                if getattr(self, field) is not None:
                    raise ValueError(f"queue {self.name}: {field} needs a `cohort` to share with")
        if self.lending_limit is not None:
            most = max(self.quota.values(), default=0)
            if self.lending_limit > most:
                raise ValueError(
                    f"queue {self.name}: lending_limit {self.lending_limit} is more than its "
                    f"quota of {most} GPU{'' if most == 1 else 's'}"
                )
        return self

    @property
    def quota(self) -> dict[str, int]:
        """Nominal GPUs per quota key: GPU model names, or ANY_MODEL for a total."""
        return dict(self.gpus) if isinstance(self.gpus, dict) else {ANY_MODEL: self.gpus}

    @property
    def unlimited(self) -> bool:
        """No quota limit and no cohort (the built-in default): its jobs go wherever they fit."""
        return self.cohort is None and all(gpus >= MAX_QUOTA_GPUS for gpus in self.quota.values())


def gpu_amounts(amounts: Mapping[str, float]) -> str:
    """`16` for a total, `A100:8 T4:4` per model, `0` for nothing; a share as its fraction,
    to two decimals (a loan split between lenders in proportion: `A100:1.33`): how `gpuflow
    queue list` and the admission's reasons write a quota or a use of one."""
    shown = {key: round(gpus, 2) for key, gpus in amounts.items()}
    parts = [
        f"{gpus:g}" if key == ANY_MODEL else f"{key}:{gpus:g}"
        for key, gpus in sorted(shown.items())
        if gpus
    ]
    return " ".join(parts) or "0"


def unknown_queue(name: str, known: Iterable[str]) -> str:
    """What a user is told of a queue that does not exist (a job naming it, `ps -q`,
    `queue delete`)."""
    return f'queue "{name}" does not exist; known: {", ".join(known)}'
