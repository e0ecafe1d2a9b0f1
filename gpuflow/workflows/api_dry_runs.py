"""The API's dry runs (gpuflow/workflows/api.py serves them): what `gpuflow offers` and the plan
before `gpuflow apply` ask, and their answers, bounded to one Temporal payload."""

from __future__ import annotations

from pydantic import BaseModel, Field

from gpuflow.scheduler.model import Placement
from gpuflow.scheduler.offers import Offers
from gpuflow.specs.job import JobSpec

__all__ = [
    "ANSWER_LINES",
    "LEAST_LINES",
    "OffersRequest",
    "OptionOffersRecord",
    "PlanRecord",
    "PlanRequest",
    "answer_lines",
]


class OptionOffersRecord(BaseModel):
    option: int
    gpu: str
    offers: Offers


class PlanRecord(BaseModel):
    """gpuflow/scheduler/together.py `JobPlan`, as a payload."""

    job: JobSpec
    options: list[Offers]
    taken: int | None
    alone: Placement | None = None
    alone_fits: bool = False
    fits_idle: bool = True
    queue_never: str | None = None
    admitted: Placement | None = None
    preempts: list[str] = Field(default_factory=list)
    waits: str | None = None
    ahead: int = 0
    first: int = 0


ANSWER_LINES = 1_000
"""Hosts a dry run's answer (`offers`, `plan`) names at most over all its resource options, in
each of its lists (hosts that fit; hosts that do not, grouped by reason past that): about 200
bytes a line, so the answer stays far under Temporal's 2 MiB payload limit on any fleet (every
host of six options on 4,096 hosts was 4.6 MB)."""
LEAST_LINES = 10
"""Lines per option and list however many options the answer holds (a plan shows up to 10
reasons an option does not fit)."""


def answer_lines(options: int) -> int:
    """Lines per option and list of a dry run's answer of this many resource options."""
    return max(LEAST_LINES, ANSWER_LINES // max(1, options))


class OffersRequest(BaseModel):
    spec: JobSpec
    most: int | None = Field(default=None, ge=1)
    """Hosts that fit to answer per option at most (None: as many as the answer may carry;
    the control worker answers no more than that whatever is asked)."""


class PlanRequest(BaseModel):
    specs: list[JobSpec]
