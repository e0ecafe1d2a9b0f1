"""The API's queue payloads (gpuflow/workflows/api.py serves them): the queues and what they
use, and a waiting or running job's priority changed."""

from __future__ import annotations

from pydantic import BaseModel, Field

from gpuflow.specs.job import MAX_PRIORITY, MIN_PRIORITY

__all__ = ["PriorityRequest", "QueueApplied", "QueueRecord", "QueueRef"]


class QueueRecord(BaseModel):
    """A queue and what it uses now (gpuflow/services/queues.py `QueueUsage`). GPU amounts are
    per quota key: a GPU model, or `*` for a queue whose quota is a total over every model."""

    name: str
    cohort: str | None = None
    quota: dict[str, int]
    borrowing_limit: int | None = None
    lending_limit: int | None = None
    built_in: bool = False
    """The default queue, not applied from a file."""
    unlimited: bool = False
    """No quota limit (QueueSpec.unlimited: the built-in default, or a queue applied so;
    `quota` holds the most a quota may be): the client shows its quota as None. A control
    worker from before this field says it of the built-in default only, by `built_in`."""
    used: dict[str, float] = Field(default_factory=dict)
    borrowed: dict[str, float] = Field(default_factory=dict)
    lent: dict[str, float] = Field(default_factory=dict)
    over_quota: dict[str, float] = Field(default_factory=dict)
    waiting: int = 0
    admitted: int = 0
    """Jobs admitted: starting or running."""
    between_attempts: int = 0
    """Jobs between two attempts (none from a control worker from before this field)."""


class QueueApplied(BaseModel):
    queue: QueueRecord
    created: bool
    """False: the queue existed and was updated."""
    changed: bool = True
    """False: the queue was so already (nothing written)."""
    warnings: list[str] = Field(default_factory=list)
    """What the queue names that no fleet has (GPU models)."""


class QueueRef(BaseModel):
    name: str


class PriorityRequest(BaseModel):
    """A job's new priority within its queue (`gpuflow set-priority`)."""

    ref: str
    """A job id, or a job name (the newest job of that name)."""
    priority: int = Field(ge=MIN_PRIORITY, le=MAX_PRIORITY)
