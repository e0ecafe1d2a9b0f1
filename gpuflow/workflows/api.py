"""The client-facing API of the control plane: one long-lived workflow, `gpuflow-api`.

Temporal is gpuflow's only network path (DESIGN.md): the client and the CLI hold a Temporal
connection and nothing else, and only control workers hold the database and the fleets' SSH
keys. Every request that needs them is an update of this workflow, whose handler runs one
control activity (gpuflow/control/api.py) on the control task queue. So Temporal's namespaces,
mTLS, API keys and authorization are what guard the database, and the request and its answer
are in the workflow's history.

Why updates of one workflow rather than a workflow per request: an update answers
synchronously (the caller waits for the activity's result), its validator refuses a bad request
before anything is written to history, and the first client starts the workflow with
update-with-start (USE_EXISTING), so nothing has to be deployed beside the control worker. The
workflow continues as new when Temporal suggests it, once every running handler has finished.

The payload models here are the API's contract between client and control worker; the client
turns them into its own public models (gpuflow/client/models.py) and never returns them.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Any

from pydantic import BaseModel, Field
from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from gpuflow.sealed import SealedSecret
    from gpuflow.specs.fleet import FleetSpec
    from gpuflow.specs.job import JobSpec
    from gpuflow.specs.queue import QueueSpec
    from gpuflow.workflows.api_dry_runs import (
        OffersRequest,
        OptionOffersRecord,
        PlanRecord,
        PlanRequest,
    )
    from gpuflow.workflows.api_events import JobEvents, JobEventsRequest
    from gpuflow.workflows.api_fleets import FleetRecord, FleetRef, FleetsPage
    from gpuflow.workflows.api_queues import (
        PriorityRequest,
        QueueApplied,
        QueueRecord,
        QueueRef,
    )

API_WORKFLOW_ID = "gpuflow-api"
JOB_MEMO = "gpuflow_job"
"""Memo of a JobWorkflow: its name, priority and queue, for listing the job before its row
exists (`job_memo`)."""


def job_memo(spec: JobSpec) -> dict[str, Any]:
    """The memo a JobWorkflow is started with, by a submit or by a schedule."""
    return {JOB_MEMO: {"name": spec.name, "priority": spec.priority, "queue": spec.queue}}


API_ACTIVITY_TIMEOUT = timedelta(seconds=30)
"""How long one request's activity may run: each reads or writes a little of the database. A
control worker killed in the middle of one costs the caller this much before the request is
retried on another worker (the client itself waits 60 s)."""
API_CALL_BUDGET = timedelta(seconds=55)
"""All attempts of one request end within this, under the client's 60 s wait: a request the
client gave up on is not done by a later retry."""
FLEET_APPLY_TIMEOUT = timedelta(minutes=5)
"""Long enough for `fleet apply` to gather the facts of an SSH fleet's hosts."""
API_RETRY = RetryPolicy(maximum_attempts=3, non_retryable_error_types=["GpuflowError"])
PATCH_LOCAL_CALLS = "api-local-calls"
"""`submit` and `job` run their activity as a local activity of the control worker that runs
this workflow's task: the answer is a marker in the task that accepted the update, with no
activity task on the server (half the events and round trips of a submit). Histories from
before replay their activity tasks."""


# ---- payloads ---------------------------------------------------------------------------------


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


# ---- the workflow -----------------------------------------------------------------------------


def _refuse(message: str) -> None:
    """A validator's refusal: one line, nothing written to history."""
    raise ApplicationError(message, type="GpuflowError", non_retryable=True)


def _name(value: str, what: str) -> None:
    if not value.strip():
        _refuse(f"{what} is empty")
    if len(value) > 200:
        _refuse(f"{what} is longer than 200 characters")


