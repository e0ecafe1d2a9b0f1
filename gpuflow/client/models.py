"""What the client returns: its own public models, never a workflow payload or a store row.

Workflow payloads must stay replay-compatible and store rows follow the schema; these follow
the client's users. Each is built from the API's answer (gpuflow/workflows/api.py) or a
workflow's result by a `from_*` constructor, the one place where the two meet.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, Field, computed_field

from gpuflow.scheduler.model import Placement
from gpuflow.scheduler.offers import Offers
from gpuflow.status import JobStatus, TerminationReason
from gpuflow.workflows.api import JobRecord
from gpuflow.workflows.api_dry_runs import (
    OptionOffersRecord,
)
from gpuflow.workflows.api_fleets import FleetRecord
from gpuflow.workflows.api_queues import QueueApplied, QueueRecord
from gpuflow.workflows.models import JobProgress, JobResult


class JobInfo(BaseModel):
    """A job as `gpuflow ps` shows it."""

    id: str
    name: str
    status: JobStatus
    reason: str | None = None
    message: str | None = None
    fleet: str | None = None
    hosts: list[str] = Field(default_factory=list)
    gpus: str | None = None
    attempt: int = 1
    priority: int = 0
    preemptible: bool = False
    """Whether admission may stop it for a job of higher priority or a queue's quota."""
    submitted_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    queue: str | None = None
    """The queue the job waits or runs in."""
    queue_position: int | None = None
    """While it waits: its place in the last admission pass's order, 1 first."""
    queue_reason: str | None = None
    """While it waits: why the last admission pass did not start it: `no_capacity`, `quota`
    (its queue's quota, borrowing included, is used), `reserved_for:<job id>` (what it needs is
    held for a higher job), `quota_held_for:<job id>` (its queue's quota is kept for a job
    before it that waits for quota), `preempting:<job ids>` (those jobs are being stopped for
    it)."""
    reserved_hosts: list[str] = Field(default_factory=list)
    """While it waits for capacity at the head of admission's order: the hosts reserved for
    it (`fleet/host`); later jobs may use them only when they end before it could start."""
    reserved_start: datetime | None = None
    """When it holds a reservation: the time by which it starts if every job it waits for
    runs to its max_duration (jobs that end sooner bring it forward; a job ahead of it in
    admission's order takes the reservation over). None: not known (a job it waits for
    declares no max_duration)."""
    hosts_not_ready: dict[str, str] = Field(default_factory=dict)
    """While it is provisioning or running: its hosts that are not ready, by name, with their
    state and why (`agent not answering`: the fleet's health round had no answer from the
    host's agent; the job ends `host_lost` if its own probes keep failing)."""

    @classmethod
    def from_record(cls, record: JobRecord) -> JobInfo:
        return cls.model_validate(record.model_dump())


class JobEvent(BaseModel):
    """One status a job recorded, with its words (`Client.events`)."""

    at: datetime
    status: str
    message: str


class JobEvents(BaseModel):
    """A job's newest events, oldest first, and how many it has in all."""

    job_id: str
    events: list[JobEvent]
    total: int


class JobDescription(BaseModel):
    """A job in full, as `gpuflow describe --json` prints it (`Client.describe`)."""

    job: JobInfo
    events: list[JobEvent]
    """Its newest recorded statuses, oldest first."""
    events_total: int
    """How many statuses it recorded in all."""


class JobOutcome(BaseModel):
    """How a job ended (`Client.wait`)."""

    job_id: str
    status: JobStatus
    reason: TerminationReason
    message: str
    attempts: int
    exit_codes: dict[int, int | None] = Field(default_factory=dict)
    """Exit code of each node (by rank); None where the process was not seen to exit."""
    name: str | None = None
    """The job's name (None from a control plane that did not say it)."""

    @classmethod
    def from_result(cls, result: JobResult) -> JobOutcome:
        return cls.model_validate(result.model_dump())


class Progress(BaseModel):
    """Where a running job is (`Client.progress`)."""

    job_id: str
    name: str
    status: JobStatus
    attempt: int
    placement: Placement | None = None
    reason: TerminationReason | None = None
    message: str = ""
    waiting_reasons: list[str] = Field(default_factory=list)
    simulated: bool = False

    @classmethod
    def from_progress(cls, progress: JobProgress) -> Progress:
        return cls.model_validate(progress.model_dump())


class FleetInfo(BaseModel):
    """A fleet and its hosts (`gpuflow fleet list --json`)."""

    name: str
    kind: str
    scorer: str
    hosts: list[dict[str, Any]]
    """Each host: `name`, `state` (and `state_detail`: why not ready), `os`, `arch`, `backend`,
    `driver_version`, `gpus` (`index`, `name`, `memory_mib`, `used`: the share allocated,
    `compute_capability`), `gpu_used`, `cpus`/`cpus_used`, `memory_mib`/`memory_used_mib`,
    `disk_mib`/`disk_used_mib`, `blocks`/`blocks_busy`, `labels` and `taints` (what decides
    which jobs it takes), `simulated`, and `utilization`: where a simulated host's GPU
    utilization comes from (`source` `process_cpu` or `constant` at `value`); None for a real
    host (NVML)."""
    workload: dict[str, Any] | None = None
    """The request mix the fragmentation scorer uses now: the mix in use (gpuflow/services/mix.py
    `mix_info`), learned from the fleet's recent jobs, the built-in one without history."""
    warnings: list[str] = Field(default_factory=list)
    """From `apply_fleet`: what the apply left that needs a look (GPUs a new spec drops while
    running jobs hold them)."""

    @classmethod
    def from_record(cls, record: FleetRecord) -> FleetInfo:
        hosts = [_host_info(host, record.common_labels) for host in record.hosts]
        return cls.model_validate({**record.model_dump(exclude={"common_labels"}), "hosts": hosts})


