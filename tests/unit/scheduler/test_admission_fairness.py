"""What a backfill reservation may hold back (gpuflow/scheduler/admission.py, reservation.py):
not a queue within its nominal quota when the reserved job would borrow, and only the room the
reserved job needs on its hosts."""

from __future__ import annotations

from gpuflow.scheduler import Snapshot, release_placement
from gpuflow.scheduler.admission import NO_CAPACITY, QUOTA, RESERVED_FOR, Running, admit
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


def test_a_reservation_holds_the_room_its_job_needs_not_its_whole_hosts() -> None:
    snapshot = fleet(1)
    queue = [QueueSpec(name="a", gpus=100)]
    old = start(snapshot, waiting("old", 1), now=0)
    recent = start(snapshot, waiting("recent", 4), now=5)
    decision = admit(
        queues=queue,
        running=[old, recent],
        waiting=[
            waiting("big", 6, at=10, priority=50),
            waiting("beside", 1, at=11),
            waiting("in-its-way", 2, at=12),
        ],
        snapshot=snapshot,
        now=20,
    )
    # big waits for `recent` (the most recently started) to end: 3 free + 4 = its 6 and 1 more
    assert decision.reservation is not None
    assert decision.reservation.waits_for == {"recent"}
    assert names(decision) == ["beside"]
    assert reasons(decision) == {"big": NO_CAPACITY, "in-its-way": "reserved_for:big"}


def test_a_small_reservation_does_not_hand_its_host_to_a_borrower_of_its_queue() -> None:
    """b-tiny (2 GPUs, within b's quota) holds gpu-1; a-new stays within a's quota and fits
    beside b-tiny's room; b-big outranks b-tiny in b but would borrow. Had the reservation
    held the whole host, a-new would wait while b-big took it by borrowing a's quota."""
    snapshot = fleet(2)
    queues = [
        QueueSpec(name="a", gpus=8, cohort="lab"),
        QueueSpec(name="b", gpus=4, cohort="lab"),
        QueueSpec(name="c", gpus=8),
    ]
    full = start(snapshot, waiting("c-full", 8, queue="c"))
    old = start(snapshot, waiting("b-old", 1, queue="b"))
    recent = start(snapshot, waiting("b-recent", 6, queue="b"), 5)
    tiny = waiting("b-tiny", 2, queue="b", at=6)
    first = admit(
        queues=queues, running=[full, old, recent], waiting=[tiny], snapshot=snapshot, now=10
    )
    assert first.reservation is not None
    assert first.reservation.job == "b-tiny"
    assert first.reservation.waits_for == {"b-recent"}
    release_placement(snapshot, recent.placement)
    second = admit(
        queues=queues,
        running=[full, old],
        waiting=[tiny, waiting("a-new", 4, at=7), waiting("b-big", 6, queue="b", priority=50)],
        snapshot=snapshot,
        now=20,
        reserved=first.reservation,
    )
    assert names(second) == ["a-new"]
    # b-big, blocked now, holds the reservation and b-tiny (below it in b) leaves it its room
    assert reasons(second) == {"b-big": NO_CAPACITY, "b-tiny": RESERVED_FOR + "b-big"}


def _research_fills_the_host() -> tuple[Snapshot, list[QueueSpec], list[Running]]:
    """One 8-GPU host; queues prod and research (cohort lab); research runs four 2-GPU jobs of
    priorities 10-40 on it."""
    snapshot = fleet(1)
    queues = [
        QueueSpec(name="prod", gpus=16, cohort="lab", lending_limit=8),
        QueueSpec(name="research", gpus=16, cohort="lab", borrowing_limit=8),
    ]
    running = [
        start(snapshot, waiting(f"r{k}", 2, queue="research", priority=10 * k, at=k))
        for k in range(1, 5)
    ]
    return snapshot, queues, running


