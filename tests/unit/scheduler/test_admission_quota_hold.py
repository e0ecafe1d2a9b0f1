"""A job held on its queue's quota holds the rest of its queue behind it (gpuflow/scheduler/
admission.py `_behind_quota_head`): a later job of the queue that needs the same quota waits
(`quota_held_for:<job>`), so the queue drains down to what the held job needs and it starts;
otherwise a stream of small jobs would take each GPU of quota as it frees and the big job would
never start. Jobs of other queues, and jobs that need other quota or none, go on."""

from __future__ import annotations

from gpuflow.scheduler import Snapshot, release_placement
from gpuflow.scheduler.admission import QUOTA, QUOTA_HELD_FOR, Running, Waiting, admit
from gpuflow.specs import QueueSpec
from tests.unit.scheduler.conftest import load_host, make_job, make_snapshot
from tests.unit.scheduler.test_admission import as_running, fleet, names, reasons, start, waiting

ALONE = [QueueSpec(name="a", gpus=8), QueueSpec(name="b", gpus=8)]


def _busy(snapshot: Snapshot, count: int) -> list[Running]:
    return [start(snapshot, waiting(f"run{k}", 1, at=-10 + k)) for k in range(count)]


def test_a_job_held_on_quota_holds_the_later_jobs_of_its_queue() -> None:
    snapshot = fleet(2)  # 16 GPUs: room for everything, quota is what holds
    running = _busy(snapshot, 4)
    cpu_only = Waiting("cpu", "a", make_job({"cpu": 1}, name="cpu"), 3)
    decision = admit(
        queues=ALONE,
        running=running,
        waiting=[
            waiting("big", 8, at=1),
            waiting("small", 1, at=2),
            cpu_only,
            waiting("other", 1, queue="b", at=4),
        ],
        snapshot=snapshot,
        now=0,
    )
    assert sorted(names(decision)) == ["cpu", "other"]
    assert reasons(decision) == {"big": QUOTA, "small": QUOTA_HELD_FOR + "big"}


def test_a_big_job_held_on_quota_starts_once_its_queue_drains() -> None:
    """Each pass one small job ends and a new one arrives: the big job starts when the four
    running before it have ended, not never."""
    snapshot = fleet(2)
    running = _busy(snapshot, 4)
    queue = [waiting("big", 8, at=1)]
    started_at = None
    for step in range(8):
        queue.append(waiting(f"new{step}", 1, at=10 + step))
        ended = running.pop(0)
        release_placement(snapshot, ended.placement)
        decision = admit(queues=ALONE, running=running, waiting=queue, snapshot=snapshot, now=step)
        for admitted in decision.admitted:
            running.append(as_running(admitted.job, admitted.placement, step))
        if "big" in names(decision):
            started_at = step
            break
        queue = [held.job for held in decision.waiting]
    assert started_at == 3  # the fourth pass: the last of the four ended


def test_a_job_of_other_quota_is_not_held() -> None:
    """Quota per model: a job held on H100 quota holds later H100 jobs of its queue, not one
    that takes an A100."""
    snapshot = make_snapshot(
        load_host("h100x8", name="h"),
        load_host("h100x8", name="h2"),
        load_host("a100x8-blocks", name="a"),
    )
    queues = [QueueSpec(name="a", gpus={"H100": 8, "A100": 8})]
    running = [
        start(snapshot, Waiting(f"run{k}", "a", make_job({"gpu": "H100:1"}, name=f"run{k}"), -1))
        for k in range(4)
    ]
    decision = admit(
        queues=queues,
        running=running,
        waiting=[
            Waiting("big", "a", make_job({"gpu": "H100:8"}, name="big"), 1),
            Waiting("later", "a", make_job({"gpu": "H100:1"}, name="later"), 2),
            Waiting("a100", "a", make_job({"gpu": "A100:1"}, name="a100"), 3),
        ],
        snapshot=snapshot,
        now=0,
    )
    assert names(decision) == ["a100"]
    assert reasons(decision) == {"big": QUOTA, "later": QUOTA_HELD_FOR + "big"}


def test_a_job_its_queue_could_never_admit_or_that_may_not_wait_holds_nothing() -> None:
    for head in (
        waiting("huge", 8, nodes=2, at=1),  # 16 GPUs: over the queue's 8 whatever runs
        Waiting("brief", "a", make_job({"gpu": 8}, name="brief"), 1, may_wait=False),
    ):
        snapshot = fleet(2)
        decision = admit(
            queues=ALONE,
            running=_busy(snapshot, 4),
            waiting=[head, waiting("small", 1, at=2)],
            snapshot=snapshot,
            now=0,
        )
        assert names(decision) == ["small"], head.name
        assert reasons(decision) == {head.name: QUOTA}


def test_a_job_that_must_borrow_holds_nothing() -> None:
    """A job bigger than its queue's own quota starts only when the cohort lends: holding its
    queue for it would idle the queue for as long as the others keep their quota."""
    snapshot = fleet(2)
    lab = [QueueSpec(name="a", gpus=4, cohort="lab"), QueueSpec(name="b", gpus=4, cohort="lab")]
    running = [start(snapshot, waiting(f"b{k}", 1, queue="b", at=-5 + k)) for k in range(4)]
    decision = admit(
        queues=lab,
        running=running,
        waiting=[waiting("big", 8, at=1), waiting("small", 1, at=2)],
        snapshot=snapshot,
        now=0,
    )
    assert names(decision) == ["small"]
    assert reasons(decision) == {"big": QUOTA}


def test_backfill_does_not_spend_the_quota_the_reserved_job_needs_at_its_start() -> None:
    """R (8 GPUs of queue a, quota 12) waits for b's job on gpu-1 and reserves it. A later
    2-GPU job of a fits on gpu-0, off the reserved host, and within a's quota now; but with it
    running, R would be over quota when b's job ends (4 + 2 + 8 > 12): it waits for R. A job of
    b goes on."""
    snapshot = fleet(2)
    queues = [QueueSpec(name="a", gpus=12), QueueSpec(name="b", gpus=16)]
    running = [
        start(snapshot, waiting("a-old", 4, at=-20), now=-10),
        start(snapshot, waiting("b-old", 6, queue="b", at=-20), now=-5),
    ]
    decision = admit(
        queues=queues,
        running=running,
        waiting=[
            waiting("reserved", 8, at=1),
            waiting("later", 2, at=2),
            waiting("other", 2, queue="b", at=3),
        ],
        snapshot=snapshot,
        now=0,
    )
    assert decision.reservation is not None and decision.reservation.job == "reserved"
    assert decision.reservation.waits_for == frozenset({"b-old"})
    assert names(decision) == ["other"]
    assert reasons(decision) == {"reserved": "no_capacity", "later": QUOTA_HELD_FOR + "reserved"}
