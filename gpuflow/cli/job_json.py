"""What `--json` prints of a job: one shape, `ps --json`'s, for `ps` and for `apply --json`
(the submitted jobs with `-d`, each with its plan's verdict; else the jobs' final records)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpuflow.cli.waiting import waiting_summary

if TYPE_CHECKING:
    from gpuflow.client import JobInfo
    from gpuflow.scheduler.model import Placement
    from gpuflow.scheduler.together import JobPlan


def job_json(job: JobInfo, positions: dict[str, tuple[int, int]]) -> dict[str, Any]:
    """A job as `ps --json` prints it: its record, and `waiting` (why and where it waits in
    line, `positions` as waiting.line_positions counts them; None for a job that does not)."""
    return {**job.model_dump(mode="json"), "waiting": waiting_summary(job, positions)}


def submitted_json(job: JobInfo, plan: JobPlan) -> dict[str, Any]:
    """A job `apply -d --json` submitted: its record as `ps --json` prints it, and `plan`, the
    verdict of the plan apply showed before submitting it."""
    return {**job_json(job, {}), "plan": plan_json(plan)}


def plan_json(plan: JobPlan) -> dict[str, Any]:
    """A plan's verdict in JobPlan's words: `admitted`, where an admission pass run now would
    start the job (null: it would not start now), once the running jobs in `preempts` have
    stopped for it; `placement`, where it fits (`waits` says why admission would hold it there,
    `ahead` how many jobs would wait before it); `queue_never`, why its queue could never admit
    it; `fits_idle`, false when only a change of the fleets makes room; `option`, the resource
    option it takes (1: `resources`, 2: the first alternative), null when none places."""
    return {
        "option": None if plan.taken is None else plan.taken + 1,
        "admitted": _placement(plan.admitted),
        "preempts": list(plan.preempts),
        "placement": _placement(plan.placement),
        "waits": plan.waits,
        "ahead": plan.ahead,
        "queue_never": plan.queue_never,
        "fits_idle": plan.fits_idle,
    }


def _placement(placement: Placement | None) -> dict[str, Any] | None:
    return None if placement is None else placement.model_dump(mode="json")
