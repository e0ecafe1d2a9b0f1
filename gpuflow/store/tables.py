"""The tables. Capacity (fleets, hosts, GPUs, allocations) and jobs with their events."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, Column, Index, UniqueConstraint
from sqlmodel import Field, SQLModel


def utcnow() -> datetime:
    return datetime.now(UTC)


# Default factories are plain functions, not the builtins `dict` and `list`: pydantic inspects
# a factory's signature on every construction that leaves the field out, and a builtin's costs
# 6 µs (`dict`) to 90 µs (`list`) against 5 µs for a function (group commit builds thousands).
def _empty_dict() -> dict[str, Any]:
    return {}


def _empty_list() -> list[Any]:
    return []


class FleetRow(SQLModel, table=True):
    __tablename__ = "fleets"

    name: str = Field(primary_key=True)
    kind: str
    scorer: str = "fragmentation"
    spec: dict[str, Any] = Field(default_factory=_empty_dict, sa_column=Column(JSON))
    created_at: datetime = Field(default_factory=utcnow)


class HostRow(SQLModel, table=True):
    __tablename__ = "hosts"

    id: str = Field(primary_key=True)
    fleet: str = Field(index=True)
    name: str
    state: str
    state_detail: str | None = None
    os: str = "linux"
    arch: str = "x86_64"
    cpus: int = 1
    memory_mib: int = 0
    disk_mib: int = 0
    backend: str | None = None
    driver_version: str | None = None
    labels: dict[str, str] = Field(default_factory=_empty_dict, sa_column=Column(JSON))
    taints: list[str] = Field(default_factory=_empty_list, sa_column=Column(JSON))
    blocks: int = 1
    simulated: bool = False
    address: str = "127.0.0.1"
    task_queue: str = ""
    last_heartbeat: datetime | None = None
    ssh: dict[str, Any] = Field(default_factory=_empty_dict, sa_column=Column(JSON))
    """How to reach an ssh host (hostname, port, user, key file path; never key content)."""
    sim_utilization: dict[str, Any] = Field(default_factory=_empty_dict, sa_column=Column(JSON))


class GpuRow(SQLModel, table=True):
    __tablename__ = "gpus"
    __table_args__ = (UniqueConstraint("host_id", "index"),)

    id: int | None = Field(default=None, primary_key=True)
    host_id: str = Field(index=True)
    index: int
    name: str
    vendor: str = "nvidia"
    memory_mib: int = 0
    uuid: str | None = None
    compute_capability: str | None = None


class AllocationRow(SQLModel, table=True):
    """One node of a job's placement. (job_id, attempt, rank) is the idempotency key."""

    __tablename__ = "allocations"
    __table_args__ = (UniqueConstraint("job_id", "attempt", "rank"),)

    id: int | None = Field(default=None, primary_key=True)
    job_id: str = Field(index=True)
    attempt: int
    rank: int
    fleet: str
    host_id: str = Field(index=True)
    gpu_indices: list[int] = Field(default_factory=_empty_list, sa_column=Column(JSON))
    gpu_fraction: float | None = None
    blocks: list[int] = Field(default_factory=_empty_list, sa_column=Column(JSON))
    cpus: float = 0
    memory_mib: int = 0
    disk_mib: int = 0
    node: dict[str, Any] = Field(default_factory=_empty_dict, sa_column=Column(JSON))
    """The NodePlacement as placed, so a repeated activity returns exactly the same answer."""
    score: float = 0
    scorer: str = ""
    created_at: datetime = Field(default_factory=utcnow)


JOBS_BY_SUBMISSION = "ix_jobs_newest"
"""The jobs newest first, with what picks a fleet's: a fleet's learned mix reads its newest
jobs in every placement transaction (gpuflow/services/mix.py); without the index that read
sorts the whole job history, and with (submitted_at, id) alone it looks up every row it walks
for its fleet and status (SQLite, 10,000 jobs: 5.7 ms a read, 3.9 ms covered)."""


class JobRow(SQLModel, table=True):
    __tablename__ = "jobs"
    __table_args__ = (Index(JOBS_BY_SUBMISSION, "submitted_at", "id", "fleet", "status"),)

    id: str = Field(primary_key=True)
    """The workflow id, `job-<name>-<suffix>`."""
    name: str = Field(index=True)
    status: str = Field(index=True)
    termination_reason: str | None = None
    message: str | None = None
    spec: dict[str, Any] = Field(default_factory=_empty_dict, sa_column=Column(JSON))
    fleet: str | None = None
    hosts: list[str] = Field(default_factory=_empty_list, sa_column=Column(JSON))
    gpus: str | None = None
    attempt: int = 1
    earlier_hosts: dict[str, list[str]] | None = Field(default=None, sa_column=Column(JSON))
    """The hosts of each earlier attempt that was placed, by attempt number (`hosts` holds the
    current one's): where `gpuflow logs --attempt N` reads an attempt's output."""
    waiting_for_capacity: bool = Field(default=False, index=True)
    """Pending because nothing fits now (not merely not placed yet): whom freed capacity wakes."""
    submitted_at: datetime = Field(default_factory=utcnow)
    started_at: datetime | None = None
    finished_at: datetime | None = None


