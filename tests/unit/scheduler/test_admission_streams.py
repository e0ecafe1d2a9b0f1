"""Admission passes (gpuflow/scheduler/admission.py) on streams of jobs from hypothesis: every
pass keeps the order, quota, reservation and preemption rules, checked by the test's own
arithmetic (the readable scenarios are in test_admission.py)."""

from __future__ import annotations

from typing import Any

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
    Held,
    Reservation,
    Running,
    Waiting,
    admit,
)
from gpuflow.scheduler.admission_jobs import queue_order
from gpuflow.scheduler.quota import gpu_count, never_admitted
from gpuflow.scheduler.reservation import earliest_start, hidden
from gpuflow.specs import QueueSpec
from tests.unit.scheduler.test_admission import as_running, fleet, waiting

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
            lost, job = live[victim], admitted.job
            same = lost.queue == job.queue and lost.priority < job.priority
            assert same or lost.queue != job.queue
            if lost.queue != job.queue:  # reclaim takes only what the queue borrows
                nominal = next(q.quota["*"] for q in queues if q.name == lost.queue)
                assert _usage(live)[lost.queue] > nominal + 1e-9, f"{victim}: its queue's own"
            del live[victim]
        job = admitted.job
        usage_at[job.name] = _usage(live)
        live[job.name] = as_running(job, admitted.placement, now)
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


def _check_quota_hold(
    queues: list[QueueSpec], decision: Decision, quota_held: set[str], carried: str | None
) -> set[str]:
    """A job held on quota that may wait and that its queue's own quota could serve is not
    passed by a later job of its queue (every job here asks GPUs of a total quota). Checked for
    a job held on quota by the pass before too, so that its first try in this pass ends on
    quota: a pass that looks at its jobs again (quota freed by a preemption, or room by the
    reserved job's start) may try it again after a later job took the quota (that job did not
    pass it then). The jobs held on quota now."""
    looked_again = any(a.victims or a.job.name == carried for a in decision.admitted)
    held_now = set()
    for held in decision.waiting:
        job = held.job
        if held.reason != QUOTA or not job.may_wait:
            continue
        if never_admitted(queues, job.queue, job.job) is not None:
            continue
        nominal = next(q.quota["*"] for q in queues if q.name == job.queue)
        asks = job.job.nodes * (job.job.resources.gpu.count.min if job.job.resources.gpu else 0)
        if asks > nominal:
            continue  # it must borrow: it waits best effort, holding nothing
        held_now.add(job.name)
        if job.name not in quota_held or looked_again:
            continue
        for admitted in decision.admitted:
            later = queue_order(admitted.job) > queue_order(job)
            if admitted.job.queue == job.queue and later and not admitted.job.claims:
                raise AssertionError(f"{admitted.job.name} passed {job.name}, held on quota")
    return held_now


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
    above it: a job ahead of it in its queue's order (a higher priority, or the same and
    submitted earlier: a requeued job), or a job of another queue that stayed within its
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
        if job.queue == holder.queue:  # ahead of it in the queue's order (a requeued job)
            ahead = (-job.priority, job.submitted_at, job.name)
            return ahead < (-holder.priority, holder.submitted_at, holder.name)
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
    quota_held: set[str] = set()
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
        _check_committable(decision, live)
        _check_kept(queues, reserved, decision, live)
        carried = reserved.job if reserved is not None else None
        quota_held = _check_quota_hold(queues, decision, quota_held, carried)
        reserved = decision.reservation
        live = _check(queues, live, decision, snapshot, now)
        pending = [held.job for held in decision.waiting]
        assert [h.position for h in decision.waiting] == list(range(len(pending)))
        seen.update(_kinds(decision))
    event(", ".join(sorted(seen)) or "plain")


def _check_committable(decision: Decision, live: dict[str, Running]) -> None:
    """What the product commits of a pass holds together with what the database holds: the
    jobs admitted without victims take their allocations at once, while the victims of the
    pass's preemptions keep theirs until they have stopped (their preemptors wait for it)."""
    database = fleet(3)
    for job in live.values():
        apply_placement(database, job.placement)
    for admitted in decision.admitted:
        if not admitted.victims:
            apply_placement(database, admitted.placement)  # ValueError: held twice


def _check_kept(
    queues: list[QueueSpec],
    carried: Reservation | None,
    decision: Decision,
    live: dict[str, Running],
) -> None:
    """A reservation carried from the pass before goes to a job of another queue only if that
    job came before its holder in this pass's order (its queue's share the lower), or if the
    holder would borrow (priorities do not count across queues)."""
    now_held = decision.reservation
    if carried is None or now_held is None or now_held.job == carried.job:
        return
    places = {h.job.name: h for h in decision.waiting}
    holder, taker = places.get(carried.job), places.get(now_held.job)
    if holder is None or taker is None or holder.job.queue == taker.job.queue:
        return
    nominal = {q.name: q.quota["*"] for q in queues}
    # Whether the holder, or a job of its queue that took it over first (ahead of it there),
    # would borrow when the taker was tried (one held on quota now may have been the holder):
    # the queue's usage then lies between the pass's start and its end (admissions add to it,
    # preemptions take from it).
    after = dict(live)
    for admitted in decision.admitted:
        for victim in admitted.victims:
            after.pop(victim, None)
        after[admitted.job.name] = Running(
            admitted.job.name, admitted.job.queue, admitted.placement
        )
    queue = holder.job.queue

    def would_borrow(held: Held) -> bool:
        request = resolve(held.job.job)
        wanted = request.nodes * request.gpu_min
        return any(u[queue] + wanted > nominal[queue] + 1e-9 for u in (_usage(live), _usage(after)))

    rivals = [
        h for h in decision.waiting if h.job.queue == queue and h.reason in (NO_CAPACITY, QUOTA)
    ]
    borrows = any(would_borrow(h) for h in rivals)
    assert taker.position < holder.position or borrows, (
        f"{taker.job.name} (queue {taker.job.queue}, priority {taker.job.priority}) took the "
        f"reservation of {holder.job.name} (queue {holder.job.queue}) though tried after it"
    )


def _kinds(decision: Decision) -> set[str]:
    kinds = {"preemption"} if decision.preemptions else set()
    if decision.reservation is not None:
        kinds.add("reservation")
    if any(a.backfill for a in decision.admitted):
        kinds.add("backfill")
    if any(h.reason == QUOTA for h in decision.waiting):
        kinds.add("quota")
    return kinds
