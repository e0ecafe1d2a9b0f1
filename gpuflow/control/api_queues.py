"""The API's queue activities (gpuflow/workflows/api.py): apply, delete and list queues, a
job's priority changed, and the check that a job submitted (or planned) names queues and fleets
that exist.
`ApiActivities` has them all.

After a queue is applied or deleted the admission pass runs again: a larger quota may admit
waiting jobs, a smaller one may take GPUs back from borrowers."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from temporalio import activity
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from gpuflow.control.admission_wake import wake_admission
from gpuflow.control.api_common import job_record, one_line
from gpuflow.errors import ConflictError, SpecError
from gpuflow.services.fleets import fleet_names_in, host_names_in
from gpuflow.services.jobs import find_job, find_job_in
from gpuflow.services.queue_entries import set_priority_in
from gpuflow.services.queues import (
    QueueUsage,
    apply_queue,
    delete_queue,
    list_queues,
    queues_in,
    unknown_models,
)
from gpuflow.specs.job import JobSpec
from gpuflow.specs.queue import QueueSpec, unknown_queue
from gpuflow.status import JobStatus
from gpuflow.store.db import Store
from gpuflow.store.tables import JobRow
from gpuflow.workflows.api import Empty, JobRecord
from gpuflow.workflows.api_queues import PriorityRequest, QueueApplied, QueueRecord, QueueRef


def queue_record(usage: QueueUsage) -> QueueRecord:
    spec = usage.spec
    return QueueRecord(
        name=spec.name,
        cohort=spec.cohort,
        quota=spec.quota,
        borrowing_limit=spec.borrowing_limit,
        lending_limit=spec.lending_limit,
        built_in=usage.built_in,
        unlimited=spec.unlimited,
        used=usage.used,
        borrowed=usage.borrowed,
        lent=usage.lent,
        over_quota=usage.over_quota,
        waiting=usage.waiting,
        admitted=usage.admitted,
        between_attempts=usage.between_attempts,
    )


def read_queues(store: Store) -> list[QueueRecord]:
    return [queue_record(usage) for usage in list_queues(store)]


async def check_known(
    store: Store,
    *,
    queues: Sequence[str],
    fleets: Sequence[str] = (),
    specs: Sequence[JobSpec] = (),
) -> None:
    """SpecError unless each of `queues` exists (applied, or the built-in default), and so do
    each of `fleets` and every host that a job of `specs` names for its placement (a job
    pinned to a host that no fleet has would fail at once, or wait for nothing); one read of
    the database."""
    named = sorted({host for spec in specs for host in placement_hosts(spec)})

    def read() -> tuple[list[str], list[str], set[str]]:
        with store.read() as session:
            names = [queue.name for queue in queues_in(session)]
            hosts = host_names_in(session, named)
            return names, fleet_names_in(session) if fleets else [], hosts

    known, known_fleets, known_hosts = await asyncio.to_thread(read)
    missing = [host for host in named if host not in known_hosts]
    if missing:
        raise SpecError(
            f"placement: no fleet has a host named {', '.join(missing)} (gpuflow fleet list)"
        )
    for name in queues:
        if name not in known:
            raise SpecError(unknown_queue(name, known))
    unknown = [name for name in fleets if name not in known_fleets]
    if unknown:
        listed = ", ".join(known_fleets) or "none; apply one with gpuflow fleet apply"
        raise SpecError(f"fleets: {', '.join(unknown)} not found (known: {listed})")


def placement_hosts(spec: JobSpec) -> list[str]:
    """The hosts a job's manual placement names: `hosts`, and those of `gpus` (HOST:INDEX)."""
    if spec.placement is None:
        return []
    pinned = [gpu.rpartition(":")[0] for gpu in spec.placement.gpus]
    return [*spec.placement.hosts, *pinned]


class QueueActivities:
    """Queue activities over the control worker's store and Temporal client."""

    store: Store
    temporal: Client

    @activity.defn(name="api_apply_queue")
    @one_line
    async def apply_queue(self, spec: QueueSpec) -> QueueApplied:
        """Write the queue (a retry after the write says `unchanged`), then ask for a pass."""
        done = await asyncio.to_thread(apply_queue, self.store, spec)
        if done != "unchanged":
            await wake_admission(self.temporal)
        records = await asyncio.to_thread(read_queues, self.store)
        queue = next(r for r in records if r.name == spec.name)
        warnings = await asyncio.to_thread(unknown_models, self.store, spec)
        return QueueApplied(
            queue=queue,
            created=done == "created",
            changed=done != "unchanged",
            warnings=warnings,
        )

    @activity.defn(name="api_delete_queue")
    @one_line
    async def delete_queue(self, ref: QueueRef) -> None:
        await asyncio.to_thread(delete_queue, self.store, ref.name)
        await wake_admission(self.temporal)

    @activity.defn(name="api_queues")
    @one_line
    async def queues(self, _: Empty) -> list[QueueRecord]:
        return await asyncio.to_thread(read_queues, self.store)

    @activity.defn(name="api_set_priority")
    @one_line
    async def set_priority(self, req: PriorityRequest) -> JobRecord:
        """A job's new priority within its queue. Its workflow is told first, so that a later
        attempt enters its queue with it; then its row and its entry take it (an attempt that
        entered before the signal arrived is changed there), and a pass runs on it. Setting
        the same priority again changes nothing."""
        row = await asyncio.to_thread(find_job, self.store, req.ref)
        if JobStatus(row.status).is_final:
            raise ConflictError(f"job {row.name} already ended ({row.status}): nothing to reorder")
        try:
            await self.temporal.get_workflow_handle(row.id).signal("set_priority", req.priority)
        except RPCError as exc:
            if exc.status != RPCStatusCode.NOT_FOUND:
                raise
            raise ConflictError(f"job {row.name} is ending: nothing to reorder") from None

        def write() -> JobRow:
            with self.store.placement_transaction() as session:
                set_priority_in(session, job_id=row.id, priority=req.priority)
                return find_job_in(session, row.id)

        changed = await asyncio.to_thread(write)
        await wake_admission(self.temporal)
        return job_record(changed)

    def queue_activities(self) -> list[Any]:
        return [self.apply_queue, self.delete_queue, self.queues, self.set_priority]
