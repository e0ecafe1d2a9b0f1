"""The API's job events (gpuflow/workflows/api.py serves them): what `gpuflow describe` shows
of a job's life, every status it recorded with its words, newest last."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

__all__ = ["EVENTS_PER_ANSWER", "JobEventRecord", "JobEvents", "JobEventsRequest"]

EVENTS_PER_ANSWER = 500
"""Events in one answer at most: a job retried for days records thousands; each is a status
and its words (a waiting job's reasons run to a few hundred bytes), so an answer stays far
under Temporal's payload limits."""


class JobEventsRequest(BaseModel):
    ref: str
    """A job id, or a job name (the newest job of that name)."""
    most: int = Field(default=100, ge=1, le=EVENTS_PER_ANSWER)
    """The newest events to answer."""


class JobEventRecord(BaseModel):
    at: datetime
    status: str
    message: str


class JobEvents(BaseModel):
    job_id: str
    events: list[JobEventRecord]
    """The newest `most`, oldest first."""
    total: int
    """Every event the job has, when `events` holds only the newest."""