def test_a_higher_priority_of_another_queue_does_not_take_the_reservation() -> None:
    """Seen from the CLI: research filled the one host with jobs of priority 10-40 and had two
    more waiting (50, 60); prod's 8-GPU job (priority 5, prod's share the lower) reserved the
    host, and at the first release research's priority 60 took the reservation over, then its
    50, and so on while research kept submitting: prod's job would never start. Priorities
    order jobs within a queue; across queues the share decides, and a holder within its
    queue's nominal quota keeps its reservation until it starts."""
    snapshot, queues, running = _research_fills_the_host()
    big = waiting("big", 8, queue="prod", priority=5, at=10)
    later = [waiting(f"r{k}", 2, queue="research", priority=10 * k, at=k) for k in (5, 6)]
    first = admit(queues=queues, running=running, waiting=[*later, big], snapshot=snapshot, now=0)
    assert first.reservation is not None and first.reservation.job == "big"
    for k, ended in enumerate(running[:3]):
        release_placement(snapshot, ended.placement)
        decision = admit(
            queues=queues,
            running=running[k + 1 :],
            waiting=[*later, big],
            snapshot=snapshot,
            now=10 + k,
            reserved=first.reservation,
        )
        assert names(decision) == []
        assert decision.reservation is not None and decision.reservation.job == "big"
        assert reasons(decision) == {
            "big": NO_CAPACITY,
            "r5": RESERVED_FOR + "big",
            "r6": RESERVED_FOR + "big",
        }
    release_placement(snapshot, running[3].placement)
    last = admit(
        queues=queues,
        running=[],
        waiting=[*later, big],
        snapshot=snapshot,
        now=20,
        reserved=first.reservation,
    )
    assert names(last) == ["big"]


def test_a_job_within_quota_takes_the_reservation_from_one_that_would_borrow() -> None:
    """The one way across queues for a job tried after the holder: a blocked job that stays
    within its queue's nominal quota reserves instead of a holder that would borrow (the
    holder's room is not its own). Queue a's share (2 of 8) is the lower, so its job is tried
    first; b's (4 of 8) after it."""
    snapshot = fleet(1)
    running = [
        start(snapshot, waiting("a-two", 2)),
        start(snapshot, waiting("b-four", 4, queue="b")),
    ]
    big = waiting("a-big", 8, at=1)  # queue a would hold 10 of its 8: it would borrow
    b_job = waiting("b-four-more", 4, queue="b", at=2)  # b would hold 8 of its 8: within
    first = admit(queues=TWO, running=running, waiting=[big], snapshot=snapshot, now=0)
    assert first.reservation is not None and first.reservation.job == "a-big"
    second = admit(
        queues=TWO,
        running=running,
        waiting=[big, b_job],
        snapshot=snapshot,
        now=5,
        reserved=first.reservation,
    )
    assert [h.job.name for h in second.waiting] == ["a-big", "b-four-more"]  # a first
    assert second.reservation is not None and second.reservation.job == "b-four-more"


def test_a_job_of_the_queue_with_the_lower_share_takes_a_carried_reservation() -> None:
    """Seen from the CLI, once the rule above was in: research's priority-60 job held the
    reservation (it was the first blocked job) when prod's 8-GPU job came; prod's share being
    the lower, its job is tried first in every pass, so the reservation is its own from then
    on, and research's priority-70 job, arriving later, waits behind it."""
    snapshot, queues, running = _research_fills_the_host()
    r6 = waiting("r6", 2, queue="research", priority=60, at=6)
    first = admit(queues=queues, running=running, waiting=[r6], snapshot=snapshot, now=6)
    assert first.reservation is not None and first.reservation.job == "r6"
    big = waiting("big", 8, queue="prod", priority=5, at=10)
    second = admit(
        queues=queues,
        running=running,
        waiting=[r6, big],
        snapshot=snapshot,
        now=10,
        reserved=first.reservation,
    )
    assert second.reservation is not None and second.reservation.job == "big"
    r7 = waiting("r7", 2, queue="research", priority=70, at=12)
    release_placement(snapshot, running[0].placement)
    third = admit(
        queues=queues,
        running=running[1:],
        waiting=[r6, big, r7],
        snapshot=snapshot,
        now=12,
        reserved=second.reservation,
    )
    assert names(third) == []
    assert third.reservation is not None and third.reservation.job == "big"
    assert reasons(third) == {
        "big": NO_CAPACITY,
        "r6": RESERVED_FOR + "big",
        "r7": RESERVED_FOR + "big",
    }


def test_a_job_its_queue_could_never_admit_reserves_nothing() -> None:
    """Found by the streams: a job asking 8 GPUs of a queue of quota 2 without cohort was held
    `no_capacity` while the host was busy, and reserved the host (taking the reservation from
    a job of its queue that could start): a reservation for a job that quota never admits
    holds the others back for nothing. It waits on quota, and reserves nothing."""
    snapshot = fleet(1)
    queues = [QueueSpec(name="a", gpus=16), QueueSpec(name="c", gpus=2)]
    busy = start(snapshot, waiting("busy", 8, queue="a"))
    never = waiting("never", 8, queue="c", priority=100, at=1)
    small = waiting("small", 2, queue="c", at=2)
    decision = admit(
        queues=queues, running=[busy], waiting=[never, small], snapshot=snapshot, now=5
    )
    assert reasons(decision) == {"never": QUOTA, "small": NO_CAPACITY}
    assert decision.reservation is not None and decision.reservation.job == "small"