@workflow.defn(name="ControlApiWorkflow")
class ControlApiWorkflow:
    """Answers the client's requests, each by one control activity (see the module docstring)."""

    def __init__(self) -> None:
        self._served = 0

    @workflow.run
    async def run(self, served: int = 0) -> None:
        self._served = served
        await workflow.wait_condition(lambda: workflow.info().is_continue_as_new_suggested())
        # Continuing as new while a handler runs would drop its answer.
        await workflow.wait_condition(workflow.all_handlers_finished)
        workflow.continue_as_new(self._served)

    @workflow.query
    def served(self) -> int:
        """How many requests this workflow (all its runs) has answered."""
        return self._served

    async def _call(
        self,
        activity: str,
        arg: Any,
        result_type: type[Any],
        timeout: timedelta = API_ACTIVITY_TIMEOUT,
    ) -> Any:
        result = await workflow.execute_activity(
            activity,
            arg,
            task_queue=workflow.info().task_queue,
            start_to_close_timeout=timeout,
            schedule_to_close_timeout=max(timeout, API_CALL_BUDGET),
            retry_policy=API_RETRY,
            result_type=result_type,
        )
        self._served += 1
        return result

    async def _local_call(self, activity: str, arg: Any, result_type: type[Any]) -> Any:
        """A short request, as a local activity (PATCH_LOCAL_CALLS), else as `_call`."""
        if not workflow.patched(PATCH_LOCAL_CALLS):
            return await self._call(activity, arg, result_type)
        result = await workflow.execute_local_activity(
            activity,
            arg,
            start_to_close_timeout=API_ACTIVITY_TIMEOUT,
            schedule_to_close_timeout=API_CALL_BUDGET,
            retry_policy=API_RETRY,
            result_type=result_type,
        )
        self._served += 1
        return result

    # Each update: a validator that refuses malformed input in one line, then one activity.

    @workflow.update
    async def submit(self, req: SubmitRequest) -> JobRecord:
        record: JobRecord = await self._local_call("api_submit", req, JobRecord)
        return record

    @submit.validator
    def _check_submit(self, req: SubmitRequest) -> None:
        _name(req.job_id, "job id")
        if not req.job_id.startswith("job-"):
            _refuse(f"job id {req.job_id!r} does not start with 'job-'")

    @workflow.update
    async def job(self, ref: JobRef) -> JobRecord:
        record: JobRecord = await self._local_call("api_job", ref, JobRecord)
        return record

    @job.validator
    def _check_job(self, ref: JobRef) -> None:
        _name(ref.ref, "job")

    @workflow.update
    async def job_events(self, req: JobEventsRequest) -> JobEvents:
        events: JobEvents = await self._call("api_job_events", req, JobEvents)
        return events

    @job_events.validator
    def _check_job_events(self, req: JobEventsRequest) -> None:
        _name(req.ref, "job")

    @workflow.update
    async def jobs(self, req: JobsRequest) -> list[JobRecord]:
        records: list[JobRecord] = await self._call("api_jobs", req, list[JobRecord])
        return records

    @workflow.update
    async def fleets(self, page: FleetsPage) -> list[FleetRecord]:
        records: list[FleetRecord] = await self._call("api_fleets", page, list[FleetRecord])
        return records

    @workflow.update
    async def apply_fleet(self, spec: FleetSpec) -> FleetRecord:
        record: FleetRecord = await self._call(
            "api_apply_fleet", spec, FleetRecord, FLEET_APPLY_TIMEOUT
        )
        return record

    @workflow.update
    async def delete_fleet(self, ref: FleetRef) -> None:
        await self._call("api_delete_fleet", ref, type(None))

    @delete_fleet.validator
    def _check_delete_fleet(self, ref: FleetRef) -> None:
        _name(ref.name, "fleet name")

    @workflow.update
    async def queues(self, _: Empty) -> list[QueueRecord]:
        records: list[QueueRecord] = await self._call("api_queues", Empty(), list[QueueRecord])
        return records

    @workflow.update
    async def apply_queue(self, spec: QueueSpec) -> QueueApplied:
        applied: QueueApplied = await self._call("api_apply_queue", spec, QueueApplied)
        return applied

    @workflow.update
    async def delete_queue(self, ref: QueueRef) -> None:
        await self._call("api_delete_queue", ref, type(None))

    @delete_queue.validator
    def _check_delete_queue(self, ref: QueueRef) -> None:
        _name(ref.name, "queue name")

    @workflow.update
    async def set_priority(self, req: PriorityRequest) -> JobRecord:
        record: JobRecord = await self._call("api_set_priority", req, JobRecord)
        return record

    @set_priority.validator
    def _check_set_priority(self, req: PriorityRequest) -> None:
        _name(req.ref, "job")

    @workflow.update
    async def offers(self, req: OffersRequest) -> list[OptionOffersRecord]:
        records: list[OptionOffersRecord] = await self._call(
            "api_offers", req, list[OptionOffersRecord]
        )
        return records

    @workflow.update
    async def plan(self, req: PlanRequest) -> list[PlanRecord]:
        records: list[PlanRecord] = await self._call("api_plan", req, list[PlanRecord])
        return records

    @plan.validator
    def _check_plan(self, req: PlanRequest) -> None:
        if not req.specs:
            _refuse("nothing to plan: no job given")

    @workflow.update
    async def host_queue(self, req: HostQueueRequest) -> HostQueueResult:
        result: HostQueueResult = await self._call("api_host_queue", req, HostQueueResult)
        return result

    @host_queue.validator
    def _check_host_queue(self, req: HostQueueRequest) -> None:
        _name(req.job_id, "job id")
        if req.rank < 0:
            _refuse(f"node {req.rank} does not exist: nodes count from 0")
        if req.attempt is not None and req.attempt < 1:
            _refuse(f"attempt {req.attempt} does not exist: attempts count from 1")

    # Secrets: the value travels sealed to the control plane's key, never in clear.

    @workflow.update
    async def secret_key(self, _: Empty) -> SecretKey:
        key: SecretKey = await self._call("api_secret_key", Empty(), SecretKey)
        return key

    @workflow.update
    async def set_secret(self, sealed: SealedSecret) -> None:
        await self._call("api_set_secret", sealed, type(None))

    @set_secret.validator
    def _check_set_secret(self, sealed: SealedSecret) -> None:
        _secret_name(sealed.name)
        if len(sealed.ciphertext) > MAX_SEALED_CHARS:
            _refuse(f"secret {sealed.name}: the value is over {MAX_SEALED_CHARS // 1024} KiB")

    @workflow.update
    async def secret_names(self, _: Empty) -> SecretNames:
        names: SecretNames = await self._call("api_secrets", Empty(), SecretNames)
        return names

    @workflow.update
    async def delete_secret(self, ref: SecretRef) -> SecretDeleted:
        deleted: SecretDeleted = await self._call("api_delete_secret", ref, SecretDeleted)
        return deleted

    @delete_secret.validator
    def _check_delete_secret(self, ref: SecretRef) -> None:
        _secret_name(ref.name)


def _secret_name(name: str) -> None:
    if not SECRET_NAME.match(name):
        _refuse(f"secret name {name!r} must be letters, digits, '_' or '-'")
