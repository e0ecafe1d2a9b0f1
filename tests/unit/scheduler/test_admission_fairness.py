"""What a backfill reservation may hold back across queues (gpuflow/scheduler/admission.py): not
a job that stays within its queue's nominal quota when the reserved job would borrow."""

from __future__ import annotations

from gpuflow.scheduler import release_placement
from gpuflow.scheduler.admission import NO_CAPACITY, RESERVED_FOR, admit
from gpuflow.specs import QueueSpec
from tests.unit.scheduler.test_admission import TWO, fleet, names, reasons, start, waiting


def test_a_reservation_for_a_job_that_would_borrow_does_not_hold_back_a_queue_within_quota() -> (
    None
):
    snapshot = fleet(2)
    elsewhere = start(snapshot, waiting("a-steady", 8))
    ending = start(snapshot, waiting("a-ending", 4))
    big = waiting("a-big", 8, at=1)
    first = admit(queues=TWO, running=[elsewhere, ending], waiting=[big], snapshot=snapshot, now=0)
    assert first.reservation is not None
    assert first.reservation.hosts == {"lab/gpu-1"}
    release_placement(snapshot, ending.placement)
    # a-big would take queue a to 16 GPUs of its 8: it borrows b's quota, which b now wants
    second = admit(
        queues=TWO,
        running=[elsewhere],
        waiting=[big, waiting("b-small", 2, queue="b", at=2)],
        snapshot=snapshot,
        now=10,
        reserved=first.reservation,
    )
    assert names(second) == ["b-small"]
    assert [(a.job.name, a.backfill) for a in second.admitted] == [("b-small", True)]
    assert reasons(second) == {"a-big": NO_CAPACITY}


def test_a_borrowing_reservation_still_holds_back_the_jobs_that_borrow_too() -> None:
    snapshot = fleet(2)
    queues = [
        QueueSpec(name="a", gpus=8, cohort="lab"),
        QueueSpec(name="b", gpus=2, cohort="lab"),
        QueueSpec(name="c", gpus=8, cohort="lab"),
    ]
    running = [
        start(snapshot, waiting("a-steady", 8)),
        start(snapshot, waiting("b-run", 2, queue="b"), 5),
    ]
    big = waiting("a-big", 8, at=1)
    first = admit(queues=queues, running=running, waiting=[big], snapshot=snapshot, now=0)
    assert first.reservation is not None
    assert first.reservation.hosts == {"lab/gpu-1"}
    assert first.reservation.waits_for == {"b-run"}
    # b-small would borrow too (4 GPUs of b's 2): the reservation holds it back
    second = admit(
        queues=queues,
        running=running,
        waiting=[big, waiting("b-small", 2, queue="b", at=2)],
        snapshot=snapshot,
        now=10,
        reserved=first.reservation,
    )
    assert names(second) == []
    assert reasons(second) == {"a-big": NO_CAPACITY, "b-small": RESERVED_FOR + "a-big"}
