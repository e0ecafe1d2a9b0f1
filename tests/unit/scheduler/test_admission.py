"""Admission passes (gpuflow/scheduler/admission.py) in readable scenarios: the order of queues
and jobs, quota and borrowing, backfill beside a reservation, preemption. Streams of jobs from
hypothesis check the same rules in test_admission_streams.py."""

from __future__ import annotations

from typing import Any

import pytest

from gpuflow.scheduler import Placement, Snapshot, place, release_placement
from gpuflow.scheduler.admission import NO_CAPACITY, QUOTA, Decision, Running, Waiting, admit
from gpuflow.scheduler.quota import never_admitted
from gpuflow.specs import QueueSpec
from tests.unit.scheduler.conftest import load_host, make_job, make_snapshot

HOUR = 3600


def fleet(hosts: int = 2) -> Snapshot:
    """`hosts` 8x H100 hosts."""
    return make_snapshot(*(load_host("h100x8", name=f"gpu-{i}") for i in range(hosts)))


def waiting(
    name: str,
    gpus: int,
    *,
    queue: str = "a",
    priority: int = 0,
    at: float = 0,
    nodes: int = 1,
    preemptible: bool = False,
    max_duration: int | None = None,
) -> Waiting:
    job = make_job({"gpu": gpus}, name=name, nodes=nodes, max_duration=max_duration)
    return Waiting(name, queue, job, at, priority, preemptible)


def start(snapshot: Snapshot, job: Waiting, now: float = 0) -> Running:
    """Place and apply a job by hand, as if an earlier pass had admitted it."""
    decision = admit(
        queues=[QueueSpec(name=job.queue, gpus=1000)],
        running=[],
        waiting=[job],
        snapshot=snapshot,
        now=now,
    )
    (admitted,) = decision.admitted
    return as_running(job, admitted.placement, now)


def as_running(job: Waiting, placement: Placement, now: float) -> Running:
    """The job running from `now` on, until its max_duration if it has one."""
    duration = job.job.max_duration
    return Running(
        job.name,
        job.queue,
        placement,
        job.priority,
        job.preemptible,
        now,
        None if duration is None else now + duration,
    )


def names(decision: Decision) -> list[str]:
    return [a.job.name for a in decision.admitted]


def reasons(decision: Decision) -> dict[str, str]:
    return {held.job.name: held.reason for held in decision.waiting}


TWO = [QueueSpec(name="a", gpus=8, cohort="lab"), QueueSpec(name="b", gpus=8, cohort="lab")]


def test_the_queue_with_the_lowest_share_goes_first() -> None:
    snapshot = fleet(2)
    busy = start(snapshot, waiting("a-old", 6, queue="a"))
    decision = admit(
        queues=TWO,
        running=[busy],
        waiting=[waiting("a-new", 8, queue="a", at=1), waiting("b-new", 8, queue="b", at=2)],
        snapshot=snapshot,
        now=10,
    )
    assert names(decision) == ["b-new"]
    assert reasons(decision) == {"a-new": NO_CAPACITY}


def test_higher_priority_first_then_submission_time() -> None:
    decision = admit(
        queues=[QueueSpec(name="a", gpus=16)],
        running=[],
        waiting=[
            waiting("early", 8, at=1),
            waiting("urgent", 8, at=3, priority=100),
            waiting("late", 8, at=2),
        ],
        snapshot=fleet(2),
        now=10,
    )
    assert names(decision) == ["urgent", "early"]
    assert [(h.job.name, h.reason, h.position) for h in decision.waiting] == [
        ("late", NO_CAPACITY, 0)
    ]


def test_a_queue_without_cohort_stops_at_its_quota() -> None:
    decision = admit(
        queues=[QueueSpec(name="a", gpus=4)],
        running=[],
        waiting=[waiting("one", 4, at=1), waiting("two", 1, at=2)],
        snapshot=fleet(1),
        now=0,
    )
    assert names(decision) == ["one"]
    assert reasons(decision) == {"two": QUOTA}


def test_a_queue_borrows_idle_quota_of_its_cohort_within_its_limit() -> None:
    queues = [
        QueueSpec(name="a", gpus=8, cohort="lab", borrowing_limit=4),
        QueueSpec(name="b", gpus=8, cohort="lab"),
    ]
    decision = admit(
        queues=queues,
        running=[],
        waiting=[waiting("big", 8, at=1), waiting("more", 4, at=2), waiting("too-much", 1, at=3)],
        snapshot=fleet(2),
        now=0,
    )
    assert names(decision) == ["big", "more"]
    assert reasons(decision) == {"too-much": QUOTA}


def test_a_lender_lends_no_more_than_its_lending_limit() -> None:
    queues = [
        QueueSpec(name="a", gpus=8, cohort="lab"),
        QueueSpec(name="b", gpus=8, cohort="lab", lending_limit=2),
    ]
    decision = admit(
        queues=queues,
        running=[],
        waiting=[waiting("own", 8, at=1), waiting("lent", 2, at=2), waiting("more", 1, at=3)],
        snapshot=fleet(2),
        now=0,
    )
    assert names(decision) == ["own", "lent"]
    assert reasons(decision) == {"more": QUOTA}


