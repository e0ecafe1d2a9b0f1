"""The activities behind the API workflow (gpuflow/workflows/api.py): everything the client asks
that needs the database, the fleets' SSH keys or a host's facts runs here, in the control worker,
which alone holds them.

A job's row is written by its workflow's first place step only (gpuflow/workflows/job.py), so a
job just submitted may have no row yet: `api_job` and `api_jobs` add the open JobWorkflows that
have none, as `pending` / `submitted`, from Temporal (describe and visibility), so `ps` and
`wait` see a job from the moment `submit` returns.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import datetime
from pathlib import Path
from typing import Any

from temporalio import activity
from temporalio.client import Client
from temporalio.common import WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from gpuflow import sealed, secrets
from gpuflow.control.admission import GroupCommit
from gpuflow.control.admission_wake import ask_for_pass, wake_admission
from gpuflow.control.api_common import job_record, one_line, open_unrecorded, unrecorded_job
from gpuflow.control.api_dry_runs import DryRunActivities
from gpuflow.control.api_events import EventActivities
from gpuflow.control.api_fleets import read_fleets
from gpuflow.control.api_queues import QueueActivities, check_known
from gpuflow.control.fleets import host_facts
from gpuflow.errors import NotFoundError
from gpuflow.naming import CONTROL_TASK_QUEUE, fleet_workflow_id
from gpuflow.services.fleets import (
    apply_fleet,
    delete_fleet,
    list_hosts,
)
from gpuflow.services.group_entry import Submitted
from gpuflow.services.jobs import (
    find_job,
    find_job_in,
    hosts_not_ready_in,
    jobs_waiting_for_capacity,
    list_jobs,
)
from gpuflow.services.queues import WaitingPlace, waiting_places
from gpuflow.specs.fleet import FleetSpec
from gpuflow.specs.job import JobSpec
from gpuflow.status import JobStatus
from gpuflow.store.db import Store
from gpuflow.store.tables import JobRow
from gpuflow.workflows.api import (
    JOB_MEMO,
    JOBS_PER_PAGE,
    LISTED_MESSAGE_CHARS,
    Empty,
    HostQueueRequest,
    HostQueueResult,
    JobRecord,
    JobRef,
    JobsRequest,
    SecretDeleted,
    SecretKey,
    SecretNames,
    SecretRef,
    SubmitRequest,
    job_memo,
)
from gpuflow.workflows.api_fleets import HOSTS_PER_PAGE, FleetRecord, FleetRef, FleetsPage
from gpuflow.workflows.fleet import FleetWorkflow
from gpuflow.workflows.handles import watch_fleet
from gpuflow.workflows.models import JobInput
from gpuflow.workflows.ui import initial_search_attributes


class ApiActivities(QueueActivities, DryRunActivities, EventActivities):
    """The API's activities, over the control worker's store and Temporal client."""

    def __init__(
        self, store: Store, temporal: Client, *, home: Path, eager_start: bool = False
    ) -> None:
        self.store = store
        self.temporal = temporal
        self.home = home
        """Where the control plane's key (gpuflow/sealed.py) and secrets file are."""
        self.eager_start = eager_start
        """Start each job's workflow with its first task handed to this worker in the start's
        answer (no matching on the server: 38 -> 32 ms of dev-server CPU a job, one run each).
        Only where this worker is the only one (the embedded stack): with several, jobs would
        follow the worker that answered their submit instead of spreading over all of them."""
        self.entries = GroupCommit(store)
        """Submits enter their queues in groups under load (one placement transaction each)."""

    # ---- jobs -----------------------------------------------------------------------------------

    @activity.defn(name="api_submit")
    @one_line
    async def submit(self, req: SubmitRequest) -> JobRecord:
        """Start the job's workflow once its queue and fleets are known; a retry finds it
        started."""
        spec = req.spec
        await check_known(self.store, queues=[spec.queue], fleets=spec.fleets, specs=[spec])
        path = secrets.secrets_file(self.home)
        await asyncio.to_thread(secrets.check_stored, [spec.env], path)
        gpu = spec.resources.gpu_label
        try:
            handle = await self.temporal.start_workflow(
                "JobWorkflow",
                JobInput(job_id=req.job_id, spec=spec, search_attributes=req.search_attributes),
                id=req.job_id,
                search_attributes=(
                    initial_search_attributes(spec) if req.search_attributes else None
                ),
                memo=job_memo(spec),
                task_queue=CONTROL_TASK_QUEUE,
                id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
                request_eager_start=self.eager_start,
                static_summary=f"job {spec.name}: {spec.nodes} node(s), GPU {gpu}",
                static_details=(
                    f"fleets: {', '.join(spec.fleets) or 'any'}\n\n"
                    f"commands:\n\n" + "\n".join(f"    {c}" for c in spec.commands)
                ),
            )
            run_id = handle.result_run_id or ""
        except WorkflowAlreadyStartedError:
            # A retry of this submit: the first try started the workflow, and may have died
            # before the job entered its queue (entering again changes nothing).
            run_id = (await self.temporal.get_workflow_handle(req.job_id).describe()).run_id
        await self._enter_queue(req.job_id, run_id, spec)
        return await self.job(JobRef(ref=req.job_id))

    async def _enter_queue(self, job_id: str, run_id: str, spec: JobSpec) -> None:
        """The job is in its queue from its submission: a pass that runs before its workflow's
        first step still counts it (else a job submitted later could be admitted first)."""

        verdict = await self.entries.enter(Submitted(job_id, run_id, spec))
        if verdict.placement is None and verdict.refused is None:
            await ask_for_pass(self.temporal)  # raises when lost: the submit is tried again

    @activity.defn(name="api_job")
    @one_line
    async def job(self, ref: JobRef) -> JobRecord:
        def read() -> JobRecord:
            with self.store.read() as session:
                row = find_job_in(session, ref.ref)
                waiting = row.status == JobStatus.PENDING
                place = waiting_places(session, [row.id]).get(row.id) if waiting else None
                not_ready = hosts_not_ready_in(session, [row]).get(row.id)
                return job_record(row, place, not_ready=not_ready)

        try:
            return await asyncio.to_thread(read)
        except NotFoundError:
            pass
        if ref.ref.startswith("job-"):  # an id: its workflow may be open without a row yet
            try:
                desc = await self.temporal.get_workflow_handle(ref.ref).describe()
            except RPCError as exc:
                if exc.status != RPCStatusCode.NOT_FOUND:
                    raise
            else:
                memo = await desc.memo_value(JOB_MEMO, {})
                return unrecorded_job(ref.ref, memo, desc.start_time)
        for record in await self._open_unrecorded(set()):
            if record.name == ref.ref:
                return record
        raise NotFoundError(f"no job named {ref.ref!r} (see `gpuflow ps -a`)")

    @activity.defn(name="api_jobs")
    @one_line
    async def jobs(self, req: JobsRequest) -> list[JobRecord]:
        most = min(req.most, JOBS_PER_PAGE)
        rows = await asyncio.to_thread(
            list_jobs,
            self.store,
            include_finished=req.include_finished,
            limit=most,
            before=req.before,
            queue=req.queue,
        )
        pending = [row.id for row in rows if row.status == JobStatus.PENDING]
        places, unready = await asyncio.to_thread(self._places, pending, rows)
        chars = LISTED_MESSAGE_CHARS
        records = [
            job_record(row, places.get(row.id), message_chars=chars, not_ready=unready.get(row.id))
            for row in rows
        ]
        # An open workflow without a row goes on the page whose span holds its start: the
        # client's next page starts below this page's oldest job, so one older than a full
        # page's oldest row waits for the page that reaches it (else the rows between would be
        # skipped), and the last page (not full) takes every older one.
        oldest = (records[-1].submitted_at, records[-1].id) if len(rows) >= most else None
        span = (
            oldest[0] if oldest is not None else None,
            req.before[0] if req.before is not None else None,
        )
        for record in await self._open_unrecorded({r.id for r in records}, span):
            key = (record.submitted_at, record.id)
            in_span = (req.before is None or key < req.before) and (oldest is None or key > oldest)
            if in_span and req.queue in (None, record.queue):
                records.append(record)
        return sorted(records, key=lambda r: (r.submitted_at, r.id), reverse=True)

    def _places(
        self, job_ids: list[str], rows: list[JobRow]
    ) -> tuple[dict[str, WaitingPlace], dict[str, dict[str, str]]]:
        """Where the waiting jobs `job_ids` stand in their queues; the placed jobs' hosts that
        are not ready."""
        with self.store.read() as session:
            return waiting_places(session, job_ids), hosts_not_ready_in(session, rows)

    async def _open_unrecorded(
        self, recorded: set[str], span: tuple[datetime | None, datetime | None] = (None, None)
    ) -> list[JobRecord]:
        return await open_unrecorded(self.temporal, self.store, recorded, span)

    @activity.defn(name="api_host_queue")
    @one_line
    async def host_queue(self, req: HostQueueRequest) -> HostQueueResult:
        """The task queue of the host that ran a node of an ended job or of an earlier attempt
        (its logs are there)."""
        row = await asyncio.to_thread(find_job, self.store, req.job_id)
        ran_on = list(row.hosts)
        if req.attempt is not None and req.attempt != row.attempt:
            ran_on = (row.earlier_hosts or {}).get(str(req.attempt), [])
        hosts = {h.name: h for h in await asyncio.to_thread(list_hosts, self.store)}
        if req.rank < len(ran_on) and ran_on[req.rank] in hosts:
            return HostQueueResult(task_queue=hosts[ran_on[req.rank]].task_queue)
        return HostQueueResult()

    # ---- fleets ---------------------------------------------------------------------------------

    @activity.defn(name="api_apply_fleet")
    @one_line
    async def apply_fleet(self, spec: FleetSpec) -> FleetRecord:
        """Gather the hosts' facts here (the SSH keys are here), write the fleet, start its health
        checks and wake the jobs that wait for capacity: the admission loop's (queued jobs
        waited up to its rare pass, a minute, with reasons that no longer held), and those of
        histories from before queues."""
        facts = await host_facts(spec)
        warnings = await asyncio.to_thread(apply_fleet, self.store, spec, facts)
        await watch_fleet(self.temporal, spec.name)
        await wake_admission(self.temporal)
        waiting = await asyncio.to_thread(jobs_waiting_for_capacity, self.store)
        await asyncio.gather(
            *(
                self.temporal.get_workflow_handle(job_id).signal("capacity_changed")
                for job_id in waiting
            ),
            return_exceptions=True,  # one that ended meanwhile needs no signal
        )
        page = FleetsPage(fleet=spec.name, most=HOSTS_PER_PAGE)  # the client reads the rest
        record = next(f for f in await self.fleets(page) if f.name == spec.name)
        return record.model_copy(update={"warnings": warnings})

    @activity.defn(name="api_delete_fleet")
    @one_line
    async def delete_fleet(self, ref: FleetRef) -> None:
        await asyncio.to_thread(delete_fleet, self.store, ref.name)
        await wake_admission(self.temporal)  # waiting jobs' reasons named its hosts
        with contextlib.suppress(RPCError):  # its health checks end (none ran: nothing to end)
            await self.temporal.get_workflow_handle_for(
                FleetWorkflow.run, fleet_workflow_id(ref.name)
            ).signal(FleetWorkflow.delete)

    @activity.defn(name="api_fleets")
    @one_line
    async def fleets(self, page: FleetsPage) -> list[FleetRecord]:
        return await asyncio.to_thread(read_fleets, self.store, page)

    # ---- secrets (sealed by the client to this control plane's key) ----------------------------

    @activity.defn(name="api_secret_key")
    @one_line
    async def secret_key(self, _: Empty) -> SecretKey:
        private = await asyncio.to_thread(sealed.control_key, self.home)
        return SecretKey(public_key=sealed.public_key(private))

    @activity.defn(name="api_set_secret")
    @one_line
    async def set_secret(self, secret: sealed.SealedSecret) -> None:
        def write() -> None:
            value = sealed.open_sealed(secret, sealed.control_key(self.home))
            secrets.set_secret(secret.name, value, secrets.secrets_file(self.home))

        await asyncio.to_thread(write)

    @activity.defn(name="api_secrets")
    @one_line
    async def secret_names(self, _: Empty) -> SecretNames:
        stored = await asyncio.to_thread(secrets.load, secrets.secrets_file(self.home))
        return SecretNames(names=sorted(stored))

    @activity.defn(name="api_delete_secret")
    @one_line
    async def delete_secret(self, ref: SecretRef) -> SecretDeleted:
        path = secrets.secrets_file(self.home)
        return SecretDeleted(deleted=await asyncio.to_thread(secrets.delete_secret, ref.name, path))

    def activities(self) -> list[Any]:
        return [
            self.submit,
            self.job,
            self.jobs,
            self.host_queue,
            self.apply_fleet,
            self.delete_fleet,
            self.fleets,
            *self.queue_activities(),
            *self.dry_run_activities(),
            *self.event_activities(),
            self.secret_key,
            self.set_secret,
            self.secret_names,
            self.delete_secret,
        ]
