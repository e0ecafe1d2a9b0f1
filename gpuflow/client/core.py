"""The Python client. The CLI is built on it. It needs nothing but Temporal: every request that
needs the database or the fleets' SSH keys goes to the control plane's API workflow
(gpuflow/workflows/api.py), which alone holds them.

client = await Client.connect()
job = await client.submit(JobSpec(name="train", commands=["python train.py"]))
result = await client.wait(job.id)
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from temporalio.client import Client as TemporalClient
from temporalio.client import (
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowQueryFailedError,
)
from temporalio.service import RPCError, RPCStatusCode

from gpuflow.client.api import Api, TemporalApi, named
from gpuflow.client.control_plane import ControlPlaneCalls
from gpuflow.client.logs import LogCalls, workflow_running
from gpuflow.client.models import (
    JobDescription,
    JobEvents,
    JobInfo,
    JobOutcome,
    Progress,
    StopOutcome,
    StopStep,
)
from gpuflow.client.queues import QueueCalls
from gpuflow.client.schedules import ScheduleCalls, search_attributes_enabled
from gpuflow.config import TemporalConfig, connect_temporal
from gpuflow.errors import (
    GpuflowError,
    NotFoundError,
    SpecError,
    UnschedulableError,
    WaitTimeout,
)
from gpuflow.naming import fleet_workflow_id, job_workflow_id
from gpuflow.specs.job import DEFAULT_QUEUE, JobSpec, check_name
from gpuflow.specs.load import model_of
from gpuflow.specs.queue import unknown_queue
from gpuflow.status import TerminationReason, capacity_reasons
from gpuflow.utilization import UtilizationState
from gpuflow.workflows.api import (
    JOB_MEMO,
    JOBS_PER_PAGE,
    JobRecord,
    JobRef,
    JobsRequest,
    SubmitRequest,
)
from gpuflow.workflows.fleet import FleetWorkflow
from gpuflow.workflows.models import JobProgress, JobResult
from gpuflow.workflows.outcome import job_result


async def _closes(handle: Any, within_s: float) -> bool:
    """Whether the workflow closes (in any way) within `within_s` seconds."""
    try:
        await asyncio.wait_for(handle.result(), within_s)
    except TimeoutError:
        return False
    except WorkflowFailureError:
        return True  # cancelled, terminated or failed: closed all the same
    except RPCError as exc:
        return exc.status == RPCStatusCode.NOT_FOUND
    return True


class Client(ControlPlaneCalls, QueueCalls, ScheduleCalls, LogCalls):
    """Async, typed access to gpuflow. Keyword-only arguments throughout. It holds a Temporal
    connection and nothing else: no database, no SSH key (see gpuflow/workflows/api.py)."""

    def __init__(self, *, temporal: TemporalClient, api: Api | None = None) -> None:
        self.temporal = temporal
        self._api = api or TemporalApi(temporal)

    @classmethod
    async def connect(cls, *, config: TemporalConfig | None = None) -> Client:
        """Connect to `config`'s Temporal; by default `TemporalConfig.from_env()`'s: the
        variables' cluster or port, else the stack that GPUFLOW_HOME's `gpuflow up` runs."""
        return cls(temporal=await connect_temporal(config))

    # ---- jobs -------------------------------------------------------------------------------

    async def submit(self, spec: JobSpec | Mapping[str, Any]) -> JobInfo:
        """Start the job's workflow, from a JobSpec or the fields of one (a mapping, as a job
        file holds them: SpecError when they are not valid). The control plane refuses unknown
        fleets and queues before anything is created."""
        spec = model_of(JobSpec, spec, "job")
        request = SubmitRequest(
            job_id=job_workflow_id(spec.name, secrets.token_hex(3)),
            spec=spec,
            search_attributes=search_attributes_enabled(),
        )
        return JobInfo.from_record(await self._api.call("submit", request, JobRecord))

    async def get(self, job: str) -> JobInfo:
        """A job by id, or the newest job of that name."""
        ref = JobRef(ref=named(job, "job"))
        return JobInfo.from_record(await self._api.call("job", ref, JobRecord))

    async def jobs(
        self, *, include_finished: bool = False, limit: int | None = None, queue: str | None = None
    ) -> list[JobInfo]:
        """The jobs not ended yet (with `include_finished`, the ended ones too), newest first:
        the newest `limit`, or all of them (None), read JOBS_PER_PAGE at a time; only those
        of `queue` when given (the queue each job names; NotFoundError when no job names it
        and no such queue exists)."""
        if limit is not None and limit < 1:
            raise SpecError(f"limit must be at least 1, not {limit}")
        if queue is not None:
            try:
                check_name(queue, "queue name")
            except ValueError as exc:
                raise SpecError(str(exc)) from None
        found: list[JobRecord] = []
        before: tuple[datetime, str] | None = None
        while limit is None or len(found) < limit:
            most = JOBS_PER_PAGE if limit is None else min(JOBS_PER_PAGE, limit - len(found))
            request = JobsRequest(
                include_finished=include_finished, most=most, before=before, queue=queue
            )
            page = await self._api.call("jobs", request, list[JobRecord])
            if before is not None and any((r.submitted_at, r.id) >= before for r in page):
                break  # a control worker older than pages answers the newest jobs every time
            found += [r for r in page if queue is None or (r.queue or DEFAULT_QUEUE) == queue]
            if len(page) < most:
                break
            before = (page[-1].submitted_at, page[-1].id)
        if queue is not None and not found:
            known = [info.name for info in await self.list_queues()]
            if queue not in known:  # a queue deleted since keeps its ended jobs listable
                raise NotFoundError(unknown_queue(queue, known))
        return [JobInfo.from_record(record) for record in found[:limit]]

    async def progress(self, job: str) -> Progress:
        info = await self.get(job)
        handle = self.temporal.get_workflow_handle(info.id)
        try:
            progress = await handle.query("progress", result_type=JobProgress)
            return Progress.from_progress(progress)
        except RPCError as exc:
            raise GpuflowError(f"job {info.name}: cannot read its progress ({exc})") from None

    async def stop(
        self, job: str, *, wait: bool = True, timeout_s: float = 120, grace_s: float = 15
    ) -> StopOutcome:
        """Stop the job: its processes stopped, its GPUs released, status `stopped`.

        With `wait`, the job is made to end even when its workflow does not answer: a workflow
        still open `grace_s` after the stop signal is cancelled, one still open `grace_s` later
        is terminated, and then its fleet's reconciliation (asked to run now) stops its
        processes and releases its GPUs. Returns once the job's row has ended (at most
        `timeout_s`); `ended_by` says which step ended it."""
        info = await self.get(job)
        handle = self.temporal.get_workflow_handle(info.id)
        if info.status.is_final and not await workflow_running(handle):
            return StopOutcome(**info.model_dump(), ended_by=StopStep.ALREADY_ENDED)
        deadline = asyncio.get_running_loop().time() + timeout_s
        step = StopStep.STOP_SIGNAL
        try:
            await handle.signal("stop")
        except RPCError as exc:
            if exc.status != RPCStatusCode.NOT_FOUND:
                raise GpuflowError(f"job {info.name}: cannot stop it ({exc})") from None
            step = StopStep.WORKFLOW_CLOSED
        if not wait:
            return StopOutcome(**info.model_dump(), ended_by=StopStep.REQUESTED)
        if step == StopStep.STOP_SIGNAL and not await _closes(handle, grace_s):
            step = StopStep.CANCELLATION
            with contextlib.suppress(RPCError):  # closed meanwhile: the next wait says so
                await handle.cancel()
            if not await _closes(handle, grace_s):
                step = StopStep.TERMINATION
                with contextlib.suppress(RPCError):
                    await handle.terminate(
                        reason="gpuflow stop: the workflow did not end after a stop signal "
                        "and a cancellation"
                    )
        if step in (StopStep.TERMINATION, StopStep.WORKFLOW_CLOSED):
            # Nothing of the workflow runs to release what the job holds: its fleet's
            # reconciliation does, now rather than at its next health check.
            if info.fleet is None:
                return StopOutcome(**(await self.get(info.id)).model_dump(), ended_by=step)
            with contextlib.suppress(RPCError):
                await self.temporal.get_workflow_handle_for(
                    FleetWorkflow.run, fleet_workflow_id(info.fleet)
                ).signal(FleetWorkflow.refresh)
        while True:
            info = await self.get(info.id)
            if info.status.is_final:
                return StopOutcome(**info.model_dump(), ended_by=step)
            if asyncio.get_running_loop().time() > deadline:
                raise GpuflowError(
                    f"job {info.name}: its workflow was closed ({step.value}), but its GPUs were "
                    f"not released within {timeout_s:.0f}s; is a control worker running?"
                )
            await asyncio.sleep(0.25)

    async def wait(
        self, job: str, *, timeout_s: float | None = None, raise_on_failure: bool = True
    ) -> JobOutcome:
        """How the job ended, once it has. With `raise_on_failure`, a job that found no
        capacity raises UnschedulableError carrying the per-host reasons. WaitTimeout (a
        TimeoutError too) when it has not ended within `timeout_s`."""
        try:
            job_id, result = await asyncio.wait_for(self._ended(job), timeout_s)
        except TimeoutError:
            raise WaitTimeout(
                f"job {job} did not end within {timeout_s:g}s; it was not stopped"
            ) from None
        except _Broke as broke:  # it ended without a JobResult: gpuflow broke
            name = await self._name_of(broke.job_id)
            raise GpuflowError(f"job {name} failed inside gpuflow: {broke.cause}") from None
        if raise_on_failure and result.reason == TerminationReason.NO_CAPACITY:
            name = result.name or await self._name_of(job_id)
            raise UnschedulableError(
                f"job {name}: {result.message}", capacity_reasons(result.message)
            )
        return JobOutcome.from_result(result)

    async def _ended(self, job: str) -> tuple[str, JobResult]:
        """The job's workflow id and result, once it ends. An id is awaited at once, which asks
        Temporal nothing more; a name, or an id Temporal does not know, asks the control plane
        first (`get`)."""
        if job.startswith("job-"):
            try:
                return job, await self._result_of(job)
            except RPCError as exc:
                if exc.status != RPCStatusCode.NOT_FOUND:
                    raise
        info = await self.get(job)
        return info.id, await self._result_of(info.id)

    async def _result_of(self, job_id: str) -> JobResult:
        handle = self.temporal.get_workflow_handle(job_id, result_type=JobResult)
        try:
            return await job_result(handle)
        except WorkflowFailureError as exc:
            raise _Broke(job_id, exc.cause) from None

    async def _name_of(self, job_id: str) -> str:
        """A job's name from its workflow's memo (the id when it cannot be read)."""
        with contextlib.suppress(RPCError):
            desc = await self.temporal.get_workflow_handle(job_id).describe()
            name = (await desc.memo_value(JOB_MEMO, {})).get("name")
            if isinstance(name, str):
                return name
        return job_id

    async def describe(self, job: str, *, events: int = 20) -> JobDescription:
        """The job in full, as `gpuflow describe` shows it: its record (where it runs, or why
        and where it waits) and its newest `events` recorded statuses."""
        info = await self.get(job)
        try:
            history = await self.events(info.id, most=events)
        except NotFoundError:  # its workflow started; its first record is still to come
            history = JobEvents(job_id=info.id, events=[], total=0)
        return JobDescription(job=info, events=history.events, events_total=history.total)

    async def workflow_status(self, job: str) -> str:
        """The job's workflow as Temporal sees it: `running`, `completed`, `failed`,
        `terminated`, ... (what the Temporal UI shows; the job's own status is `get(job)`)."""
        info = await self.get(job)
        desc = await self.temporal.get_workflow_handle(info.id).describe()
        status = desc.status or WorkflowExecutionStatus.RUNNING
        return status.name.lower()

    async def metrics(self, job: str) -> UtilizationState:
        info = await self.get(job)
        handle = self.temporal.get_workflow_handle(info.id)
        try:
            state: UtilizationState = await handle.query(
                "utilization_window", result_type=UtilizationState
            )
        except (RPCError, WorkflowQueryFailedError) as exc:
            raise GpuflowError(f"job {info.name}: cannot read its GPU metrics ({exc})") from None
        return state

    async def close(self) -> None:
        """Nothing to release: the Temporal connection closes with its last reference."""


class _Broke(Exception):
    """A job's workflow ended without a JobResult (cancelled, terminated, failed in gpuflow)."""

    def __init__(self, job_id: str, cause: BaseException | None) -> None:
        super().__init__(job_id)
        self.job_id = job_id
        self.cause = cause
