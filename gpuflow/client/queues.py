"""The client's queue calls: apply, delete and list queues, and change a job's priority. Each is
one update of the control plane's API workflow (gpuflow/workflows/api.py); `Client` has them
all."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from temporalio.client import Client as TemporalClient
from temporalio.service import RPCError

from gpuflow.client.api import Api, named
from gpuflow.client.models import AppliedQueue, JobInfo, QueueInfo
from gpuflow.client.schedules import refuse_if_scheduled
from gpuflow.errors import GpuflowError, SpecError
from gpuflow.naming import CONTROL_TASK_QUEUE
from gpuflow.specs.job import check_name, check_priority
from gpuflow.specs.load import load_queue, model_of
from gpuflow.specs.queue import QueueSpec, queue_name
from gpuflow.workflows import handles
from gpuflow.workflows.api import Empty, JobRecord
from gpuflow.workflows.api_queues import PriorityRequest, QueueApplied, QueueRecord, QueueRef


class QueueCalls:
    _api: Api
    temporal: TemporalClient

    async def apply_queue(self, spec: QueueSpec | Mapping[str, Any] | str | Path) -> AppliedQueue:
        """Create or update a queue, from a spec, its fields (a mapping, as a queue file holds
        them; `type` may be left out, as for `QueueSpec` and `apply_fleet`'s mapping) or a
        queue file (which must say `type: queue`, as every fleet and queue file does). Waiting
        jobs are looked at again at once: a larger quota may start some. Running jobs keep
        running when a quota shrinks (or a lender's does): quota lent is taken back when a job
        needs it within its queue's nominal quota, by preempting borrowers' preemptible jobs,
        never the queue's own. A queue whose cohort's other queues have the other kind of
        quota (a total, or per GPU model) is refused (SpecError): they would lend it nothing."""
        if isinstance(spec, str | Path):
            spec = load_queue(spec)
        spec = model_of(QueueSpec, spec, _queue_named(spec))
        return AppliedQueue.from_record(await self._api.call("apply_queue", spec, QueueApplied))

    async def delete_queue(self, name: str, *, force: bool = False) -> None:
        """Delete a queue that holds no job, waiting, running or between attempts. Deleting an
        applied `default` brings back the built-in one; the built-in one cannot be deleted
        (nor one of a malformed name: SpecError, as `jobs(queue=...)` says it). A queue that
        gpuflow's schedules name is refused (InUseError, naming them: their runs would fail)
        unless `force` (`schedules_needing(queue=name)` tells which first)."""
        ref = QueueRef(name=queue_name(named(name, "queue")))
        if not force:
            await refuse_if_scheduled(self.temporal, queue=ref.name)
        await self._api.call("delete_queue", ref, type(None))

    async def list_queues(self) -> list[QueueInfo]:
        """Every queue, by name (the `default` queue included), with what it uses now."""
        records = await self._api.call("queues", Empty(), list[QueueRecord])
        return [QueueInfo.from_record(record) for record in records]

    async def set_priority(self, job: str, priority: int) -> JobInfo:
        """Change a job's priority within its queue (0..100), whether it waits or runs: a
        waiting job takes its new place in line at the next admission pass (asked for at
        once); a running job can be preempted (if preemptible) only for a job above its new
        priority; a later attempt of the job (a retry) keeps it. A job that ended is refused
        (ConflictError). Returns the job as it is now."""
        try:
            check_priority(priority)
        except ValueError as exc:
            raise SpecError(f"priority: {exc}") from None
        request = PriorityRequest(ref=named(job, "job"), priority=priority)
        return JobInfo.from_record(await self._api.call("set_priority", request, JobRecord))

    async def admission_held(self) -> bool:
        """Whether the admission loop is held (`hold_admission`): waiting jobs start only once
        it is let go, and the reasons they show are the last pass's."""
        task_queue = getattr(self._api, "task_queue", CONTROL_TASK_QUEUE)
        try:
            return await handles.admission_held(self.temporal, task_queue)
        except RPCError as exc:
            raise GpuflowError(f"could not ask the admission loop: {exc}") from None

    async def hold_admission(self, held: bool = True) -> None:
        """Hold the admission loop (no waiting job is admitted, none is refused) or, with
        `held=False`, let it go on; on the embedded stack `gpuflow down` holds it before
        stopping running jobs and `gpuflow up` lets it go. Holding starts a loop that is not
        running; letting go of one that is not running does nothing. A job submitted while the
        loop is held is still decided by its submit when nothing waits before it (a pass over
        it alone, in the submit's own transaction, not the loop's), so it may start:
        `gpuflow down` looks again after its stops and stops such a job too."""
        if not isinstance(held, bool):  # "no" is truthy: it would hold every job's start
            raise SpecError(f"held is True or False, not {held!r}")
        task_queue = getattr(self._api, "task_queue", CONTROL_TASK_QUEUE)
        try:
            await handles.hold_admission(self.temporal, held, task_queue)
        except RPCError as exc:
            verb = "hold" if held else "let go of"
            raise GpuflowError(f"could not {verb} the admission loop: {exc}") from None


def _queue_named(spec: object) -> str:
    """Where a refusal of a queue given as its fields says it was: `queue NAME` (its checks
    of the whole queue name no queue of their own), or `queue` for a name that is no name."""
    name = spec.get("name") if isinstance(spec, Mapping) else None
    try:
        return f"queue {check_name(name, 'queue name')}" if isinstance(name, str) else "queue"
    except ValueError:
        return "queue"
