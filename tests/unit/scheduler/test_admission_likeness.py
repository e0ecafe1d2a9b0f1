"""A pass tries a job like one that failed since the pass last changed anything only once
(admission.py `_likeness`): the decisions are those of a pass that tries every job, and a long
queue of alike jobs costs one try."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any
from unittest import mock

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from gpuflow.scheduler import Placement, Snapshot, admission, place, release_placement
from gpuflow.scheduler.admission import Decision, Reservation, Running, Waiting, admit
from gpuflow.specs import QueueSpec
from tests.unit.scheduler.conftest import load_host, make_snapshot
from tests.unit.scheduler.test_admission import as_running, fleet, start, waiting
from tests.unit.scheduler.test_admission_streams import QUEUES, _queues

JOB = st.fixed_dictionaries(
    {
        "gpus": st.sampled_from([1, 4, 8]),
        "nodes": st.sampled_from([1, 1, 2]),
        "queue": st.sampled_from(["a", "b"]),
        "priority": st.sampled_from([0, 100]),
        "preemptible": st.booleans(),
        "max_duration": st.sampled_from([None, 600]),
    }
)
"""Few kinds, so that alike jobs wait side by side."""
STEP = st.tuples(st.lists(JOB, max_size=8), st.integers(0, 3))


def _seen(decision: Decision) -> tuple[Any, ...]:
    return (
        [(a.job.name, a.placement, a.victims, a.backfill) for a in decision.admitted],
        [(p.victim, p.for_job) for p in decision.preemptions],
        [(h.job.name, h.reason, h.position) for h in decision.waiting],
        decision.reservation,
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw_queues=QUEUES, steps=st.lists(STEP, min_size=1, max_size=6))
def test_skipping_alike_jobs_decides_as_trying_every_job(
    raw_queues: tuple[int, int, int, int | None, int | None],
    steps: list[tuple[list[dict[str, Any]], int]],
) -> None:
    queues = _queues(raw_queues)
    snapshots = {"skip": fleet(3), "every": fleet(3)}
    live: dict[str, Running] = {}
    pending: list[Waiting] = []
    reserved: Reservation | None = None
    count = 0
    skipped = 0
    for step, (jobs, ending) in enumerate(steps):
        now = step * 300.0
        for job in sorted(live.values(), key=lambda r: (r.started_at, r.name))[:ending]:
            del live[job.name]
            for snapshot in snapshots.values():
                release_placement(snapshot, job.placement)
        for raw in jobs:
            count += 1
            pending.append(waiting(f"j{count}", at=now, **raw))
        args: dict[str, Any] = {
            "queues": queues,
            "running": list(live.values()),
            "waiting": pending,
            "now": now,
            "reserved": reserved,
        }
        tries = _CountingPlace()
        with mock.patch.object(admission, "place", tries):
            skip = admit(snapshot=snapshots["skip"], **args)
        with mock.patch.object(admission._Pass, "_likeness", lambda self, job: None):
            every = admit(snapshot=snapshots["every"], **args)
        assert _seen(skip) == _seen(every)
        assert snapshots["skip"].hosts() == snapshots["every"].hosts()
        skipped += tries.skipped(skip)
        for admitted in skip.admitted:
            for victim in admitted.victims:
                del live[victim]
            live[admitted.job.name] = as_running(admitted.job, admitted.placement, now)
        reserved = skip.reservation
        pending = [held.job for held in skip.waiting]
    event("some alike job skipped" if skipped else "nothing skipped")


PLACE = admission.place


class _CountingPlace:
    """`place`, noting the jobs it was asked about."""

    def __init__(self) -> None:
        self.asked: set[str] = set()

    def __call__(self, job: Any, snapshot: Any, **kwargs: Any) -> Any:
        self.asked.add(job.name)
        return PLACE(job, snapshot, **kwargs)

    def skipped(self, decision: Decision) -> int:
        """Jobs left waiting that `place` was never asked about."""
        return sum(1 for held in decision.waiting if held.job.name not in self.asked)


def test_a_long_queue_of_alike_jobs_costs_one_try() -> None:
    snapshot = fleet(1)
    queue = [QueueSpec(name="a", gpus=1000)]
    blocker = start(snapshot, waiting("big", 8, preemptible=False))
    jobs = [waiting(f"w{i}", 4, at=float(i)) for i in range(50)]
    tries = _CountingPlace()
    with mock.patch.object(admission, "place", tries):
        decision = admit(queues=queue, running=[blocker], waiting=jobs, snapshot=snapshot, now=10.0)
    assert not decision.admitted
    assert [h.job.name for h in decision.waiting] == [f"w{i}" for i in range(50)]
    assert {h.reason for h in decision.waiting[1:]} == {h.reason for h in decision.waiting[:1]}
    # the first holds the reservation (its name counts), the second is tried, the rest skipped
    assert tries.asked == {"w0", "w1"}


def _both(
    hosts: int,
    running: list[Waiting],
    *,
    fleet_of: Callable[[], Snapshot] | None = None,
    **args: Any,
) -> Decision:
    """The pass with skipping, after checking that it decides as the pass that tries every
    job (each on its own fleet, of `hosts` 8x H100 hosts or made by `fleet_of`, with `running`
    started in order)."""
    decisions = []
    for likeness in (admission._Pass._likeness, lambda self, job: None):
        snapshot = fleet_of() if fleet_of is not None else fleet(hosts)
        live = [start(snapshot, job) for job in running]
        with mock.patch.object(admission._Pass, "_likeness", likeness):
            decisions.append(admit(snapshot=snapshot, running=live, now=100.0, **args))
    skip, every = decisions
    assert _seen(skip) == _seen(every)
    return skip


def test_a_job_that_ends_before_the_reserved_start_is_not_taken_for_one_that_does_not() -> None:
    # 4 GPUs held until 1000 s; the 8-GPU job reserves the host from then. Of two alike 4-GPU
    # jobs only the one declaring 600 s may use the free half meanwhile.
    held = waiting("held", 4, max_duration=1000)
    big = waiting("big", 8, priority=100, at=1)
    open_ended, bounded = waiting("x", 4, at=2), waiting("y", 4, at=3, max_duration=600)
    decision = _both(
        1, [held], queues=[QueueSpec(name="a", gpus=16)], waiting=[big, open_ended, bounded]
    )
    assert [(a.job.name, a.backfill) for a in decision.admitted] == [("y", True)]


def test_a_reservation_made_after_a_job_failed_changes_why_an_alike_job_waits() -> None:
    # x fails on its queue's quota ("a" is at it); the 8-GPU c of queue b then reserves the
    # host. The alike z, tried again because the reservation is new, waits behind x, which holds
    # its queue's quota (not for c's reservation: it would not start were that gone); b's alike
    # w is held for c's reservation.
    queues = [QueueSpec(name="a", gpus=4), QueueSpec(name="b", gpus=16)]
    x, z = waiting("x", 4, at=1), waiting("z", 4, at=3)
    c, w = waiting("c", 8, queue="b", at=2), waiting("w", 4, queue="b", at=4)
    decision = _both(1, [waiting("held", 4)], queues=queues, waiting=[x, c, z, w])
    reasons = {h.job.name: h.reason for h in decision.waiting}
    assert reasons == {
        "x": "quota",
        "c": "no_capacity",
        "z": "quota_held_for:x",
        "w": "reserved_for:c",
    }


def test_an_alike_job_of_another_queue_is_tried() -> None:
    # Both queues are within quota; only "b" runs a preemptible job of lower priority (x and y
    # may not wait, so x reserves nothing).
    queues = [QueueSpec(name="a", gpus=8), QueueSpec(name="b", gpus=8)]
    low = waiting("low", 8, queue="b", preemptible=True)
    x = replace(waiting("x", 8, queue="a", priority=100, at=1), may_wait=False)
    y = replace(waiting("y", 8, queue="b", priority=100, at=2), may_wait=False)
    decision = _both(1, [low], queues=queues, waiting=[x, y])
    assert [(a.job.name, a.victims) for a in decision.admitted] == [("y", ("low",))]


def test_an_alike_job_ahead_of_the_holder_takes_its_room() -> None:
    # h reserved the host in the pass before; x, alike and submitted earlier (a job requeued
    # after a preemption keeps its submission time), comes back now: x is ahead of h in their
    # queue, so it takes the room, and h, tried after it, waits.
    queue = [QueueSpec(name="a", gpus=16)]
    h, x = waiting("h", 8, at=5), waiting("x", 8, at=1)
    host = next(iter(fleet(1).hosts())).id
    before = Reservation("h", None, frozenset({host}))
    decision = _both(1, [], queues=queue, waiting=[x, h], reserved=before)
    assert [a.job.name for a in decision.admitted] == ["x"]
    assert [(h.job.name, h.reason) for h in decision.waiting] == [("h", "no_capacity")]


def test_a_job_that_may_wait_reserves_after_an_alike_one_that_may_not() -> None:
    queue = [QueueSpec(name="a", gpus=16)]
    x = replace(waiting("x", 8, at=1), may_wait=False)
    decision = _both(1, [waiting("held", 4)], queues=queue, waiting=[x, waiting("y", 8, at=2)])
    assert decision.reservation is not None and decision.reservation.job == "y"


def test_jobs_placed_by_the_random_scorer_are_each_tried() -> None:
    # The random scorer orders hosts by the job's name: of two alike 1-GPU jobs, one lands on
    # the A100 host, which a quota of H100s only does not admit, and the other on the H100.
    # Each is tried: the first is placed again on the model its quota covers, not refused
    # because an alike job's try failed.
    def two_models() -> Snapshot:
        hosts = (load_host("a100x8-blocks", name="a"), load_host("h100x8", name="h"))
        return make_snapshot(*hosts, scorer="random")

    def model(name: str) -> str:
        found = place(waiting(name, 1).job, two_models())
        assert isinstance(found, Placement)
        return found.nodes[0].gpu_names[0]

    names = [f"j{i}" for i in range(40)]
    on_a100 = next(n for n in names if model(n) == "A100")
    on_h100 = next(n for n in names if model(n) == "H100")
    queue = [QueueSpec(name="a", gpus={"H100": 8})]
    jobs = [waiting(on_a100, 1, at=1), waiting(on_h100, 1, at=2)]
    decision = _both(0, [], queues=queue, waiting=jobs, fleet_of=two_models)
    assert [a.job.name for a in decision.admitted] == [on_a100, on_h100]
    assert {a.placement.nodes[0].gpu_names[0] for a in decision.admitted} == {"H100"}
    assert decision.waiting == []