def test_a_job_of_an_unknown_queue_is_a_caller_error() -> None:
    with pytest.raises(ValueError, match="no queue named x; known: a"):
        admit(
            queues=[QueueSpec(name="a", gpus=1)],
            running=[],
            waiting=[waiting("lost", 1, queue="x")],
            snapshot=fleet(1),
            now=0,
        )


def test_a_small_job_backfills_only_if_it_ends_before_the_reservation() -> None:
    snapshot = fleet(1)
    ends = start(snapshot, waiting("running", 4, max_duration=HOUR))
    decision = admit(
        queues=[QueueSpec(name="a", gpus=100)],
        running=[ends],
        waiting=[
            waiting("whole-host", 8, at=1, priority=50),
            waiting("long", 2, at=2, max_duration=2 * HOUR),
            waiting("unbounded", 2, at=3),
            waiting("short", 2, at=4, max_duration=HOUR // 2),
        ],
        snapshot=snapshot,
        now=0,
    )
    assert names(decision) == ["short"]
    assert decision.admitted[0].backfill
    assert decision.reservation is not None
    assert decision.reservation.job == "whole-host"
    assert decision.reservation.starts_at == HOUR
    assert reasons(decision) == {
        "whole-host": NO_CAPACITY,
        "long": "reserved_for:whole-host",
        "unbounded": "reserved_for:whole-host",
    }


def test_a_job_that_may_not_wait_reserves_nothing() -> None:
    """It is refused by this pass: a reservation for it would hold the others back."""
    snapshot = fleet(1)
    ends = start(snapshot, waiting("running", 4, max_duration=HOUR))
    whole = waiting("whole-host", 8, at=1, priority=50)
    decision = admit(
        queues=[QueueSpec(name="a", gpus=100)],
        running=[ends],
        waiting=[
            Waiting(whole.name, whole.queue, whole.job, 1, 50, may_wait=False),
            waiting("unbounded", 2, at=3),
        ],
        snapshot=snapshot,
        now=0,
    )
    assert names(decision) == ["unbounded"]
    assert decision.reservation is None
    assert reasons(decision) == {"whole-host": NO_CAPACITY}


def test_a_reservation_holds_from_the_start_of_the_next_pass() -> None:
    snapshot = fleet(2)
    elsewhere = start(snapshot, waiting("a-steady", 8))
    ending = start(snapshot, waiting("a-ending", 4))
    big = waiting("a-big", 8, at=1)
    # a-big stays within a's nominal quota once a-ending is gone (for one that would borrow,
    # test_admission_fairness.py)
    queues = [QueueSpec(name="a", gpus=16, cohort="lab"), QueueSpec(name="b", gpus=8, cohort="lab")]
    first = admit(
        queues=queues, running=[elsewhere, ending], waiting=[big], snapshot=snapshot, now=0
    )
    assert first.reservation is not None
    release_placement(snapshot, ending.placement)
    # queue b's share is lower, so its job is tried first; the room is a-big's all the same
    second = admit(
        queues=queues,
        running=[elsewhere],
        waiting=[big, waiting("b-small", 2, queue="b", at=2)],
        snapshot=snapshot,
        now=10,
        reserved=first.reservation,
    )
    assert names(second) == ["a-big"]
    assert reasons(second) == {"b-small": NO_CAPACITY}


def test_a_higher_priority_job_preempts_the_smallest_preemptible_job_of_its_queue() -> None:
    snapshot = fleet(1)
    held = [
        start(snapshot, waiting("keep", 4)),
        start(snapshot, waiting("small", 2, preemptible=True)),
        start(snapshot, waiting("large", 2, preemptible=True), now=5),
    ]
    decision = admit(
        queues=[QueueSpec(name="a", gpus=100)],
        running=held,
        waiting=[waiting("urgent", 2, priority=100, at=10)],
        snapshot=snapshot,
        now=10,
    )
    assert names(decision) == ["urgent"]
    # equal sizes and priorities: the most recently started goes
    assert [(p.victim, p.for_job) for p in decision.preemptions] == [("large", "urgent")]


def test_a_non_preemptible_job_is_never_preempted() -> None:
    snapshot = fleet(1)
    held = [start(snapshot, waiting("steady", 8))]
    decision = admit(
        queues=[QueueSpec(name="a", gpus=100)],
        running=held,
        waiting=[waiting("urgent", 1, priority=100)],
        snapshot=snapshot,
        now=0,
    )
    assert decision.preemptions == []
    assert reasons(decision) == {"urgent": NO_CAPACITY}


def test_a_queue_reclaims_its_nominal_quota_from_a_borrower() -> None:
    snapshot = fleet(2)
    borrower = [
        start(snapshot, waiting(f"b-{i}", 4, queue="b", preemptible=True, priority=100))
        for i in range(4)
    ]
    decision = admit(
        queues=TWO,
        running=borrower,
        waiting=[waiting("a-own", 4, queue="a")],
        snapshot=snapshot,
        now=0,
    )
    assert names(decision) == ["a-own"]
    assert len(decision.preemptions) == 1
    assert decision.preemptions[0].victim.startswith("b-")


def test_a_requeued_job_goes_before_a_later_holder_of_the_reservation() -> None:
    """Jobs preempted and requeued keep their submission time, so they come back ahead of a
    job of their queue that reserved meanwhile: they take its room and the reservation, and
    it waits for its turn behind them."""
    snapshot = fleet(1)
    busy = start(snapshot, waiting("busy", 8, priority=100))
    late = waiting("late", 4, at=3)
    queues = [QueueSpec(name="a", gpus=100)]
    first = admit(queues=queues, running=[busy], waiting=[late], snapshot=snapshot, now=0)
    assert first.reservation is not None and first.reservation.job == "late"
    release_placement(snapshot, busy.placement)
    second = admit(
        queues=queues,
        running=[],
        waiting=[late, waiting("early-1", 4, at=1), waiting("early-2", 4, at=2)],
        snapshot=snapshot,
        now=10,
        reserved=first.reservation,
    )
    assert names(second) == ["early-1", "early-2"]
    assert reasons(second) == {"late": NO_CAPACITY}
    assert second.reservation is not None and second.reservation.job == "late"


def test_a_blocked_job_ahead_in_its_queue_takes_the_reservation_over() -> None:
    snapshot = fleet(1)
    busy = start(snapshot, waiting("busy", 6, priority=100))
    queues = [QueueSpec(name="a", gpus=100)]
    first = admit(
        queues=queues, running=[busy], waiting=[waiting("late", 4, at=3)], snapshot=snapshot, now=0
    )
    assert first.reservation is not None and first.reservation.job == "late"
    second = admit(
        queues=queues,
        running=[busy],
        waiting=[waiting("late", 4, at=3), waiting("early", 8, at=1)],
        snapshot=snapshot,
        now=10,
        reserved=first.reservation,
    )
    assert names(second) == []
    assert second.reservation is not None and second.reservation.job == "early"
    assert reasons(second) == {"early": NO_CAPACITY, "late": NO_CAPACITY}


def test_a_job_of_several_models_goes_to_the_one_its_quota_covers() -> None:
    """The best host is of a model the queue has no quota for; the job accepts another, which
    it has: admitted there (as Kueue tries a workload's flavors in order), not held `quota`.
    The same for a job of any model."""

    def two_models() -> Snapshot:
        return make_snapshot(load_host("a100x8-blocks", name="a"), load_host("h100x8", name="h"))

    either = make_job({"gpu": "A100,H100:1"}, name="either")
    found = place(either, two_models())
    assert isinstance(found, Placement)
    other = "A100" if found.nodes[0].gpu_names[0] == "H100" else "H100"
    for job in (either, make_job({"gpu": 1}, name="any")):
        decision = admit(
            queues=[QueueSpec(name="a", gpus={other: 4})],
            running=[],
            waiting=[Waiting(job.name, "a", job, 0)],
            snapshot=two_models(),
            now=0,
        )
        assert names(decision) == [job.name]
        assert decision.admitted[0].placement.nodes[0].gpu_names == [other]


def test_a_job_of_a_model_without_quota_waits_on_quota() -> None:
    decision = admit(
        queues=[QueueSpec(name="a", gpus={"A100": 4})],
        running=[],
        waiting=[Waiting("h", "a", make_job({"gpu": "H100:1"}, name="h"), 0)],
        snapshot=fleet(1),
        now=0,
    )
    assert names(decision) == [] and reasons(decision) == {"h": QUOTA}


def test_a_queue_that_could_never_admit_a_job_says_so() -> None:
    lab = [
        QueueSpec(name="research", gpus={"A100": 8}, cohort="lab", borrowing_limit=4),
        QueueSpec(name="prod", gpus={"A100": 8}, cohort="lab"),
    ]

    def never(resources: Any, **fields: Any) -> str | None:
        return never_admitted(lab, "research", make_job(resources, **fields))

    assert never({"gpu": "A100:8"}) is None
    assert never({"gpu": "A100:4"}, nodes=3) is None  # 12: 8 of its own, 4 borrowed
    assert never({"gpu": "A100:8"}, nodes=2) == (
        "queue research can never admit it: it asks 16 GPU(s) of A100, more than its quota "
        "(A100:8) and cohort lab's lending allows"
    )
    assert never({"gpu": "L4:1"}) is not None
    assert never({"gpu": "L4,A100:1"}) is None
    assert never({"gpu": 1}) is None
    assert never({"gpu": "L4:1"}, alternatives=[{"gpu": "A100:1"}]) is None
    assert never({"cpu": 2}) is None
    alone = [QueueSpec(name="tiny", gpus=2)]
    assert never_admitted(alone, "tiny", make_job({"gpu": "H100:2"})) is None
    assert never_admitted(alone, "tiny", make_job({"gpu": 3})) is not None
