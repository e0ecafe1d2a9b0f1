"""Several blocked jobs hold reservations at once (gpuflow/scheduler/admission.py, as Slurm's
backfill plans a start for each blocked job): a job may not take the room of any of them, not
only of the first."""

from __future__ import annotations

from gpuflow.scheduler import release_placement
from gpuflow.scheduler.admission import MAX_RESERVATIONS, NO_CAPACITY, admit
from gpuflow.specs import QueueSpec
from tests.unit.scheduler.test_admission import HOUR, fleet, names, reasons, start, waiting

QUEUE = [QueueSpec(name="a", gpus=100)]


def test_the_second_blocked_job_holds_a_reservation_too() -> None:
    """Two 8-GPU jobs wait for two hosts that free up at different times; a 2-GPU job of a
    lower priority that fits now would take the room of the second (with one reservation, it
    was admitted and the second big job waited for it); one that ends in time backfills."""
    snapshot = fleet(2)
    first = start(snapshot, waiting("r0", 8, max_duration=HOUR))
    second = start(snapshot, waiting("r1", 4, max_duration=2 * HOUR))
    assert {first.placement.nodes[0].host_id, second.placement.nodes[0].host_id} == {
        "lab/gpu-0",
        "lab/gpu-1",
    }
    decision = admit(
        queues=QUEUE,
        running=[first, second],
        waiting=[
            waiting("big-0", 8, at=1, priority=100),
            waiting("big-1", 8, at=2, priority=100),
            waiting("small", 2, at=3, priority=50),
            waiting("short", 2, at=4, priority=50, max_duration=HOUR // 2),
        ],
        snapshot=snapshot,
        now=0,
    )
    assert names(decision) == ["short"]
    assert decision.admitted[0].backfill
    held = [(r.job, r.starts_at, r.hosts) for r in decision.reservations]
    on = {
        first.name: first.placement.nodes[0].host_id,
        second.name: second.placement.nodes[0].host_id,
    }
    assert held == [
        ("big-0", HOUR, frozenset({on["r0"]})),
        ("big-1", 2 * HOUR, frozenset({on["r1"]})),
    ]
    assert reasons(decision)["big-1"] == NO_CAPACITY
    assert reasons(decision)["small"].startswith("reserved_for:big-")


def test_reservations_hold_from_the_next_pass_in_their_order() -> None:
    snapshot = fleet(2)
    first = start(snapshot, waiting("r0", 8, max_duration=HOUR))
    second = start(snapshot, waiting("r1", 4, max_duration=2 * HOUR))
    big = [waiting("big-0", 8, at=1, priority=100), waiting("big-1", 8, at=2, priority=100)]
    low = waiting("low", 8, at=3)
    before = admit(
        queues=QUEUE, running=[first, second], waiting=[*big, low], snapshot=snapshot, now=0
    ).reservations
    assert [r.job for r in before] == ["big-0", "big-1"]
    # r0 ended: big-0 starts; small may not take big-1's room, from the start of the pass
    release_placement(snapshot, first.placement)
    decision = admit(
        queues=QUEUE,
        running=[second],
        waiting=[waiting("small", 2, at=0, priority=50), *big, low],
        snapshot=snapshot,
        now=HOUR,
        reserved=before,
    )
    assert names(decision) == ["big-0"]
    assert [(r.job, r.hosts) for r in decision.reservations] == [("big-1", before[1].hosts)]
    assert reasons(decision) == {
        "small": "reserved_for:big-1",
        "big-1": NO_CAPACITY,
        "low": NO_CAPACITY,
    }


def test_at_most_max_reservations_stand() -> None:
    snapshot = fleet(MAX_RESERVATIONS + 2)
    running = [
        start(snapshot, waiting(f"r{i}", 8, max_duration=(i + 1) * HOUR))
        for i in range(MAX_RESERVATIONS + 2)
    ]
    blocked = [waiting(f"big-{i}", 8, at=i, priority=100) for i in range(MAX_RESERVATIONS + 2)]
    low = waiting("low", 8, at=99)
    decision = admit(
        queues=QUEUE, running=running, waiting=[*blocked, low], snapshot=snapshot, now=0
    )
    assert [r.job for r in decision.reservations] == [f"big-{i}" for i in range(MAX_RESERVATIONS)]
    # each on a host of its own, the earliest free first
    assert [r.starts_at for r in decision.reservations] == [
        (i + 1) * HOUR for i in range(MAX_RESERVATIONS)
    ]


def test_a_job_with_no_lower_priority_behind_it_reserves_only_as_the_first() -> None:
    """The reservations after the first keep lower-priority jobs from delaying their jobs: a
    blocked job with none of a lower priority waiting in its queue has nothing to fear, and
    its search for a start is not worth a pass's time."""
    snapshot = fleet(2)
    running = [
        start(snapshot, waiting("r0", 8, max_duration=HOUR)),
        start(snapshot, waiting("r1", 8, max_duration=2 * HOUR)),
    ]
    same = [waiting(f"big-{i}", 8, at=i, priority=100) for i in range(2)]
    decision = admit(queues=QUEUE, running=running, waiting=same, snapshot=snapshot, now=0)
    assert [r.job for r in decision.reservations] == ["big-0"]
    lower = [*same, waiting("low", 1, at=5, priority=50)]
    decision = admit(queues=QUEUE, running=running, waiting=lower, snapshot=snapshot, now=0)
    assert [r.job for r in decision.reservations] == ["big-0", "big-1"]