def _host_info(host: dict[str, Any], common: dict[str, str]) -> dict[str, Any]:
    """A host of a FleetRecord with its labels whole, in the place of its `other_labels`: the
    fleet's common ones and its others (from a control worker that sent no labels: as sent)."""
    whole: dict[str, Any] = {}
    for key, value in host.items():
        if key == "other_labels":
            whole["labels"] = {**common, **value}
        else:
            whole[key] = value
    return whole


class QueueInfo(BaseModel):
    """A queue and what it uses now (`gpuflow queue list`). GPU amounts are per quota key: a
    GPU model, or `*` for a queue whose quota is a total over every model; a GPU share counts
    as its fraction."""

    name: str
    cohort: str | None = None
    quota: dict[str, int] | None
    """Nominal GPUs per quota key; None: no limit, as `queue list` says (the built-in default
    queue, or one applied with the most a quota may be and no cohort)."""
    borrowing_limit: int | None = None
    lending_limit: int | None = None
    built_in: bool = False
    """The default queue, not applied from a file (no quota limit)."""
    used: dict[str, float] = Field(default_factory=dict)
    """GPUs its admitted jobs hold."""
    borrowed: dict[str, float] = Field(default_factory=dict)
    """The part of `used` beyond its quota that idle quota of its cohort covers."""
    lent: dict[str, float] = Field(default_factory=dict)
    """The part of its idle quota that its cohort's borrowing uses: the cohort's borrowing,
    shared among the queues that lend in proportion to what each may lend."""
    over_quota: dict[str, float] = Field(default_factory=dict)
    """The part of `used` beyond its quota that nothing covers now (its quota, or a lender's,
    was lowered under running jobs); a job that needs that quota preempts them if it may."""
    waiting: int = 0
    """Jobs waiting to be admitted."""
    admitted: int = 0
    """Jobs running (or starting): the same count as `running`, under its first name."""
    between_attempts: int = 0
    """Jobs between two attempts (retrying after an error or a preemption): neither waiting
    nor running now, and their next attempt enters the queue again. `queue delete` counts
    them; `queue list` notes them under its table."""

    @computed_field  # type: ignore[prop-decorator]
    @property
    def running(self) -> int:
        """Jobs running (or starting), as `queue list` says it (`admitted`, kept)."""
        return self.admitted

    @classmethod
    def from_record(cls, record: QueueRecord) -> QueueInfo:
        # `built_in`: what a control worker from before `unlimited` says of the default queue.
        unlimited = record.unlimited or record.built_in
        fields = record.model_dump(exclude={"unlimited"})
        return cls.model_validate({**fields, "quota": None if unlimited else record.quota})


class AppliedQueue(BaseModel):
    """What `Client.apply_queue` did."""

    queue: QueueInfo
    created: bool
    """False: a queue of that name existed and was updated."""
    changed: bool = True
    """False: a queue of that name existed and was so already: nothing changed."""
    warnings: list[str] = Field(default_factory=list)
    """What the queue names that no fleet has (GPU models of a per-model quota)."""

    @classmethod
    def from_record(cls, record: QueueApplied) -> AppliedQueue:
        queue = QueueInfo.from_record(record.queue)
        return cls(
            queue=queue, created=record.created, changed=record.changed, warnings=record.warnings
        )


class OptionOffers(BaseModel):
    """The dry run of one resource option of a job."""

    option: int
    """1 for `resources`, 2 for the first of `alternatives`, ..."""
    gpu: str
    offers: Offers

    @classmethod
    def from_record(cls, record: OptionOffersRecord) -> OptionOffers:
        return cls(option=record.option, gpu=record.gpu, offers=record.offers)


def taken_option(per_option: list[OptionOffers]) -> OptionOffers | None:
    """The resource option a job submitted now would run with: the first one that places
    (hosts that fit one by one are not enough for a gang); None when none does."""
    return next((o for o in per_option if o.offers.placement is not None), None)


class StopStep(StrEnum):
    """Which step of `Client.stop` ended the job."""

    ALREADY_ENDED = "already_ended"
    REQUESTED = "requested"
    STOP_SIGNAL = "stop_signal"
    CANCELLATION = "cancellation"
    TERMINATION = "termination"
    WORKFLOW_CLOSED = "workflow_closed"

    @property
    def description(self) -> str:
        return _STOP_STEP_DESCRIPTION[self]


_STOP_STEP_DESCRIPTION = {
    StopStep.ALREADY_ENDED: "it had already ended",
    StopStep.REQUESTED: "stop requested, not waited for",
    StopStep.STOP_SIGNAL: "ended by the stop signal",
    StopStep.CANCELLATION: "its workflow did not answer the stop signal: ended by cancelling it",
    StopStep.TERMINATION: (
        "its workflow answered neither stop nor cancel: terminated, its processes stopped and "
        "its GPUs released by reconciliation"
    ),
    StopStep.WORKFLOW_CLOSED: (
        "its workflow had already closed: its processes stopped and its GPUs released by "
        "reconciliation"
    ),
}


class StopOutcome(JobInfo):
    """The job after `Client.stop`, and the step that ended it."""

    ended_by: StopStep
