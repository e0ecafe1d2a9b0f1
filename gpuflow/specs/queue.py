"""Queue files: where jobs wait, with a nominal GPU quota shared within a cohort (in the spirit
of Kueue's ClusterQueue; docs/architecture.md, "Queues and admission")."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from gpuflow.errors import SpecError
from gpuflow.specs.job import SPEC_CONFIG, check_name
from gpuflow.specs.units import check_text, shown

MAX_QUOTA_GPUS = 1_000_000
"""Most GPUs a quota or a limit may name."""
MAX_QUOTA_MODELS = 64
ANY_MODEL = "*"
"""The quota key of a queue whose quota is a total over every GPU model; never a key a queue
file writes (a total is written as a number)."""
QUOTA_WAIT = "quota: "
"""How the reason starts that says which limit of its queue's quota keeps a job waiting
(gpuflow/scheduler/quota.py `quota_wait`): `gpuflow ps` shows it as the job's reason."""

__all__ = [
    "ANY_MODEL",
    "MAX_QUOTA_GPUS",
    "QUOTA_WAIT",
    "QueueSpec",
    "queue_name",
    "unknown_queue",
]


def _yaml(value: Any) -> str:
    """A value as a file spells it: `true`, not Python's `True`."""
    return str(value).lower() if isinstance(value, bool) else shown(value)


def _gpus(value: Any, model: str | None = None) -> int:
    """A whole number of GPUs, 0..MAX_QUOTA_GPUS, or a one-line error; the field is named by
    where the error is told (`gpus: ...`), a model of a per-model quota by the message."""
    which = f"{model} " if model else ""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{which}must be a whole number of GPUs, not {_yaml(value)}")
    if not 0 <= value <= MAX_QUOTA_GPUS:
        raise ValueError(f"{which}must be 0..{MAX_QUOTA_GPUS} GPUs, not {value}")
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
    """Nominal quota: GPUs this queue is entitled to (0..1000000 each), either a total over
    every model (a number) or per GPU model (a mapping of upper-case names as in fleet files;
    a model not listed has a quota of 0). `*` is not a model: a total is written as a number.
    The queues of one cohort all have a total or all a quota per model (a cohort lends per
    model, or as one total, never across the two). A GPU share counts as its fraction."""
    cohort: str | None = Field(default=None, examples=["lab"])
    """Queues of one cohort lend each other the quota they do not use. Omitted: the queue
    never borrows or lends."""
    borrowing_limit: int | None = Field(default=None, examples=[8])
    """Most GPUs (per model, for a per-model quota; 0..1000000) this queue may use beyond its
    quota, taken from idle quota of its cohort. Omitted: as many as the cohort lends."""
    lending_limit: int | None = Field(default=None, examples=[4])
    """Most GPUs (per model, for a per-model quota; 0..1000000, and at most its quota) of this
    queue's idle quota that the cohort may borrow. Omitted: all of it."""

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
                if key == ANY_MODEL:  # it had no meaning: only the total counted, silently
                    raise ValueError(
                        "* is not a GPU model: write a total over every model as a number "
                        f"(gpus: {_yaml(count)}), or name each model"
                    )
                if key in quota:
                    raise ValueError(f"GPU model {key} is listed twice in gpus")
                quota[key] = _gpus(count, key)
            return quota
        return _gpus(value)

    @field_validator("borrowing_limit", "lending_limit", mode="before")
    @classmethod
    def _limit(cls, value: Any) -> Any:
        return None if value is None else _gpus(value)

    @model_validator(mode="after")
    def _limits(self) -> QueueSpec:
        if self.cohort is None:
            for field in ("borrowing_limit", "lending_limit"):
                if getattr(self, field) is not None:
                    raise ValueError(f"{field} needs a `cohort` to share with")
        if self.lending_limit is not None:
            most = max(self.quota.values(), default=0)
            if self.lending_limit > most:
                raise ValueError(
                    f"lending_limit {self.lending_limit} is more than its quota of {most} "
                    f"GPU{'' if most == 1 else 's'}"
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
    names = list(known)
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return f'queue "{name}" does not exist{hint}; known: {", ".join(names)}'


def queue_name(value: str) -> str:
    """A queue's name as a request gives it (`queue delete`, `Client.delete_queue`), or a
    SpecError quoting the naming rule, as `Client.jobs(queue=...)` refuses one: no queue could
    have a malformed name, so none is looked for."""
    try:
        return check_name(value, "queue name")
    except ValueError as exc:
        raise SpecError(str(exc)) from None
