"""What reconciliation reads and writes in the store, on SQLite and PostgreSQL."""

from __future__ import annotations

from typing import Any

from gpuflow.control.reconcile import release_orphans
from gpuflow.scheduler.model import Placement
from gpuflow.services.capacity import allocations_of, held_attempts, take_allocation
from gpuflow.services.fleets import apply_fleet
from gpuflow.services.jobs import (
    find_job,
    job_events,
    jobs_waiting_for_capacity,
    record_reconciled_in,
    record_status_in,
)
from gpuflow.specs import FleetSpec, JobSpec
from gpuflow.status import JobStatus, TerminationReason
from gpuflow.store.db import Store
from gpuflow.workflows.models import Orphan, OrphanNode, ReleaseOrphansInput


def _fleet(store: Store, name: str, gpus: int = 4) -> None:
    apply_fleet(
        store,
        FleetSpec.model_validate(
            {
                "type": "fleet",
                "name": name,
                "kind": "sim",
                "hosts": [
                    {
                        "name": f"{name}-h{i}",
                        "gpus": [{"name": "A100", "memory": "80GB", "count": gpus}],
                    }
                    for i in range(3)
                ],
            }
        ),
    )


def _job(name: str = "j", gpu: str = "A100:1", **extra: Any) -> JobSpec:
    return JobSpec.model_validate(
        {"name": name, "commands": ["true"], "resources": {"gpu": gpu}, **extra}
    )


def _record(
    store: Store, job_id: str, status: JobStatus, *, attempt: int = 1, **extra: Any
) -> None:
    with store.session() as session:
        record_status_in(
            session,
            job_id=job_id,
            name=job_id.split("-")[1],
            spec=None,
            status=status,
            event_key=f"{attempt}:{status.value}:{extra.get('message', '')}",
            attempt=attempt,
            **extra,
        )
        session.commit()


def _take(store: Store, job_id: str, attempt: int = 1, **extra: Any) -> Placement:
    placed = take_allocation(store, job_id=job_id, attempt=attempt, job=_job(**extra))
    assert isinstance(placed, Placement)
    return placed


def test_held_attempts_lists_the_fleets_allocations_with_the_jobs_status(store: Store) -> None:
    _fleet(store, "a")
    _fleet(store, "b")
    _record(store, "job-gang-1", JobStatus.RUNNING)
    gang = _take(store, "job-gang-1", gpu="A100:4", nodes=2, fleets=["a"])
    _record(store, "job-run-1", JobStatus.RUNNING)
    _take(store, "job-run-1", fleets=["a"])
    _record(store, "job-done-1", JobStatus.RUNNING)
    _take(store, "job-done-1", fleets=["a"])
    _record(store, "job-done-1", JobStatus.DONE, reason="done")
    _take(store, "job-nobody-1", fleets=["a"])
    _record(store, "job-other-1", JobStatus.RUNNING)
    _take(store, "job-other-1", fleets=["b"])

    held = {h.job_id: h for h in held_attempts(store, fleet="a")}

    assert sorted(held) == ["job-done-1", "job-gang-1", "job-nobody-1", "job-run-1"]
    assert [(n.rank, n.host_name, n.task_queue) for n in held["job-gang-1"].nodes] == [
        (n.rank, n.host_name, n.task_queue) for n in gang.nodes
    ]
    assert [n.rank for n in held["job-gang-1"].nodes] == [0, 1]
    assert held["job-run-1"].job_status == JobStatus.RUNNING and not held["job-run-1"].ended
    assert held["job-done-1"].job_status == JobStatus.DONE and held["job-done-1"].ended
    assert held["job-nobody-1"].job_status is None and not held["job-nobody-1"].ended


def test_a_retrying_jobs_next_attempt_is_not_taken_for_ended(store: Store) -> None:
    """A job's row can read final while its next attempt runs: only attempts up to the
    recorded one count as ended."""
    _fleet(store, "a")
    _record(store, "job-retry-1", JobStatus.FAILED, reason="process_failed")
    _take(store, "job-retry-1", attempt=2)
    (held,) = held_attempts(store, fleet="a")
    assert held.attempt == 2 and held.job_attempt == 1 and not held.ended


