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

The payload models (api_models.py, re-exported here) are the API's contract between client and
control worker; the client turns them into its own public models (gpuflow/client/models.py) and
never returns them. Every update has a validator, which refuses a request its client gave up on
(api_expiry.py): a call reported as failed is never carried out later.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

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
    from gpuflow.workflows.api_expiry import refuse_if_given_up
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


# The payloads (re-exported: clients and tests import them from here).
with workflow.unsafe.imports_passed_through():
    from gpuflow.workflows.api_models import (
        JOBS_PER_PAGE as JOBS_PER_PAGE,
    )
    from gpuflow.workflows.api_models import (
        LISTED_MESSAGE_CHARS as LISTED_MESSAGE_CHARS,
    )
    from gpuflow.workflows.api_models import (
        MAX_SEALED_CHARS as MAX_SEALED_CHARS,
    )
    from gpuflow.workflows.api_models import (
        SECRET_NAME as SECRET_NAME,
    )
    from gpuflow.workflows.api_models import (
        Empty as Empty,
    )
    from gpuflow.workflows.api_models import (
        HostQueueRequest as HostQueueRequest,
    )
    from gpuflow.workflows.api_models import (
        HostQueueResult as HostQueueResult,
    )
    from gpuflow.workflows.api_models import (
        JobRecord as JobRecord,
    )
    from gpuflow.workflows.api_models import (
        JobRef as JobRef,
    )
    from gpuflow.workflows.api_models import (
        JobsRequest as JobsRequest,
    )
    from gpuflow.workflows.api_models import (
        SecretDeleted as SecretDeleted,
    )
    from gpuflow.workflows.api_models import (
        SecretKey as SecretKey,
    )
    from gpuflow.workflows.api_models import (
        SecretNames as SecretNames,
    )
    from gpuflow.workflows.api_models import (
        SecretRef as SecretRef,
    )
    from gpuflow.workflows.api_models import (
        SubmitRequest as SubmitRequest,
    )


# ---- the workflow -----------------------------------------------------------------------------


