"""The client's schedule calls: a Temporal Schedule that submits a job on a cron or an interval,
the schedules there are, deleting one, and which of them need a queue or secret that is to be
deleted. They talk to Temporal alone (a scheduled run starts a JobWorkflow as a submit does);
`Client` has them all."""

from __future__ import annotations

import os
import re
import zlib
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from temporalio.api.common.v1 import Payload
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
from gpuflow.client.cron import check_cron
from gpuflow.errors import GpuflowError, InUseError, NotFoundError, SpecError
from gpuflow.naming import CONTROL_TASK_QUEUE, job_workflow_id
from gpuflow.secrets import referenced
from gpuflow.specs.job import DEFAULT_QUEUE, JobSpec
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
MOST_NAMED = 10
"""Schedules named in one line about a queue or secret they need; the rest are counted."""


def _runs_jobs(action: object) -> bool:
    """Whether a schedule's action (as listed or as described) starts gpuflow jobs: only those
    schedules are gpuflow's; others of the namespace are another team's."""
    return (
        isinstance(action, ScheduleListActionStartWorkflow | ScheduleActionStartWorkflow)
        and action.workflow == "JobWorkflow"
    )


def run_id_prefix(job: str, schedule_id: str) -> str:
    """What a schedule's runs' workflow ids start with (Temporal appends the run's time):
    `job-<name>` for the job's default schedule, `job-<name>-<tag>` for any other, the tag
    six hex digits of a CRC-32 of the schedule id, so that schedules of one job do not start
    the same id. Not the schedule id itself: ids stay short (a schedule id may be 63
    characters), and job `a` of schedule `b-c` would start the ids of job `a-b`'s `c`, or of
    job `a-b-c`'s default schedule. A schedule keeps the prefix it was created with."""
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
        """A Temporal Schedule that submits the job on a cron or every `every_s` seconds (60 or
        more). A cron is five fields (minute hour day-of-month month day-of-week) or `@daily`
        and the like, in UTC unless it starts with `CRON_TZ=<zone>`; a bad one is a SpecError
        naming `cron` (`check_cron`). Each run is a job of its own, `job-<name>-<time>`
        (`job-<name>-<tag>-<time>` for a schedule id other than the default `schedule-<name>`,
        the tag six hex digits of a hash of the schedule id, `run_id_prefix`: two schedules of
        one job never start the same id in the same minute). Its queue and fleets must exist
        (SpecError, as for a submit)."""
        spec = model_of(JobSpec, spec, "job")
        if (cron is None) == (every_s is None):
            raise SpecError("give exactly one of cron or every (--cron or --every)")
        if cron is not None:
            cron = check_cron(cron)
        if every_s is not None:
            check_every(every_s)
        schedule_id = check_schedule_id(schedule_id or f"schedule-{spec.name}")
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
            refused = exc.message.removeprefix("Invalid schedule spec: ")
            if refused != exc.message:  # what check_cron cannot know (a zone this machine lacks)
                when = f"cron {cron!r}" if cron else f"every {every_s}s"
                raise SpecError(f"{when}: {refused}") from None
            raise SpecError(f"schedule {schedule_id}: {exc.message}") from None
        return schedule_id

    async def schedules(self) -> ScheduleList:
        """gpuflow's schedules (those whose runs are jobs); other schedules of the namespace
        are not listed."""
        out = []
        async for item in await self.temporal.list_schedules():
            if not _runs_jobs(item.schedule.action if item.schedule else None):
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
            if not _runs_jobs((await handle.describe()).schedule.action):
                raise SpecError(
                    f"schedule {schedule_id} does not run gpuflow jobs; not deleted (Temporal's "
                    "own tools delete it)"
                )
            await handle.delete()
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:
                raise NotFoundError(f"no schedule named {schedule_id!r}") from None
            raise NotFoundError(f"schedule {schedule_id}: {exc.message}") from None

    async def schedules_needing(
        self, *, queue: str | None = None, secret: str | None = None
    ) -> list[str]:
        """The ids of gpuflow's schedules whose runs need this queue (their job's `queue`) or
        this secret (their job's env refers to it), sorted: each of their later runs fails
        once it is deleted, which `delete_queue` and `delete_secret` refuse unless forced.
        None need `default` (deleting an applied one brings back the built-in one)."""
        return await schedules_needing(self.temporal, queue=queue, secret=secret)