class JobEventRow(SQLModel, table=True):
    __tablename__ = "job_events"
    __table_args__ = (UniqueConstraint("job_id", "key"),)

    id: int | None = Field(default=None, primary_key=True)
    job_id: str = Field(index=True)
    key: str
    """Idempotency key of the event (a repeated activity writes it once)."""
    ts: datetime = Field(default_factory=utcnow)
    kind: str
    message: str


class FleetMixRow(SQLModel, table=True):
    """The request mix a fleet's placements score with (gpuflow/services/mix.py `mix_in_use`):
    written by a placement transaction when the mix its recent jobs make has drifted far
    enough from this one, so every control worker and every cold read use the same."""

    __tablename__ = "fleet_mixes"

    fleet: str = Field(primary_key=True)
    token: str
    """New with every write (a rolled-back write's token is never seen again)."""
    source: str
    jobs: float = 0
    observed: int = 0
    requests: list[dict[str, Any]] = Field(default_factory=_empty_list, sa_column=Column(JSON))
    updated_at: datetime = Field(default_factory=utcnow)
    checked: str | None = None
    """The job at which this mix was last compared with the learned one (None: never); until
    the fleet's comparison checkpoint (gpuflow/services/mix.py `checkpoint_at`) is another job,
    nobody compares again."""


class CapacityVersionRow(SQLModel, table=True):
    """One row of change counters, bumped in the same transaction as every write that changes
    what placement reads: a control worker's warm state reads this row, not the fleet, to know
    whether it is still current (gpuflow/services/warm.py)."""

    __tablename__ = "capacity_versions"

    id: int = Field(default=1, primary_key=True)
    structure: int = 0
    """Fleets, hosts and GPUs applied or deleted."""
    states: int = 0
    """A host's readiness (state or its detail) changed."""
    allocations: int = 0
    """Allocations taken or released."""


class CapacityChangeRow(SQLModel, table=True):
    """Which hosts the transaction that bumped a per-host counter (`states`, `allocations`) to
    `version` changed (gpuflow/services/changes.py): a warm state a few versions behind re-reads
    only those hosts. The newest few hundred versions of each are kept."""

    __tablename__ = "capacity_changes"

    kind: str = Field(primary_key=True)
    """states | allocations"""
    version: int = Field(primary_key=True)
    host_id: str = Field(primary_key=True)


class QueueRow(SQLModel, table=True):
    """A queue file as applied (gpuflow/specs/queue.py); `default` exists without a row."""

    __tablename__ = "queues"

    name: str = Field(primary_key=True)
    spec: dict[str, Any] = Field(default_factory=_empty_dict, sa_column=Column(JSON))
    created_at: datetime = Field(default_factory=utcnow)
    updated_at: datetime = Field(default_factory=utcnow)


PREEMPTIBLE_ENTRIES = "ix_queue_entries_preemptible"
"""A queue's entries by whether they may be preempted and their priority: a job that does not
fit and may not wait asks whether a running job of its queue could be preempted for it
(`victims_possible`); with only the queue and state indexes that question walks every job
admitted in the queue (several milliseconds at a few thousand running jobs), with this index it
reads none when nothing is preemptible."""


class QueueEntryRow(SQLModel, table=True):
    """A job's place in its queue, from the moment it asks for capacity until it releases it:
    `waiting` until an admission pass admits it (`admitted`, its allocation taken in the same
    transaction). What admission reads of running jobs (queue, priority, preemptible) is here,
    so a pass never parses running jobs' specs."""

    __tablename__ = "queue_entries"
    __table_args__ = (Index(PREEMPTIBLE_ENTRIES, "queue", "preemptible", "priority", "state"),)

    job_id: str = Field(primary_key=True)
    attempt: int
    name: str
    queue: str = Field(index=True)
    state: str = Field(index=True)
    """waiting | admitted"""
    priority: int = 0
    preemptible: bool = False
    may_wait: bool = True
    """False: a job whose retry does not cover no_capacity; refused by the first pass that
    cannot admit it, with the reasons."""
    spec: dict[str, Any] = Field(default_factory=_empty_dict, sa_column=Column(JSON))
    """The job spec (what admission places); {} once admitted."""
    fleets: list[str] = Field(default_factory=_empty_list, sa_column=Column(JSON))
    submitted_at: datetime = Field(default_factory=utcnow)
    """When the job entered the queue (order within a priority)."""
    admitted_at: datetime | None = None
    decided_by: str | None = Field(default=None, index=True)
    """The admission pass that admitted or refused it (the loop's id of that pass): a run of the
    pass whose result was lost tells its job again (services/admission.py `retold_in`)."""
    max_duration_s: float | None = None
    position: int | None = None
    """Its place in the last pass's order of waiting jobs (0 first)."""
    reason: str | None = None
    """Why the last pass left it waiting: no_capacity, quota, reserved_for:<job>,
    quota_held_for:<job>, preempting."""
    detail: str | None = None
    """The last pass's per-host reasons, `; `-separated (for a job that may not wait)."""
    reserved_hosts: str | None = None
    """The job holds the backfill reservation (the last pass's): the hosts reserved for it,
    `,`-separated host ids; None for every other entry."""
    reserved_start: datetime | None = None
    """When the reservation's job can start at the latest, if no job runs past its
    max_duration and none takes the reservation over; None: unknown (a job it waits for
    declares no max_duration)."""
