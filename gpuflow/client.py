"""The Python client. The CLI is built on it.

client = await Client.connect()
job = await client.submit(JobSpec(name="train", commands=["python train.py"]))
result = await client.wait(job.id)
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from typing import Any

from pydantic import BaseModel, Field
from temporalio.client import Client as TemporalClient
from temporalio.client import (
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleAlreadyRunningError,
    ScheduleIntervalSpec,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleSpec,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowQueryFailedError,
)
from temporalio.common import (
    TypedSearchAttributes,
    WorkflowIDConflictPolicy,
    WorkflowIDReusePolicy,
)
from temporalio.service import RPCError

from gpuflow.config import TemporalConfig, connect_temporal
from gpuflow.errors import GpuflowError, NotFoundError, SpecError, UnschedulableError
from gpuflow.naming import CONTROL_TASK_QUEUE, job_workflow_id
from gpuflow.scheduler import Offers, explain
from gpuflow.specs.fleet import FleetSpec
from gpuflow.specs.job import JobSpec
from gpuflow.status import JobStatus, TerminationReason
from gpuflow.store.capacity import read_snapshot
from gpuflow.store.db import Store
from gpuflow.store.fleets import apply_fleet, list_fleets, list_hosts
from gpuflow.store.jobs import find_job, list_jobs, record_job
from gpuflow.store.tables import JobRow
from gpuflow.utilization import UtilizationState
from gpuflow.workflows.job import initial_search_attributes
from gpuflow.workflows.logs import ReadLogsInput
from gpuflow.workflows.models import (
    FleetInput,
    JobInput,
    JobProgress,
    JobResult,
    LogChunk,
    LogsInput,
)


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
    submitted_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None

    @classmethod
    def from_row(cls, row: JobRow) -> JobInfo:
        return cls(
            id=row.id,
            name=row.name,
            status=JobStatus(row.status),
            reason=row.termination_reason,
            message=row.message,
            fleet=row.fleet,
            hosts=list(row.hosts),
            gpus=row.gpus,
            attempt=row.attempt,
            submitted_at=row.submitted_at,
            started_at=row.started_at,
            finished_at=row.finished_at,
        )


class OptionOffers(BaseModel):
    """The dry run of one resource option of a job."""

    option: int
    """1 for `resources`, 2 for the first of `alternatives`, ..."""
    gpu: str
    offers: Offers


def taken_option(per_option: list[OptionOffers]) -> OptionOffers | None:
    """The resource option a job submitted now would run with: the first one that places
    (hosts that fit one by one are not enough for a gang); None when none does."""
    return next((o for o in per_option if o.offers.placement is not None), None)


class FleetInfo(BaseModel):
    name: str
    kind: str
    scorer: str
    hosts: list[dict[str, Any]]


async def watch_fleet(temporal: TemporalClient, fleet: str) -> None:
    """Start the fleet's health checks (FleetWorkflow), or make a running one check now."""
    await temporal.start_workflow(
        "FleetWorkflow",
        FleetInput(fleet=fleet),
        id=f"fleet-{fleet}",
        task_queue=CONTROL_TASK_QUEUE,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        static_summary=f"health checks of fleet {fleet}",
    )
    await temporal.get_workflow_handle(f"fleet-{fleet}").signal("refresh")


def _search_attributes_enabled() -> bool:
    return os.environ.get("GPUFLOW_SEARCH_ATTRIBUTES", "1") not in ("0", "false", "no")


JobInfoList = list[JobInfo]
FleetInfoList = list[FleetInfo]
ScheduleList = list[dict[str, Any]]
OptionOffersList = list[OptionOffers]