async def schedules_needing(
    temporal: TemporalClient, *, queue: str | None = None, secret: str | None = None
) -> list[str]:
    """ScheduleCalls.schedules_needing. A schedule created moments ago may not be listed yet
    (Temporal's listing is eventually consistent); one deleted meanwhile, or whose input is not
    a job's, needs nothing."""
    if queue == DEFAULT_QUEUE:
        queue = None
    if queue is None and secret is None:
        return []
    needing = []
    try:
        async for item in await temporal.list_schedules():
            if not _runs_jobs(item.schedule.action if item.schedule else None):
                continue
            spec = await _scheduled_job(temporal, item.id)
            if spec is None:
                continue
            if spec.queue == queue or secret in referenced(spec.env).values():
                needing.append(item.id)
    except RPCError as exc:
        if exc.status == RPCStatusCode.UNIMPLEMENTED:
            return []  # a server without schedules (Temporal's time-skipping test server)
        raise GpuflowError(f"could not read the schedules: {exc.message}") from None
    return sorted(needing)


async def _scheduled_job(temporal: TemporalClient, schedule_id: str) -> JobSpec | None:
    """The job a schedule submits, as its action holds it (a listing does not carry it)."""
    try:
        action = (await temporal.get_schedule_handle(schedule_id).describe()).schedule.action
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            return None  # deleted since it was listed
        raise
    if not isinstance(action, ScheduleActionStartWorkflow) or not _runs_jobs(action):
        return None
    payloads = [arg for arg in action.args if isinstance(arg, Payload)][:1]
    if not payloads:
        return None
    try:
        (inp,) = await temporal.data_converter.decode(payloads, [JobInput])
    except (KeyError, RuntimeError, ValueError):  # made outside gpuflow with another input
        return None
    return inp.spec if isinstance(inp, JobInput) else None


async def refuse_if_scheduled(
    temporal: TemporalClient, *, queue: str | None = None, secret: str | None = None
) -> None:
    """InUseError naming the schedules that need the queue or secret a delete is asked for."""
    try:
        needing = await schedules_needing(temporal, queue=queue, secret=secret)
    except GpuflowError as exc:
        raise GpuflowError(f"{exc}; pass --force to delete it without looking") from None
    if needing:
        what = f"queue {queue}" if queue is not None else f"secret {secret}"
        raise InUseError(f"{needed_by(what, needing)}; delete them first, or pass --force", needing)


def needed_by(what: str, schedules: list[str]) -> str:
    """`queue nightly is used by schedule(s) a, b` (at most MOST_NAMED named)."""
    named = ", ".join(schedules[:MOST_NAMED])
    if len(schedules) > MOST_NAMED:
        named += f" and {len(schedules) - MOST_NAMED} more"
    return f"{what} is used by schedule(s) {named}"


def check_schedule_id(schedule_id: str, *, name: str = "schedule id") -> str:
    """A schedule id Temporal and gpuflow's run ids take, or a one-line SpecError naming
    `name` (`--id` for the CLI)."""
    if not isinstance(schedule_id, str) or not _SCHEDULE_ID.fullmatch(schedule_id):
        raise SpecError(
            f"{name} {schedule_id!r} must start with a letter and hold only lowercase letters, "
            "digits and '-' (at most 63 characters)"
        )
    return schedule_id


def check_every(every_s: float, *, name: str = "every") -> float:
    """An interval of at least a minute, in seconds, or a one-line SpecError naming `name`
    (`--every` for the CLI)."""
    if isinstance(every_s, bool) or not isinstance(every_s, int | float):
        raise SpecError(f"{name} is a number of seconds, not {every_s!r}")
    if every_s < 60:
        raise SpecError(
            f"{name} {every_s:g}s: a schedule runs at most once a minute; give 1m or more"
        )
    return every_s


def _when(cron: str | None, every_s: float | None) -> str:
    """How often a schedule runs, in words (`schedule list`)."""
    from gpuflow.specs.units import format_duration

    return f"cron {cron}" if cron else f"every {format_duration(every_s or 0)}"
