"""Admission passes (gpuflow/scheduler/admission.py): readable scenarios first, then streams of
jobs from hypothesis that check the order, quota, reservation and preemption rules."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from gpuflow.scheduler import (
    Placement,
    Snapshot,
    apply_placement,
    place,
    release_placement,
    resolve,
)
from gpuflow.scheduler.admission import (
    NO_CAPACITY,
    QUOTA,
    Admitted,
    Decision,
    Reservation,
    Running,
    Waiting,
    admit,
)
from gpuflow.scheduler.quota import gpu_count
from gpuflow.scheduler.reservation import earliest_start, hidden
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
    duration = job.job.max_duration
    return Running(
        job.name,
        job.queue,
        admitted.placement,
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


# ---- streams ------------------------------------------------------------------------------

PRIORITIES = st.sampled_from([0, 50, 100])
JOB = st.fixed_dictionaries(
    {
        "gpus": st.sampled_from([1, 2, 4, 8]),
        "nodes": st.sampled_from([1, 1, 1, 2]),
        "queue": st.sampled_from(["a", "b", "c"]),
        "priority": PRIORITIES,
        "preemptible": st.booleans(),
        "max_duration": st.sampled_from([None, 600, 3600]),
    }
)
STEP = st.tuples(st.lists(JOB, max_size=6), st.integers(0, 3))
"""New jobs, and how many of the oldest running jobs end before the pass."""
QUEUES = st.tuples(
    st.integers(0, 16),
    st.integers(0, 16),
    st.integers(0, 16),
    st.sampled_from([None, 0, 4]),
    st.sampled_from([None, 0, 4]),
)


def _queues(raw: tuple[int, int, int, int | None, int | None]) -> list[QueueSpec]:
    a, b, c, borrow, lend = raw
    return [
        QueueSpec(name="a", gpus=a, cohort="lab", borrowing_limit=borrow),
        QueueSpec(
            name="b", gpus=b, cohort="lab", lending_limit=None if lend is None else min(lend, b)
        ),
        QueueSpec(name="c", gpus=c),
    ]


def _usage(running: dict[str, Running]) -> dict[str, float]:
    usage = {"a": 0.0, "b": 0.0, "c": 0.0}
    for job in running.values():
        usage[job.queue] += gpu_count(job.placement)
    return usage


def _quota_ok(queues: list[QueueSpec], usage: dict[str, float], queue: str) -> bool:
    """The test's own arithmetic: within nominal, or borrowing within the limits."""
    spec = {q.name: q for q in queues}
    own = spec[queue]
    nominal = own.quota["*"]
    if usage[queue] <= nominal + 1e-9:
        return True
    if own.cohort is None:
        return False
    if own.borrowing_limit is not None and usage[queue] - nominal > own.borrowing_limit + 1e-9:
        return False
    members = [q for q in queues if q.cohort == own.cohort]
    borrowed = sum(max(0.0, usage[q.name] - q.quota["*"]) for q in members)
    lent = 0.0
    for q in members:
        idle = max(0.0, q.quota["*"] - usage[q.name])
        lent += idle if q.lending_limit is None else min(idle, q.lending_limit)
    return borrowed <= lent + 1e-9


def _check(
    queues: list[QueueSpec],
    before: dict[str, Running],
    decision: Decision,
    snapshot: Snapshot,
    now: float,
) -> dict[str, Running]:
    live = dict(before)
    usage_at: dict[str, dict[str, float]] = {}
    """Each admitted job: the queues' usage when it was admitted (its victims gone)."""
    for admitted in decision.admitted:
        for victim in admitted.victims:
            assert live[victim].preemptible, f"{victim} was not preemptible"
            lost = live.pop(victim)
            job = admitted.job
            same = lost.queue == job.queue and lost.priority < job.priority
            assert same or lost.queue != job.queue
        duration = admitted.job.job.max_duration
        job = admitted.job
        usage_at[job.name] = _usage(live)
        live[job.name] = Running(
            job.name,
            job.queue,
            admitted.placement,
            job.priority,
            job.preemptible,
            now,
            None if duration is None else now + duration,
        )
        assert _quota_ok(queues, _usage(live), job.queue), f"{job.name} broke its quota"
    usage = _usage(live)
    for held in decision.waiting:
        if held.reason not in (NO_CAPACITY, QUOTA):
            continue
        for admitted in decision.admitted:
            if admitted.job.queue != held.job.queue or admitted.job.priority >= held.job.priority:
                continue
            found = place(held.job.job, snapshot)
            if isinstance(found, Placement):
                usage_with = dict(usage)
                usage_with[held.job.queue] += gpu_count(found)
                assert not _quota_ok(queues, usage_with, held.job.queue), (
                    f"{admitted.job.name} admitted while {held.job.name} (higher) fits"
                )
    _check_reservation(queues, decision, snapshot, live, usage_at, now)
    return live


