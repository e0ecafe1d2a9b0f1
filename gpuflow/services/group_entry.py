"""Submits entered in one placement transaction (group commit: gpuflow/control/admission.py
`GroupCommit`), with the rows each would write alone.

The submits of a group are entered in order. The longest prefix of it that a pass over each job
alone admits at once (a new job, nothing waiting, a queue without quota limit or cohort, an
option that fits) is decided on the warm snapshot as the scheduler's pure function decides a
stream of jobs: each placement applied to the snapshot in memory before the next is placed, and
all of them written with one flush, one read of the hosts they took, and one count of the
change. The rest of the group goes through `enter_at_submit_in`, one job after the other, as a
submit alone does. `tests/unit/store/test_group_entry.py` checks that a group leaves the rows
that the same jobs entered one at a time leave.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import select as sa_select
from sqlmodel import Session, col

from gpuflow.scheduler import apply_placement, place
from gpuflow.scheduler.model import Placement
from gpuflow.services.admission import ADMITTED, WAITING, snapshot_in
from gpuflow.services.capacity import allocation_rows
from gpuflow.services.changes import bump
from gpuflow.services.jobs import gpu_summary
from gpuflow.services.queue_entries import decided_alone, enter_at_submit_in, submitted_key
from gpuflow.services.queues import queues_in
from gpuflow.services.warm import warm_capacity
from gpuflow.specs.job import JobSpec
from gpuflow.status import JobStatus
from gpuflow.store.tables import JobEventRow, JobRow, QueueEntryRow
from gpuflow.workflows.models import placed_message
from gpuflow.workflows.queue_models import QueueVerdict

__all__ = ["Submitted", "enter_group_in"]


@dataclass(frozen=True)
class Submitted:
    """A job whose workflow the API just started, to enter its queue."""

    job_id: str
    run_id: str
    spec: JobSpec


def enter_group_in(
    session: Session, jobs: Sequence[Submitted], *, warm: bool = True
) -> list[QueueVerdict]:
    """Each job's verdict, in order, as if each had entered alone, one after the other."""
    verdicts = _admitted_at_once(session, jobs, warm)
    for job in jobs[len(verdicts) :]:
        at = datetime.now(UTC)
        verdicts.append(
            enter_at_submit_in(
                session, job_id=job.job_id, run_id=job.run_id, spec=job.spec, at=at, warm=warm
            )
        )
    return verdicts


def _admitted_at_once(
    session: Session, jobs: Sequence[Submitted], warm: bool
) -> list[QueueVerdict]:
    """The verdicts of the group's longest prefix that is admitted at once (see the module
    docstring), its rows written."""
    ids = [job.job_id for job in jobs]
    known = sa_select(JobRow.id).where(col(JobRow.id).in_(ids))  # type: ignore[call-overload]
    stop = {row[0] for row in session.connection().execute(known)}
    waits = sa_select(QueueEntryRow.job_id).where(QueueEntryRow.state == WAITING)  # type: ignore[call-overload]
    if session.connection().execute(waits.limit(1)).first() is not None:
        return []
    queues = {queue.name: queue for queue in queues_in(session)}
    snapshot = None
    admitted: list[tuple[Submitted, datetime, Placement]] = []
    for job in jobs:
        if job.job_id in stop or not decided_alone(queues.get(job.spec.queue)):
            break
        at = datetime.now(UTC)
        snapshot = snapshot or snapshot_in(session, warm)
        tries = (place(option, snapshot) for option in job.spec.resource_options())
        found = next((p for p in tries if isinstance(p, Placement)), None)
        if found is None:
            break  # refused or waiting: as a submit alone decides it
        apply_placement(snapshot, found)
        admitted.append((job, at, found))
    if admitted:
        _write(session, admitted)
    return [QueueVerdict(placement=placement) for _, _, placement in admitted]


def _write(session: Session, admitted: list[tuple[Submitted, datetime, Placement]]) -> None:
    """The rows `enter_at_submit_in` writes for a job it admits: the job (provisioning, on its
    placement), its `submitted` and `admitted` records, its admitted entry, its allocation;
    then the warm state takes the database's usage of the hosts they took."""
    now = datetime.now(UTC)
    hosts: set[str] = set()
    for job, at, placement in admitted:
        spec, message = job.spec, placed_message(placement)
        session.add(
            JobRow(
                id=job.job_id,
                name=spec.name,
                status=JobStatus.PROVISIONING,
                spec=spec.model_dump(mode="json"),
                attempt=1,
                message=message,
                fleet=placement.fleet,
                hosts=[node.host_name for node in placement.nodes],
                gpus=gpu_summary(placement),
                submitted_at=at,
            )
        )
        session.add(
            JobEventRow(
                job_id=job.job_id,
                key=submitted_key(job.run_id),
                kind=JobStatus.PENDING.value,
                message="submitted",
            )
        )
        session.add(
            JobEventRow(
                job_id=job.job_id,
                key=f"1:admitted:{message[:80]}",
                kind=JobStatus.PROVISIONING.value,
                message=message,
            )
        )
        session.add(
            QueueEntryRow(
                job_id=job.job_id,
                attempt=1,
                name=spec.name,
                queue=spec.queue,
                state=ADMITTED,
                priority=spec.priority,
                preemptible=spec.preemptible,
                may_wait=spec.may_wait,
                spec={},
                fleets=list(spec.fleets),
                submitted_at=at,
                admitted_at=now,
                max_duration_s=None if spec.max_duration is None else float(spec.max_duration),
            )
        )
        session.add_all(allocation_rows(job.job_id, 1, placement))
        hosts.update(node.host_id for node in placement.nodes)
    session.flush()
    state = warm_capacity(session)
    versions = state.hold(session)
    if versions is not None:
        state.track(versions)
    state.took(session, sorted(hosts))
    state.counted(bump(session, "allocations"))