def _refuse(message: str) -> None:
    """A validator's refusal of the input: a SpecError, one line, nothing written to history."""
    raise ApplicationError(message, type="SpecError", non_retryable=True)


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
        refuse_if_given_up()
        _name(req.job_id, "job id")
        if not req.job_id.startswith("job-"):
            _refuse(f"job id {req.job_id!r} does not start with 'job-'")

    @workflow.update
    async def job(self, ref: JobRef) -> JobRecord:
        record: JobRecord = await self._local_call("api_job", ref, JobRecord)
        return record

    @job.validator
    def _check_job(self, ref: JobRef) -> None:
        refuse_if_given_up()
        _name(ref.ref, "job")

    @workflow.update
    async def job_events(self, req: JobEventsRequest) -> JobEvents:
        events: JobEvents = await self._call("api_job_events", req, JobEvents)
        return events

    @job_events.validator
    def _check_job_events(self, req: JobEventsRequest) -> None:
        refuse_if_given_up()
        _name(req.ref, "job")

    @workflow.update
    async def jobs(self, req: JobsRequest) -> list[JobRecord]:
        records: list[JobRecord] = await self._call("api_jobs", req, list[JobRecord])
        return records

    @jobs.validator
    def _check_jobs(self, req: JobsRequest) -> None:
        refuse_if_given_up()

    @workflow.update
    async def fleets(self, page: FleetsPage) -> list[FleetRecord]:
        records: list[FleetRecord] = await self._call("api_fleets", page, list[FleetRecord])
        return records

    @fleets.validator
    def _check_fleets(self, page: FleetsPage) -> None:
        refuse_if_given_up()

    @workflow.update
    async def apply_fleet(self, spec: FleetSpec) -> FleetRecord:
        record: FleetRecord = await self._call(
            "api_apply_fleet", spec, FleetRecord, FLEET_APPLY_TIMEOUT
        )
        return record

    @apply_fleet.validator
    def _check_apply_fleet(self, spec: FleetSpec) -> None:
        refuse_if_given_up()

    @workflow.update
    async def delete_fleet(self, ref: FleetRef) -> None:
        await self._call("api_delete_fleet", ref, type(None))

    @delete_fleet.validator
    def _check_delete_fleet(self, ref: FleetRef) -> None:
        refuse_if_given_up()
        _name(ref.name, "fleet name")

    @workflow.update
    async def queues(self, _: Empty) -> list[QueueRecord]:
        records: list[QueueRecord] = await self._call("api_queues", Empty(), list[QueueRecord])
        return records

    @queues.validator
    def _check_queues(self, _: Empty) -> None:
        refuse_if_given_up()

    @workflow.update
    async def apply_queue(self, spec: QueueSpec) -> QueueApplied:
        applied: QueueApplied = await self._call("api_apply_queue", spec, QueueApplied)
        return applied

    @apply_queue.validator
    def _check_apply_queue(self, spec: QueueSpec) -> None:
        refuse_if_given_up()

    @workflow.update
    async def delete_queue(self, ref: QueueRef) -> None:
        await self._call("api_delete_queue", ref, type(None))

    @delete_queue.validator
    def _check_delete_queue(self, ref: QueueRef) -> None:
        refuse_if_given_up()
        _name(ref.name, "queue name")

    @workflow.update
    async def set_priority(self, req: PriorityRequest) -> JobRecord:
        record: JobRecord = await self._call("api_set_priority", req, JobRecord)
        return record

    @set_priority.validator
    def _check_set_priority(self, req: PriorityRequest) -> None:
        refuse_if_given_up()
        _name(req.ref, "job")

    @workflow.update
    async def offers(self, req: OffersRequest) -> list[OptionOffersRecord]:
        records: list[OptionOffersRecord] = await self._call(
            "api_offers", req, list[OptionOffersRecord]
        )
        return records

    @offers.validator
    def _check_offers(self, req: OffersRequest) -> None:
        refuse_if_given_up()

    @workflow.update
    async def plan(self, req: PlanRequest) -> list[PlanRecord]:
        records: list[PlanRecord] = await self._call("api_plan", req, list[PlanRecord])
        return records

    @plan.validator
    def _check_plan(self, req: PlanRequest) -> None:
        refuse_if_given_up()
        if not req.specs:
            _refuse("nothing to plan: no job given")

    @workflow.update
    async def host_queue(self, req: HostQueueRequest) -> HostQueueResult:
        result: HostQueueResult = await self._call("api_host_queue", req, HostQueueResult)
        return result

    @host_queue.validator
    def _check_host_queue(self, req: HostQueueRequest) -> None:
        refuse_if_given_up()
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

    @secret_key.validator
    def _check_secret_key(self, _: Empty) -> None:
        refuse_if_given_up()

    @workflow.update
    async def set_secret(self, sealed: SealedSecret) -> None:
        await self._call("api_set_secret", sealed, type(None))

    @set_secret.validator
    def _check_set_secret(self, sealed: SealedSecret) -> None:
        refuse_if_given_up()
        _secret_name(sealed.name)
        if len(sealed.ciphertext) > MAX_SEALED_CHARS:
            _refuse(f"secret {sealed.name}: the value is over {MAX_SEALED_CHARS // 1024} KiB")

    @workflow.update
    async def secret_names(self, _: Empty) -> SecretNames:
        names: SecretNames = await self._call("api_secrets", Empty(), SecretNames)
        return names

    @secret_names.validator
    def _check_secret_names(self, _: Empty) -> None:
        refuse_if_given_up()

    @workflow.update
    async def delete_secret(self, ref: SecretRef) -> SecretDeleted:
        deleted: SecretDeleted = await self._call("api_delete_secret", ref, SecretDeleted)
        return deleted

    @delete_secret.validator
    def _check_delete_secret(self, ref: SecretRef) -> None:
        refuse_if_given_up()
        _secret_name(ref.name)


def _secret_name(name: str) -> None:
    if not SECRET_NAME.match(name):
        _refuse(f"secret name {name!r} must be letters, digits, '_' or '-'")