def _check_reservation(
    queues: list[QueueSpec],
    decision: Decision,
    snapshot: Snapshot,
    live: dict[str, Running],
    usage_at: dict[str, dict[str, float]],
    now: float,
) -> None:
    """The jobs admitted beside the reserved job leave it its room on its hosts (it fits there
    once the jobs it waits for are gone) and do not delay its start, unless one of them ranks
    above it: a higher priority of its queue, or a job of another queue that stayed within its
    nominal quota while the reserved job would borrow."""
    reservation = decision.reservation
    if reservation is None:
        return
    holder = next(h.job for h in decision.waiting if h.job.name == reservation.job)
    nominal = {q.name: q.quota["*"] for q in queues}
    request = resolve(holder.job)
    wanted = request.nodes * request.gpu_min

    def outranks(admitted: Admitted) -> bool:
        job, usage = admitted.job, usage_at[admitted.job.name]
        if job.queue == holder.queue:
            return job.priority > holder.priority
        within = usage[job.queue] + gpu_count(admitted.placement) <= nominal[job.queue] + 1e-9
        return within and usage[holder.queue] + wanted > nominal[holder.queue] + 1e-9

    if any(a.backfill and outranks(a) for a in decision.admitted):
        return
    start = reservation.starts_at
    gone = [  # what it waits for, and what ends before its known start
        job.placement
        for job in live.values()
        if job.name in reservation.waits_for
        or (start is not None and job.ends_at is not None and job.ends_at <= start)
    ]
    with hidden(snapshot, frozenset(h.id for h in snapshot.hosts()) - reservation.hosts):
        for placement in gone:
            release_placement(snapshot, placement)
        try:
            room = place(holder.job, snapshot)
        finally:
            for placement in gone:
                apply_placement(snapshot, placement)
    assert isinstance(room, Placement), "a backfilled job took the reserved job's room"
    if start is not None:
        recomputed = earliest_start(holder.job, snapshot, list(live.values()), now)
        assert recomputed is not None
        assert recomputed.starts_at is not None
        delayed = "a backfilled job delayed the reservation"
        assert recomputed.starts_at <= start, delayed


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw_queues=QUEUES, steps=st.lists(STEP, min_size=1, max_size=6))
def test_streams_keep_order_quota_reservation_and_preemption_rules(
    raw_queues: tuple[int, int, int, int | None, int | None],
    steps: list[tuple[list[dict[str, Any]], int]],
) -> None:
    queues = _queues(raw_queues)
    snapshot = fleet(3)
    live: dict[str, Running] = {}
    pending: list[Waiting] = []
    count = 0
    seen: set[str] = set()
    reserved: Reservation | None = None
    for step, (jobs, ending) in enumerate(steps):
        now = step * 300.0
        for job in sorted(live.values(), key=lambda r: (r.started_at, r.name))[:ending]:
            del live[job.name]
            release_placement(snapshot, job.placement)
        for raw in jobs:
            count += 1
            pending.append(waiting(f"j{count}", at=now, **raw))
        decision = admit(
            queues=queues,
            running=list(live.values()),
            waiting=pending,
            snapshot=snapshot,
            now=now,
            reserved=reserved,
        )
        reserved = decision.reservation
        live = _check(queues, live, decision, snapshot, now)
        pending = [held.job for held in decision.waiting]
        assert [h.position for h in decision.waiting] == list(range(len(pending)))
        seen.update(_kinds(decision))
    event(", ".join(sorted(seen)) or "plain")


def _kinds(decision: Decision) -> set[str]:
    kinds = {"preemption"} if decision.preemptions else set()
    if decision.reservation is not None:
        kinds.add("reservation")
    if any(a.backfill for a in decision.admitted):
        kinds.add("backfill")
    if any(h.reason == QUOTA for h in decision.waiting):
        kinds.add("quota")
    return kinds
