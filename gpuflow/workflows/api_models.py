"""The payloads of the control plane's API workflow (gpuflow/workflows/api.py): the contract
between the client and the control worker. The client turns them into its own public models
(gpuflow/client/models.py) and never returns them."""

from __future__ import annotations

import re
from datetime import datetime

from pydantic import BaseModel, Field

from gpuflow.specs.job import JobSpec


class JobRecord(BaseModel):
    """A job as the control plane knows it (its row, or its open workflow not yet recorded)."""

    id: str
    name: str
    status: str
    reason: str | None = None
    message: str | None = None
    fleet: str | None = None
    hosts: list[str] = Field(default_factory=list)
    gpus: str | None = None
    attempt: int = 1
    priority: int = 0
    preemptible: bool = False
    submitted_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    queue: str | None = None
    """The queue the job waits or runs in (None: not known, from a control plane before queues)."""
    queue_position: int | None = None
    """A waiting job's place in the last admission pass's order, 1 first."""
    queue_reason: str | None = None
    """Why a waiting job was not admitted by the last pass: no_capacity, quota,
    reserved_for:<job id>, quota_held_for:<job id> or preempting:<job ids>."""
    reserved_hosts: list[str] = Field(default_factory=list)
    """A waiting job that holds the backfill reservation: the hosts reserved for it."""
    reserved_start: datetime | None = None
    """When it can start at the latest (None: not known), if it holds the reservation."""
    hosts_not_ready: dict[str, str] = Field(default_factory=dict)
    """A job placed on hosts (provisioning or running): each of them that is not ready, by
    name, with its state and why (an agent not answering: the job is lost if it stays so)."""


class SubmitRequest(BaseModel):
    job_id: str
    spec: JobSpec
    search_attributes: bool = True


class JobRef(BaseModel):
    ref: str
    """A job id, or a job name (the newest job of that name)."""


JOBS_PER_PAGE = 500
"""Jobs one answer of the jobs' listing holds at most: the client reads a long listing a page
at a time, each older than the last. A record is under 1 KB but for its message, which a
listing cuts at LISTED_MESSAGE_CHARS (a waiting job's reasons can be a line per host)."""
LISTED_MESSAGE_CHARS = 1_000
"""A listed job's message is cut here (the Python client's `get` has it whole)."""


class JobsRequest(BaseModel):
    include_finished: bool = False
    most: int = Field(default=200, ge=1)
    """Jobs to answer at most (JOBS_PER_PAGE whatever is asked; older clients ask nothing and
    get the newest 200, as before pages)."""
    before: tuple[datetime, str] | None = None
    """The submission time and id of the last job of the page before: this page's are older.
    An open workflow not recorded yet is on the page whose span holds its start."""
    queue: str | None = None
    """Only the jobs of this queue (the one each names; None: every queue). A control worker
    older than this field answers every queue's: the client filters again."""


class HostQueueRequest(BaseModel):
    job_id: str
    rank: int
    attempt: int | None = None
    """An earlier attempt's host; None: the current attempt's."""


class HostQueueResult(BaseModel):
    task_queue: str | None = None


class Empty(BaseModel):
    pass


class SecretKey(BaseModel):
    public_key: str
    """The control plane's X25519 public key, base64 (gpuflow/sealed.py)."""


class SecretRef(BaseModel):
    name: str


class SecretNames(BaseModel):
    names: list[str]


class SecretDeleted(BaseModel):
    deleted: bool


SECRET_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,127}$")
MAX_SEALED_CHARS = 64 * 1024
