"""Preemption across passes (gpuflow/scheduler/admission.py): what reclaiming quota may take from
a lender, and who gets the room once the victims have released it."""

from __future__ import annotations

from dataclasses import replace

from gpuflow.scheduler.admission import NO_CAPACITY, Decision, Waiting, admit
from gpuflow.specs import QueueSpec
from tests.unit.scheduler.test_admission import fleet, names, reasons, start, waiting


def test_reclaiming_quota_never_takes_a_queue_below_its_own_nominal_quota() -> None:
    """b holds 8 GPUs with a nominal quota of 4 (it borrows 4, say after its quota was cut).
    a's job needs all 8 GPUs of the one host: only b's borrowed 4 may be taken back, which does
    not make room, so nothing is preempted (stopping both would take b's own quota)."""
    snapshot = fleet(1)
    queues = [QueueSpec(name="a", gpus=8, cohort="lab"), QueueSpec(name="b", gpus=4, cohort="lab")]
    held = [
        start(snapshot, waiting(f"b-{i}", 4, queue="b", preemptible=True), now=i) for i in range(2)
    ]
    decision = admit(
        queues=queues,
        running=held,
        waiting=[waiting("a-big", 8, queue="a", priority=100, at=5)],
        snapshot=snapshot,
        now=10,
    )
    assert decision.preemptions == []
    assert reasons(decision) == {"a-big": NO_CAPACITY}
    # When taking back what b borrows is enough, that is all it takes.
    decision = admit(
        queues=queues,
        running=held,
        waiting=[waiting("a-half", 4, queue="a", at=5)],
        snapshot=snapshot,
        now=10,
    )
    assert names(decision) == ["a-half"]
    assert [p.victim for p in decision.preemptions] == ["b-1"]  # the most recently started


def test_the_room_freed_for_a_preemptor_is_its_own_before_a_carried_reservation() -> None:
    """`urgent` (queue b) preempts `victim`, its queue's own low-priority job. While the victim
    stops, `big` (queue a, the lower share, a higher priority) reserves the host. Once the victim
    has released, the room goes to `urgent`, for which the victim was stopped, not to the
    reservation (priorities order jobs within a queue, not across)."""
    snapshot = fleet(1)
    queues = [QueueSpec(name="a", gpus=8), QueueSpec(name="b", gpus=8)]
    victim = start(snapshot, waiting("victim", 8, queue="b", preemptible=True))
    urgent = waiting("urgent", 8, queue="b", priority=50, at=5)
    first = admit(queues=queues, running=[victim], waiting=[urgent], snapshot=snapshot, now=5)
    assert [(p.victim, p.for_job) for p in first.preemptions] == [("victim", "urgent")]

    # The victim is still stopping: the pass preempts it again and `big` reserves the host.
    snapshot = fleet(1)
    victim = start(snapshot, waiting("victim", 8, queue="b", preemptible=True))
    big = waiting("big", 8, queue="a", priority=100, at=6)
    claimant = replace(urgent, claims=True)
    stopping = admit(
        queues=queues, running=[victim], waiting=[big, claimant], snapshot=snapshot, now=6
    )
    assert stopping.reservation is not None and stopping.reservation.job == "big"

    # The victim has released: the claimant takes the room; `big` keeps waiting. Without the
    # claim, the carried reservation would have given the room to `big`.
    def released(first: Waiting) -> Decision:
        return admit(
            queues=queues,
            running=[],
            waiting=[big, first],
            snapshot=fleet(1),
            now=7,
            reserved=stopping.reservation,
        )

    after = released(claimant)
    assert names(after) == ["urgent"]
    assert reasons(after) == {"big": NO_CAPACITY}
    assert names(released(urgent)) == ["big"]


def test_a_job_ahead_in_the_preemptors_queue_still_goes_first() -> None:
    """The claim does not jump the queue: `top` (priority 100, the same queue) came while the
    victim stopped for `urgent` (50) and could preempt nothing; it takes the room first."""
    queues = [QueueSpec(name="b", gpus=8)]
    urgent = replace(waiting("urgent", 8, queue="b", priority=50, at=5), claims=True)
    top = waiting("top", 8, queue="b", priority=100, at=6)
    decision = admit(queues=queues, running=[], waiting=[urgent, top], snapshot=fleet(1), now=7)
    assert names(decision) == ["top"]
    assert reasons(decision) == {"urgent": NO_CAPACITY}