def test_reconciled_job_ends_with_workflow_closed_once(store: Store) -> None:
    _fleet(store, "a")
    _record(store, "job-lost-1", JobStatus.RUNNING)
    _take(store, "job-lost-1")
    for _ in range(2):  # a repeated activity changes nothing the second time
        with store.placement_transaction() as session:
            record_reconciled_in(
                session,
                job_id="job-lost-1",
                attempt=1,
                reason=TerminationReason.WORKFLOW_CLOSED,
                message="workflow terminated outside gpuflow",
                event_message="workflow terminated outside gpuflow: released",
            )
    job = find_job(store, "job-lost-1")
    assert job.status == JobStatus.TERMINATED
    assert job.termination_reason == "workflow_closed"
    assert job.message == "workflow terminated outside gpuflow"
    assert job.finished_at is not None
    events = [e for e in job_events(store, "job-lost-1") if e.key == "1:reconciled"]
    assert [(e.kind, e.message) for e in events] == [
        ("terminated", "workflow terminated outside gpuflow: released")
    ]


def test_reconciling_an_ended_job_keeps_its_status_and_adds_the_event(store: Store) -> None:
    _fleet(store, "a")
    _record(store, "job-done-1", JobStatus.DONE, reason="done", message="all exited")
    with store.placement_transaction() as session:
        record_reconciled_in(
            session,
            job_id="job-done-1",
            attempt=1,
            reason=TerminationReason.WORKFLOW_CLOSED,
            message="the job had ended but still held GPUs",
            event_message="the job had ended but still held GPUs: released",
        )
    job = find_job(store, "job-done-1")
    assert (job.status, job.termination_reason, job.message) == ("done", "done", "all exited")
    assert [e.kind for e in job_events(store, "job-done-1") if e.key == "1:reconciled"] == ["done"]


def test_release_orphans_frees_only_the_orphaned_attempt_and_is_idempotent(store: Store) -> None:
    _fleet(store, "a", gpus=1)
    _record(store, "job-lost-1", JobStatus.RUNNING)
    lost = _take(store, "job-lost-1", gpu="A100:1", nodes=2)
    _record(store, "job-wait-1", JobStatus.PENDING, waiting_for_capacity=True)
    _record(store, "job-next-1", JobStatus.FAILED, reason="process_failed")
    _take(store, "job-next-1", attempt=1)  # a stale first attempt...
    orphans = ReleaseOrphansInput(
        fleet="a",
        orphans=[
            Orphan(
                job_id="job-lost-1",
                attempt=1,
                nodes=[
                    OrphanNode(rank=n.rank, host_name=n.host_name, task_queue=n.task_queue)
                    for n in lost.nodes
                ],
                message="workflow terminated outside gpuflow",
                job_ended=False,
            ),
            Orphan(job_id="job-next-1", attempt=2, nodes=[], message="x", job_ended=True),
        ],
    )
    first = release_orphans(store, orphans)
    again = release_orphans(store, orphans)
    assert first.released_nodes == 2 and first.waiting_jobs == ["job-wait-1"]
    assert again.released_nodes == 0 and again.waiting_jobs == []
    assert allocations_of(store, "job-lost-1") == []
    # ...is not the attempt the orphan named: left alone.
    assert [a.attempt for a in allocations_of(store, "job-next-1")] == [1]
    assert find_job(store, "job-lost-1").status == JobStatus.TERMINATED
    assert len([e for e in job_events(store, "job-lost-1") if e.key == "1:reconciled"]) == 1


def test_a_waiting_job_that_ends_stops_waiting(store: Store) -> None:
    _record(store, "job-wait-1", JobStatus.PENDING, waiting_for_capacity=True)
    assert jobs_waiting_for_capacity(store) == ["job-wait-1"]
    _record(store, "job-wait-1", JobStatus.STOPPED, reason="stopped_by_user")
    assert find_job(store, "job-wait-1").waiting_for_capacity is False
    # A late record of the wait (a retried activity) does not bring the flag back.
    _record(store, "job-wait-1", JobStatus.PENDING, waiting_for_capacity=True, message="late")
    job = find_job(store, "job-wait-1")
    assert job.status == JobStatus.STOPPED and job.waiting_for_capacity is False


def test_a_job_reconciled_while_waiting_stops_waiting(store: Store) -> None:
    _record(store, "job-wait-1", JobStatus.PENDING, waiting_for_capacity=True)
    with store.placement_transaction() as session:
        record_reconciled_in(
            session,
            job_id="job-wait-1",
            attempt=1,
            reason=TerminationReason.WORKFLOW_CLOSED,
            message="workflow terminated outside gpuflow",
            event_message="released",
        )
    job = find_job(store, "job-wait-1")
    assert job.status == JobStatus.TERMINATED and job.waiting_for_capacity is False