class Client:
    """Async, typed access to gpuflow. Keyword-only arguments throughout."""

    def __init__(self, *, temporal: TemporalClient, store: Store) -> None:
        self.temporal = temporal
        self.store = store

    @classmethod
    async def connect(
        cls, *, config: TemporalConfig | None = None, database_url: str | None = None
    ) -> Client:
        store = await asyncio.to_thread(lambda: Store(database_url).init())
        temporal = await connect_temporal(config)
        return cls(temporal=temporal, store=store)

    # ---- jobs -------------------------------------------------------------------------------

    async def submit(self, spec: JobSpec) -> JobInfo:
        """Start the job's workflow. The spec is already valid; unknown fleets are refused here,
        before anything is created."""
        known = {fleet.name for fleet in await asyncio.to_thread(list_fleets, self.store)}
        unknown = [name for name in spec.fleets if name not in known]
        if unknown:
            raise SpecError(
                f"fleets: {', '.join(unknown)} not found "
                f"(known: {', '.join(sorted(known)) or 'none; apply one with gpuflow fleet apply'})"
            )
        job_id = job_workflow_id(spec.name, secrets.token_hex(3))
        gpu = spec.resources.gpu_label
        await self.temporal.start_workflow(
            "JobWorkflow",
            JobInput(job_id=job_id, spec=spec, search_attributes=_search_attributes_enabled()),
            id=job_id,
            search_attributes=(
                initial_search_attributes(spec) if _search_attributes_enabled() else None
            ),
            task_queue=CONTROL_TASK_QUEUE,
            id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
            static_summary=f"job {spec.name}: {spec.nodes} node(s), GPU {gpu}",
            static_details=(
                f"fleets: {', '.join(spec.fleets) or 'any'}\n\n"
                f"commands:\n\n" + "\n".join(f"    {c}" for c in spec.commands)
            ),
        )
        row = await asyncio.to_thread(
            record_job, self.store, job_id=job_id, name=spec.name, spec=spec.model_dump(mode="json")
        )
        return JobInfo.from_row(row)

    async def get(self, job: str) -> JobInfo:
        row = await asyncio.to_thread(find_job, self.store, job)
        return JobInfo.from_row(row)

    async def list(self, *, include_finished: bool = False) -> JobInfoList:
        rows = await asyncio.to_thread(list_jobs, self.store, include_finished=include_finished)
        return [JobInfo.from_row(row) for row in rows]

    async def progress(self, job: str) -> JobProgress:
        info = await self.get(job)
        handle = self.temporal.get_workflow_handle(info.id)
        try:
            progress: JobProgress = await handle.query("progress", result_type=JobProgress)
            return progress
        except RPCError as exc:
            raise GpuflowError(f"job {info.name}: cannot read its progress ({exc})") from None

    async def stop(self, job: str, *, wait: bool = True, timeout_s: float = 120) -> JobInfo:
        """Ask the job to stop; with `wait`, return once it has ended (processes stopped and
        GPUs released)."""
        info = await self.get(job)
        if info.status.is_final:
            return info
        handle = self.temporal.get_workflow_handle(info.id)
        try:
            await handle.signal("stop")
        except RPCError as exc:
            raise GpuflowError(f"job {info.name}: cannot stop it ({exc})") from None
        if wait:
            await self.wait(info.id, timeout_s=timeout_s, raise_on_failure=False)
        return await self.get(info.id)

    async def wait(
        self, job: str, *, timeout_s: float | None = None, raise_on_failure: bool = True
    ) -> JobResult:
        """The job's result once it ends. With `raise_on_failure`, a job that found no
        capacity raises UnschedulableError carrying the per-host reasons."""
        info = await self.get(job)
        handle = self.temporal.get_workflow_handle(info.id, result_type=JobResult)
        try:
            result: JobResult = await asyncio.wait_for(handle.result(), timeout_s)
        except WorkflowFailureError as exc:
            raise GpuflowError(f"job {info.name} failed inside gpuflow: {exc.cause}") from None
        if raise_on_failure and result.reason == TerminationReason.NO_CAPACITY:
            reasons = result.message.removeprefix("no capacity: ").split("; ")
            raise UnschedulableError(f"job {info.name}: {result.message}", reasons)
        return result

    async def describe(self, job: str) -> str:
        """Whether the job's workflow is still open, as Temporal sees it."""
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

    async def logs(
        self, job: str, *, rank: int = 0, follow: bool = False, poll_s: float = 1.0
    ) -> AsyncIterator[str]:
        """The job's output on one node, from the start; with `follow`, until the job ends."""
        info = await self.get(job)
        offset = 0
        while True:
            info = await self.get(info.id)
            try:
                progress = await self.progress(info.id)
                placement = progress.placement
            except GpuflowError:
                placement = None
            if placement is None and not info.status.is_final:
                if not follow:
                    return
                await asyncio.sleep(poll_s)
                continue
            queue = await self._log_queue(info, placement, rank)
            if queue is None:
                return
            try:
                chunk = await self.temporal.execute_workflow(
                    "ReadLogsWorkflow",
                    ReadLogsInput(
                        task_queue=queue, logs=LogsInput(job_id=info.id, rank=rank, offset=offset)
                    ),
                    id=f"logs-{info.id}-{secrets.token_hex(4)}",
                    task_queue=CONTROL_TASK_QUEUE,
                    result_type=LogChunk,
                )
            except (WorkflowFailureError, RPCError) as exc:
                cause = getattr(exc, "cause", None) or exc
                raise GpuflowError(
                    f"job {info.name}: cannot read the log of node {rank} from its host "
                    f"({getattr(cause, 'cause', None) or cause}); is the host's agent running?"
                ) from None
            if chunk.data:
                yield chunk.data
            offset = chunk.next_offset
            if chunk.eof:
                if not follow or info.status.is_final:
                    return
                await asyncio.sleep(poll_s)

    async def _log_queue(self, info: JobInfo, placement: Any, rank: int) -> str | None:
        if placement is not None:
            for node in placement.nodes:
                if node.rank == rank:
                    return str(node.task_queue)
            raise NotFoundError(f"job {info.name} has no node {rank}")
        hosts = {h.name: h for h in await asyncio.to_thread(list_hosts, self.store)}
        if rank < len(info.hosts) and info.hosts[rank] in hosts:
            return hosts[info.hosts[rank]].task_queue
        return None

    # ---- schedules ----------------------------------------------------------------------------

    async def schedule(
        self,
        spec: JobSpec,
        *,
        cron: str | None = None,
        every_s: int | None = None,
        schedule_id: str | None = None,
    ) -> str:
        """A Temporal Schedule that submits the job on a cron or every `every_s` seconds.
        Each run is a job of its own, `job-<name>-<time>`."""
        if (cron is None) == (every_s is None):
            raise SpecError("give exactly one of cron or every")
        if every_s is not None and every_s < 60:
            raise SpecError(f"every is {every_s}s; a schedule runs at most once a minute")
        schedule_id = schedule_id or f"schedule-{spec.name}"
        action = ScheduleActionStartWorkflow(
            "JobWorkflow",
            JobInput(spec=spec, search_attributes=_search_attributes_enabled()),
            id=f"job-{spec.name}",
            typed_search_attributes=(
                initial_search_attributes(spec)
                if _search_attributes_enabled()
                else TypedSearchAttributes.empty
            ),
            task_queue=CONTROL_TASK_QUEUE,
            static_summary=f"job {spec.name} (from {schedule_id})",
        )
        calendar = (
            ScheduleSpec(cron_expressions=[cron])
            if cron
            else ScheduleSpec(
                intervals=[ScheduleIntervalSpec(every=timedelta(seconds=every_s or 0))]
            )
        )
        try:
            await self.temporal.create_schedule(
                schedule_id,
                Schedule(
                    action=action,
                    spec=calendar,
                    policy=SchedulePolicy(overlap=ScheduleOverlapPolicy.SKIP),
                ),
            )
        except ScheduleAlreadyRunningError:
            raise SpecError(f"schedule {schedule_id} exists; delete it first") from None
        except RPCError as exc:
            raise SpecError(f"schedule {schedule_id}: {exc.message}") from None
        return schedule_id

    async def schedules(self) -> ScheduleList:
        out = []
        async for item in await self.temporal.list_schedules():
            info = item.info
            out.append(
                {
                    "id": item.id,
                    "next": [t.isoformat() for t in (info.next_action_times if info else [])][:3],
                    "recent": [
                        a.action.workflow_id
                        for a in (info.recent_actions if info else [])
                        if hasattr(a.action, "workflow_id")
                    ][-3:],
                }
            )
        return out

    async def delete_schedule(self, schedule_id: str) -> None:
        try:
            await self.temporal.get_schedule_handle(schedule_id).delete()
        except RPCError as exc:
            raise NotFoundError(f"schedule {schedule_id}: {exc.message}") from None

    # ---- fleets and offers ------------------------------------------------------------------

    async def apply_fleet(self, spec: FleetSpec) -> FleetInfo:
        if spec.kind == "ssh":
            from gpuflow.worker.ssh import collect_ssh_facts

            facts = await collect_ssh_facts(spec)
        elif spec.kind == "local":
            from gpuflow.store.fleets import local_host_name
            from gpuflow.worker.facts import collect_host_facts

            facts = {local_host_name(): await asyncio.to_thread(collect_host_facts)}
        else:
            facts = {}
        await asyncio.to_thread(apply_fleet, self.store, spec, facts)
        await watch_fleet(self.temporal, spec.name)
        await self._signal_pending_jobs()
        return next(f for f in await self.fleets() if f.name == spec.name)

    async def _signal_pending_jobs(self) -> None:
        from gpuflow.store.jobs import jobs_waiting_for_capacity

        waiting = await asyncio.to_thread(jobs_waiting_for_capacity, self.store)
        await asyncio.gather(
            *(
                self.temporal.get_workflow_handle(job_id).signal("capacity_changed")
                for job_id in waiting
            ),
            return_exceptions=True,  # one that ended meanwhile needs no signal
        )

    async def delete_fleet(self, name: str) -> None:
        """Delete a fleet that runs no job; its health checks end."""
        from gpuflow.store.fleets import delete_fleet

        await asyncio.to_thread(delete_fleet, self.store, name)
        with contextlib.suppress(RPCError):
            await self.temporal.get_workflow_handle(f"fleet-{name}").signal("refresh")

    async def fleets(self) -> FleetInfoList:
        def read() -> FleetInfoList:
            from gpuflow.scheduler import blocks_busy

            with self.store.read() as session:
                snapshot = read_snapshot(session)
            out = []
            for fleet in snapshot.fleets:
                hosts = []
                for host in fleet.hosts:
                    busy, total = blocks_busy(host)
                    gpu_used = sum(g.used for g in host.gpus)
                    hosts.append(
                        {
                            "name": host.name,
                            "state": host.state.value,
                            "state_detail": host.state_detail,
                            "os": host.os,
                            "arch": host.arch,
                            "backend": host.backend,
                            "gpus": [
                                {
                                    "index": g.index,
                                    "name": g.name,
                                    "memory_mib": g.memory_mib,
                                    "used": g.used,
                                }
                                for g in host.gpus
                            ],
                            "gpu_used": gpu_used,
                            "cpus": host.cpus,
                            "cpus_used": host.cpus_used,
                            "memory_mib": host.memory_mib,
                            "memory_used_mib": host.memory_used_mib,
                            "blocks": total,
                            "blocks_busy": busy,
                            "simulated": host.simulated,
                        }
                    )
                out.append(
                    FleetInfo(name=fleet.name, kind=fleet.kind, scorer=fleet.scorer, hosts=hosts)
                )
            return out

        return await asyncio.to_thread(read)

    async def offers(self, spec: JobSpec) -> Offers:
        """The dry run: what fits (with scores) and why every other host does not, for the
        resource option the job would take now (the first that fits anywhere; the first
        option when none does). `offers_per_option` has them all."""
        per_option = await self.offers_per_option(spec)
        return (taken_option(per_option) or per_option[0]).offers

    async def offers_per_option(self, spec: JobSpec) -> OptionOffersList:
        """The dry run of each resource option (`resources`, then `alternatives`), in the
        order a job tries them, all on one snapshot."""

        def read() -> OptionOffersList:
            with self.store.read() as session:
                snapshot = read_snapshot(session)
            return [
                OptionOffers(
                    option=k + 1,
                    gpu=option.resources.gpu_label,
                    offers=explain(option, snapshot),
                )
                for k, option in enumerate(spec.resource_options())
            ]

        return await asyncio.to_thread(read)

    async def close(self) -> None:
        await asyncio.to_thread(self.store.dispose)
