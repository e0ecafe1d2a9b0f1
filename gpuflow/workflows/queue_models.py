"""Inputs and outputs of the queue: a job entering and leaving it, the admission pass, and the
signals the admission loop sends jobs. Pure pydantic models, imported by workflow code."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from gpuflow.scheduler.model import Placement
from gpuflow.specs.job import JobSpec
from gpuflow.workflows.models import CONTROL_TASK_QUEUE, JobStatusInput

ADMISSION_WORKFLOW_ID = "gpuflow-admission"
"""The one admission loop of a control plane: its id is what makes passes one at a time."""


def admission_workflow_id(task_queue: str) -> str:
    """The loop of the control plane serving this task queue (`gpuflow-admission` for the
    default one; a namespace may hold several control planes on their own task queues)."""
    if task_queue == CONTROL_TASK_QUEUE:
        return ADMISSION_WORKFLOW_ID
    return f"{ADMISSION_WORKFLOW_ID}-{task_queue}"


class EnqueueInput(BaseModel):
    """A job asks its queue for capacity (or, asking again, learns what became of it)."""

    job_id: str
    attempt: int
    spec: JobSpec
    submitted_at: datetime
    """Order within a priority: the job's submission, kept across its attempts."""
    may_wait: bool
    """False: its retry does not cover no_capacity; the first pass that cannot admit it
    refuses it."""
    before: JobStatusInput | None = None
    """A status record the workflow has not written yet (its `submitted`)."""


class QueueVerdict(BaseModel):
    """Where a job stands in its queue: admitted (its placement), refused (why), or waiting."""

    placement: Placement | None = None
    refused: list[str] | None = None
    """Why a job that may not wait was not admitted (per-host reasons)."""
    reason: str | None = None
    """Why a waiting job waits, as the last pass said (no_capacity, quota, reserved_for:...,
    quota_held_for:...)."""
    detail: list[str] = Field(default_factory=list)
    """The per-host reasons of the last pass, when it computed them."""
    unknown_queue: bool = False
    """Refused because the job's queue does not exist (deleted since a schedule's run, or any
    job, named it): not a lack of capacity. False in results recorded before it was known."""


class WithdrawInput(BaseModel):
    job_id: str
    attempt: int


class ReservationState(BaseModel):
    """The reservation a pass hands the next (scheduler.reservation.Reservation)."""

    job: str
    starts_at: float | None = None
    hosts: list[str] = Field(default_factory=list)


class PassInput(BaseModel):
    reservation: ReservationState | None = None
    pass_id: str | None = None
    """The loop's id of this pass, the same in every run of it (a run whose result the loop did
    not record is run again): the pass tells again what a lost run of it decided."""


class AdmittedJob(BaseModel):
    job_id: str
    attempt: int
    placement: Placement


class PreemptedJob(BaseModel):
    job_id: str
    attempt: int
    for_job: str


class RefusedJob(BaseModel):
    job_id: str
    attempt: int
    reasons: list[str]


class PassResult(BaseModel):
    admitted: list[AdmittedJob] = Field(default_factory=list)
    preempted: list[PreemptedJob] = Field(default_factory=list)
    refused: list[RefusedJob] = Field(default_factory=list)
    held: list[RefusedJob] = Field(default_factory=list)
    """Jobs newly left waiting, or for a new reason: why, in words (told once)."""
    more: bool = False
    """The pass left admissions or words for the next one: pass again at once."""
    reservation: ReservationState | None = None
    waiting: int = 0
    """Jobs still waiting after the pass."""


class AdmissionState(BaseModel):
    """What the admission loop carries across continue-as-new."""

    reservation: ReservationState | None = None
    held: bool = False
    """Held by `gpuflow down` (the `hold` signal): no pass runs until it is let go."""


# ---- signals to a job ------------------------------------------------------------------------


class Admission(BaseModel):
    """The pass admitted the job: its allocation is taken, here is where."""

    attempt: int
    placement: Placement


class Refusal(BaseModel):
    attempt: int
    reasons: list[str]


class Preemption(BaseModel):
    attempt: int
    for_job: str


class TellResult(BaseModel):
    untold: list[str] = Field(default_factory=list)
    """Jobs whose signal was not delivered (a job that ended meanwhile is not one of them)."""


def news_of(result: PassResult) -> list[tuple[str, str, BaseModel]]:
    """What a pass tells the jobs it decided on, as (job id, JobWorkflow signal, argument): the
    admitted their placement, the refused why, the newly held why they wait, and the victims of
    a preemption to stop; in that order, each list in the pass's order."""
    news: list[tuple[str, str, BaseModel]] = [
        (job.job_id, "admitted", Admission(attempt=job.attempt, placement=job.placement))
        for job in result.admitted
    ]
    news += [
        (job.job_id, "refused", Refusal(attempt=job.attempt, reasons=job.reasons))
        for job in result.refused
    ]
    news += [
        (job.job_id, "waiting", Refusal(attempt=job.attempt, reasons=job.reasons))
        for job in result.held
    ]
    news += [
        (job.job_id, "preempt", Preemption(attempt=job.attempt, for_job=job.for_job))
        for job in result.preempted
    ]
    return news