def test_use_beyond_a_quota_that_nothing_lends_any_more_is_reclaimed_by_any_queue() -> None:
    """b borrowed 4 GPUs from a in cohort lab; then a left the cohort. b's 8 GPUs are over its
    quota of 4 with no lender: a job of a within its own quota preempts b's newest preemptible
    job (it waited for b's jobs to end, `start unknown`). A queue that borrows within its own
    cohort, covered by a lender there, is not preempted for a queue outside it."""
    snapshot = fleet(1)
    held = [
        start(snapshot, waiting(f"b-{i}", 4, queue="b", preemptible=True), now=i) for i in range(2)
    ]
    left = [QueueSpec(name="a", gpus=4), QueueSpec(name="b", gpus=4, cohort="lab")]
    ask = [waiting("a-own", 4, queue="a", at=5)]
    decision = admit(queues=left, running=held, waiting=ask, snapshot=snapshot, now=10)
    assert [(p.victim, p.for_job) for p in decision.preemptions] == [("b-1", "a-own")]
    # b borrows from c, which lends it in lab: a (outside lab) takes nothing from b.
    lent = [*left, QueueSpec(name="c", gpus=4, cohort="lab")]
    decision = admit(queues=lent, running=held, waiting=ask, snapshot=snapshot, now=10)
    assert decision.preemptions == []
    assert reasons(decision) == {"a-own": NO_CAPACITY}


def test_quota_is_taken_back_from_the_borrowers_job_on_the_host_that_makes_room() -> None:
    """Found in QA: research borrows 4 GPUs (three 4-GPU jobs, quota 8); prod's job needs a
    whole host. The preferred victim, research's newest job, shares gpu-0 with its oldest, so
    taking it back frees no whole host, and research borrowed nothing more: the victim order was
    cut there and prod's job waited for research's jobs to end. Taking back research's job on
    gpu-1 instead frees that host and leaves research at its quota."""
    from tests.unit.scheduler.conftest import make_job

    snapshot = fleet(2)
    queues = [
        QueueSpec(name="research", gpus=8, cohort="lab"),
        QueueSpec(name="prod", gpus=8, cohort="lab"),
    ]

    def pinned(name: str, host: str, at: float) -> Waiting:
        job = make_job({"gpu": 4}, name=name, placement={"hosts": [host]})
        return Waiting(name, "research", job, at, 0, True)

    held = [
        start(snapshot, pinned("r-old", "gpu-0", 0), now=0),
        start(snapshot, pinned("r-mid", "gpu-1", 1), now=1),
        start(snapshot, pinned("r-new", "gpu-0", 2), now=2),
    ]
    assert [r.placement.nodes[0].host_name for r in held] == ["gpu-0", "gpu-1", "gpu-0"]
    decision = admit(
        queues=queues,
        running=held,
        waiting=[waiting("p-whole", 8, queue="prod", at=5)],
        snapshot=snapshot,
        now=10,
    )
    assert [p.victim for p in decision.preemptions] == ["r-mid"]
    assert [a.placement.nodes[0].host_name for a in decision.admitted] == ["gpu-1"]


def test_what_a_victim_frees_beyond_its_preemptors_need_is_no_other_jobs_while_it_stops() -> None:
    """`urgent` (4 GPUs) preempts `victim`, which holds all 8 GPUs of the one host. The pass
    admitted `small` (4 GPUs, later in the queue) on the other 4 GPUs the victim was freeing:
    committed at once while the victim still ran, so the database held those GPUs twice (the
    fleet-scale admission benchmark found CPUs held beyond a host's in this way). The victim's
    host is nobody else's until it has stopped; a later pass gives `small` the rest."""
    snapshot = fleet(1)
    queues = [QueueSpec(name="a", gpus=8)]
    victim = start(snapshot, waiting("victim", 8, preemptible=True))
    urgent = waiting("urgent", 4, priority=50, at=5)
    small = waiting("small", 4, priority=10, at=6)
    decision = admit(
        queues=queues, running=[victim], waiting=[urgent, small], snapshot=snapshot, now=7
    )
    assert [(p.victim, p.for_job) for p in decision.preemptions] == [("victim", "urgent")]
    assert names(decision) == ["urgent"]
    assert reasons(decision) == {"small": NO_CAPACITY}
    # The victim has released: the claimant and `small` both start.
    after = admit(
        queues=queues,
        running=[],
        waiting=[replace(urgent, claims=True), small],
        snapshot=fleet(1),
        now=8,
    )
    assert names(after) == ["urgent", "small"]
