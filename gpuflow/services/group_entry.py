"""Submits entered in one placement transaction (group commit: gpuflow/control/admission.py
`GroupCommit`), with the rows each would write alone.

The submits of a group are entered in order. The longest prefix of it that a pass over each job
alone decides at once (a new job, nothing waiting, a queue without quota limit or cohort; an
option that fits, or none and the job may not wait and nothing could be preempted for it) is
decided on the warm snapshot as the scheduler's pure function decides a stream of jobs: each
placement applied to the snapshot in memory before the next job is placed, and all of them
written with one flush and one count of the change. The rest
of the group goes through `enter_at_submit_in`, one job after the other, as a submit alone
does. The fleets' mix is the one read at the group's start. `tests/unit/store/
test_group_entry.py` checks that a group leaves the rows and verdicts that the same jobs
entered one at a time leave (on a scorer without the mix).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import bindparam
from sqlmodel import Session

from gpuflow.scheduler import apply_placement, place
from gpuflow.scheduler.admission import NO_CAPACITY
from gpuflow.scheduler.model import Placement, Unschedulable
from gpuflow.services.admission import snapshot_in
from gpuflow.services.capacity import allocation_values
from gpuflow.services.changes import bump_hosts
from gpuflow.services.mix import note_specs
from gpuflow.services.queue_entries import (
    anyone_waits_in,
    decided_alone,
    enter_at_submit_in,
    enter_new_in,
    entry_values,
    submitted_key,
    victims_possible,
)
from gpuflow.services.queues import queues_in
from gpuflow.services.snapshot import use_of_values
from gpuflow.services.verdicts import (
    admitted_job,
    admitted_key,
    admitted_values,
    no_fit_lines,
    refused_values,
)
from gpuflow.services.warm import warm_capacity
from gpuflow.specs.job import JobSpec
from gpuflow.status import JobStatus
from gpuflow.store.bulk import insert_new_rows, insert_rows
from gpuflow.store.db import SUBMITTED
from gpuflow.store.tables import AllocationRow, JobEventRow, JobRow, QueueEntryRow
from gpuflow.workflows.queue_models import EnqueueInput, QueueVerdict

__all__ = ["Submitted", "enter_group_in"]


@dataclass(frozen=True)
class Submitted:
    """A job whose workflow the API just started, to enter its queue."""

    job_id: str
    run_id: str
    spec: JobSpec


Decided = tuple[Submitted, datetime, Placement | list[str]]
"""A job of the group's prefix, when it entered, and its placement or why it was refused."""


def enter_group_in(
    session: Session, jobs: Sequence[Submitted], *, warm: bool = True
) -> list[QueueVerdict]:
    """Each job's verdict, in order, as if each had entered alone, one after the other."""
    rows = _new_rows(session, jobs)
    verdicts = _decided_at_once(session, jobs, rows, warm)
    for job in jobs[len(verdicts) :]:
        at = datetime.now(UTC)
        # a job whose row `_new_rows` wrote enters as new; one entered before (or earlier in
        # this group) learns what became of its entry
        enter = enter_new_in if rows.pop(job.job_id, None) is not None else enter_at_submit_in
        verdicts.append(
            enter(session, job_id=job.job_id, run_id=job.run_id, spec=job.spec, at=at, warm=warm)
        )
    return verdicts


def _new_rows(session: Session, jobs: Sequence[Submitted]) -> dict[str, dict[str, Any]]:
    """The rows of the group's jobs not entered before, written (pending, `submitted`) before
    anything is placed, so the fleets' mix counts them as a submit alone counts its own job: one
    INSERT that leaves a job entered before as it is (store/bulk.py `insert_new_rows`). Returns
    the values of the rows written, by job id."""
    rows: dict[str, dict[str, Any]] = {}
    for job in jobs:
        if job.job_id not in rows:
            spec = job.spec
            rows[job.job_id] = {
                "id": job.job_id,
                "name": spec.name,
                "status": JobStatus.PENDING.value,
                "spec": spec.model_dump(mode="json"),
                "attempt": 1,
                "message": "submitted",
                "submitted_at": datetime.now(UTC),
            }
    written = insert_new_rows(session, JobRow, list(rows.values()))
    rows = {job_id: row for job_id, row in rows.items() if job_id in written}
    # The admission metric reads a placed job's submission time from here, not from its row.
    submitted = {job_id: row["submitted_at"] for job_id, row in rows.items()}
    session.info.setdefault(SUBMITTED, {}).update(submitted)
    note_specs(session, {job.job_id: job.spec for job in jobs if job.job_id in rows})
    return rows


