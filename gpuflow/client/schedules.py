"""The client's schedule calls: a Temporal Schedule that submits a job on a cron or an interval,
the schedules there are, and deleting one. They talk to Temporal alone (a scheduled run starts a
JobWorkflow as a submit does); `Client` has them all."""

from __future__ import annotations

import os
import re
import zlib
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from temporalio.client import Client as TemporalClient
from temporalio.client import (
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleAlreadyRunningError,
    ScheduleIntervalSpec,
    ScheduleListActionStartWorkflow,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleSpec,
)
from temporalio.common import TypedSearchAttributes
from temporalio.service import RPCError, RPCStatusCode

from gpuflow.client.api import Api
from gpuflow.errors import NotFoundError, SpecError
from gpuflow.naming import CONTROL_TASK_QUEUE, job_workflow_id
from gpuflow.specs.job import JobSpec
from gpuflow.specs.load import model_of
from gpuflow.workflows.api import job_memo
from gpuflow.workflows.api_dry_runs import PlanRecord, PlanRequest
from gpuflow.workflows.models import JobInput
from gpuflow.workflows.ui import initial_search_attributes

ScheduleList = list[dict[str, Any]]


def search_attributes_enabled() -> bool:
    """Whether jobs are started with gpuflow's search attributes (GPUFLOW_SEARCH_ATTRIBUTES)."""
    return os.environ.get("GPUFLOW_SEARCH_ATTRIBUTES", "1") not in ("0", "false", "no")


_SCHEDULE_ID = re.compile(r"[a-z][a-z0-9-]{0,62}")


def run_id_prefix(job: str, schedule_id: str) -> str:
    """What a schedule's runs' workflow ids start with (Temporal appends the run's time):
    `job-<name>` for the job's default schedule, `job-<name>-<tag>` for any other, the tag
    a hash of the schedule id, so that schedules of one job do not start the same id."""
    if schedule_id == f"schedule-{job}":
        return f"job-{job}"
    return job_workflow_id(job, f"{zlib.crc32(schedule_id.encode()) & 0xFFFFFF:06x}")


class ScheduleCalls:
    temporal: TemporalClient
    _api: Api

    async def schedule(
        self,
        spec: JobSpec | Mapping[str, Any],
        *,
        cron: str | None = None,
        every_s: int | None = None,
        schedule_id: str | None = None,
    ) -> str:
        """A Temporal Schedule that submits the job on a cron or every `every_s` seconds.
        Each run is a job of its own, `job-<name>-<time>` (`job-<name>-<tag>-<time>` for a
        schedule id other than the default `schedule-<name>`, so that two schedules of one job
        never start the same id in the same minute). Its queue and fleets must exist
        (SpecError, as for a submit)."""
        spec = model_of(JobSpec, spec, "job")
        if (cron is None) == (every_s is None):
            raise SpecError("give exactly one of cron or every (--cron or --every)")
        if cron is not None:
            _check_cron(cron)
        if every_s is not None:
            if isinstance(every_s, bool) or not isinstance(every_s, int | float):
                raise SpecError(f"every is a number of seconds, not {every_s!r}")
            if every_s < 60:
                raise SpecError(f"every is {every_s}s; a schedule runs at most once a minute")
        schedule_id = schedule_id or f"schedule-{spec.name}"
        if not _SCHEDULE_ID.fullmatch(schedule_id):
            raise SpecError(
                f"schedule id {schedule_id!r} must start with a letter and hold only lowercase "
                "letters, digits and '-' (at most 63 characters)"
            )
        # Its queue and fleets must exist now, as a submit's must (the control plane checks
        # them in a plan): a run would otherwise fail on its own, every time.
        await self._api.call("plan", PlanRequest(specs=[spec]), list[PlanRecord])
        action = ScheduleActionStartWorkflow(
            "JobWorkflow",
            JobInput(spec=spec, search_attributes=search_attributes_enabled()),
            id=run_id_prefix(spec.name, schedule_id),
            typed_search_attributes=(
                initial_search_attributes(spec)
                if search_attributes_enabled()
                else TypedSearchAttributes.empty
            ),
            task_queue=CONTROL_TASK_QUEUE,
            memo=job_memo(spec),
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
                memo={"job": spec.name, "when": _when(cron, every_s)},
            )
        except ScheduleAlreadyRunningError:
            raise SpecError(f"schedule {schedule_id} exists; delete it first") from None
        except RPCError as exc:
            raise SpecError(f"schedule {schedule_id}: {exc.message}") from None
        return schedule_id

    async def schedules(self) -> ScheduleList:
        """gpuflow's schedules (those whose runs are jobs); other schedules of the namespace
        are not listed."""
        out = []
        async for item in await self.temporal.list_schedules():
            action = item.schedule.action if item.schedule else None
            if not isinstance(action, ScheduleListActionStartWorkflow) or action.workflow != (
                "JobWorkflow"
            ):
                continue
            info = item.info
            out.append(
                {
                    "id": item.id,
                    # what `schedule` wrote in its memo (None for a schedule made otherwise)
                    "job": await item.memo_value("job", None),
                    "when": await item.memo_value("when", None),
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
        """Delete one of gpuflow's schedules; a schedule of the namespace whose runs are not
        gpuflow jobs is refused (another team's, on a shared cluster)."""
        handle = self.temporal.get_schedule_handle(schedule_id)
        try:
            action = (await handle.describe()).schedule.action
            if not isinstance(action, ScheduleActionStartWorkflow) or action.workflow != (
                "JobWorkflow"
            ):
                raise SpecError(
                    f"schedule {schedule_id} does not run gpuflow jobs; not deleted (Temporal's "
                    "own tools delete it)"
                )
            await handle.delete()
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:
                raise NotFoundError(f"no schedule named {schedule_id!r}") from None
            raise NotFoundError(f"schedule {schedule_id}: {exc.message}") from None


def _check_cron(cron: str) -> None:
    """Refuse a cron text that is empty, or that is Temporal's `@every` interval, which would
    run a schedule more often than once a minute (`--every` is the way to an interval)."""
    if not isinstance(cron, str):
        raise SpecError(f"cron is text, e.g. '0 3 * * *', not {type(cron).__name__}")
    if not cron.strip():
        raise SpecError("cron is empty: give five fields, e.g. '0 3 * * *'")
    if cron.strip().lower().startswith("@every"):
        raise SpecError(f"cron {cron!r}: an interval is given with every (--every), not in cron")


def _when(cron: str | None, every_s: float | None) -> str:
    """How often a schedule runs, in words (`schedule list`)."""
    from gpuflow.specs.units import format_duration

    return f"cron {cron}" if cron else f"every {format_duration(every_s or 0)}"