def _decided_at_once(
    session: Session, jobs: Sequence[Submitted], rows: dict[str, dict[str, Any]], warm: bool
) -> list[QueueVerdict]:
    """The verdicts of the group's longest prefix that is decided at once (see the module
    docstring), its rows written."""
    if anyone_waits_in(session):
        return []
    queues = {queue.name: queue for queue in queues_in(session)}
    snapshot = None
    decided: list[Decided] = []
    victims: dict[tuple[str, int], bool] = {}
    for job in jobs:
        if job.job_id not in rows or not decided_alone(queues.get(job.spec.queue)):
            break
        if any(earlier.job_id == job.job_id for earlier, _, _ in decided):
            break  # the same job twice: the second learns what became of the first
        at = datetime.now(UTC)
        snapshot = snapshot or snapshot_in(session, warm)
        tries: list[tuple[JobSpec, Placement | Unschedulable]] = []
        for option in job.spec.resource_options():
            tries.append((option, place(option, snapshot)))
            if isinstance(tries[-1][1], Placement):
                break
        found = tries[-1][1]
        if isinstance(found, Placement):
            apply_placement(snapshot, found)
            decided.append((job, at, found))
        elif job.spec.may_wait or _victims_possible(session, job.spec, decided, victims):
            break  # it waits, or a full pass decides: as a submit alone does
        else:
            decided.append((job, at, no_fit_lines(tries)))
    if decided:
        _write(session, decided, rows)
    for job, _, _ in decided:
        del rows[job.job_id]
    return [
        QueueVerdict(placement=outcome)
        if isinstance(outcome, Placement)
        else QueueVerdict(refused=outcome)
        for _, _, outcome in decided
    ]


def _victims_possible(
    session: Session, spec: JobSpec, decided: list[Decided], asked: dict[tuple[str, int], bool]
) -> bool:
    """Whether a running job of the job's queue, or one admitted earlier in the group, could
    be preempted for it. What the database says of the running jobs is asked once per queue
    and priority in a group (`asked`): the transaction holds the placement lock, so nothing
    else admits a job meanwhile, and the group's own admissions are looked at here."""
    if any(
        isinstance(outcome, Placement)
        and job.spec.queue == spec.queue
        and job.spec.preemptible
        and job.spec.priority < spec.priority
        for job, _, outcome in decided
    ):
        return True
    key = (spec.queue, spec.priority)
    found = asked.get(key)
    if found is None:
        found = asked[key] = victims_possible(session, spec.queue, spec.priority)
    return found


_JOBS = JobRow.__table__  # type: ignore[attr-defined]
_PLACED = _JOBS.update().where(_JOBS.c.id == bindparam("job_id"))
"""The jobs a group placed, on their placements (one statement for all of them: each row's
status, message, fleet, gpus and hosts)."""


def _write(session: Session, decided: list[Decided], rows: dict[str, dict[str, Any]]) -> None:
    """The rows `enter_at_submit_in` writes for a job it decides alone: the job's `submitted`
    record and its entry; for one admitted, the job on its placement (provisioning), its
    `admitted` record and its allocation; for one refused, the entry says why. Then the warm
    state takes the allocations written, with the ids the database gave them."""
    now = datetime.now(UTC)
    hosts: set[str] = set()
    events: list[dict[str, Any]] = []
    entries: list[dict[str, Any]] = []
    refused: list[dict[str, Any]] = []
    allocations: list[dict[str, Any]] = []
    placed: list[dict[str, Any]] = []
    for job, at, outcome in decided:
        spec, job_row = job.spec, rows[job.job_id]
        ask = EnqueueInput(
            job_id=job.job_id, attempt=1, spec=spec, submitted_at=at, may_wait=spec.may_wait
        )
        entry = entry_values(ask, dumped=job_row["spec"])
        events.append(
            {
                "job_id": job.job_id,
                "key": submitted_key(job.run_id),
                "kind": JobStatus.PENDING.value,
                "message": "submitted",
            }
        )
        if isinstance(outcome, Placement):
            admitted = admitted_job(outcome)
            placed.append({**admitted, "job_id": job.job_id, "status": admitted["status"].value})
            entries.append({**entry, **admitted_values(now)})
            events.append(
                {
                    "job_id": job.job_id,
                    "key": admitted_key(1, admitted["message"]),
                    "kind": admitted["status"].value,
                    "message": admitted["message"],
                }
            )
            allocations.extend(allocation_values(job.job_id, 1, outcome))
            hosts.update(node.host_id for node in outcome.nodes)
        else:
            refused.append({**entry, **refused_values(NO_CAPACITY, outcome)})
    # Written as one INSERT per table (store/bulk.py): a group writes these for every job.
    insert_rows(session, JobEventRow, events)
    insert_rows(session, QueueEntryRow, entries)
    insert_rows(session, QueueEntryRow, refused)
    ids = insert_rows(session, AllocationRow, allocations, returning="id")
    if placed:
        session.connection().execute(_PLACED, placed)
    session.flush()
    if not hosts:
        return
    state = warm_capacity(session)
    versions = state.hold(session)
    if versions is not None:
        state.track(versions)
    for values, row_id in zip(allocations, ids, strict=True):
        state.taken(values["host_id"], use_of_values(row_id, values))
    state.counted(bump_hosts(session, "allocations", hosts))
