"""A plan's verdict on admission's terms (gpuflow/services/preview.py), on SQLite and
PostgreSQL: a host that fits is not a start when the queue's quota is spent, when jobs waiting
ahead take the free capacity first, or when the room is reserved for a blocked job; and a pass
run now would preempt what the preview says."""

from __future__ import annotations

from gpuflow.scheduler import Snapshot, plan_together
from gpuflow.services.capacity import allocations_of, read_snapshot, release_allocation_in
from gpuflow.services.preview import preview, preview_each
from gpuflow.services.queue_entries import leave_queue_in
from gpuflow.services.queues import apply_queue
from gpuflow.specs import JobSpec, QueueSpec
from gpuflow.store.db import Store
from tests.unit.store.test_admission_store import _enqueue, _entry, _fleet


def _spec(name: str, **fields: object) -> JobSpec:
    return JobSpec.model_validate(
        {"name": name, "commands": ["true"], "resources": {"gpu": "A100:1"}, **fields}
    )


def _usage(snapshot: Snapshot) -> list[tuple[object, ...]]:
    """What placements change on each host."""
    return [
        (h.id, [g.used for g in h.gpus], h.cpus_used, h.memory_used_mib, sorted(h.blocks_used))
        for h in snapshot.hosts()
    ]


def _end(store: Store, name: str) -> None:
    """The job's process ended and released its GPUs; no pass has run since."""
    with store.placement_transaction() as session:
        release_allocation_in(session, job_id=f"job-{name}")
        leave_queue_in(session, job_id=f"job-{name}")


def test_a_spent_quota_holds_a_job_a_host_would_fit(store: Store) -> None:
    _fleet(store, gpus=4, cpus=32)
    apply_queue(store, QueueSpec(name="tiny", gpus={"A100": 1}))
    assert _enqueue(store, "t1", 0, queue="tiny").placement is not None
    with store.read() as session:
        (second,) = preview(session, [_spec("t2", queue="tiny")])
        (elsewhere,) = preview(session, [_spec("d1")])  # the default queue has no limit
    assert second.placement is None and second.waits == "quota" and second.ahead == 0
    assert elsewhere.placement is not None and elsewhere.waits is None


def test_jobs_waiting_ahead_take_the_free_capacity_first(store: Store) -> None:
    _fleet(store, gpus=1, cpus=32)
    assert _enqueue(store, "running", 0).placement is not None
    assert _enqueue(store, "waiting", 1).placement is None  # the one GPU is taken
    _end(store, "running")  # a GPU is free, and the waiting job is first in line for it
    with store.read() as session:
        (urgent,) = preview(session, [_spec("urgent", priority=10)])
        (alone,) = preview(session, [_spec("alone")])
        same, late = preview(session, [_spec("same"), _spec("late", priority=10)])
    assert urgent.placement is not None  # a higher priority goes before the waiting job
    # the waiting job starts, so none waits ahead of it: the capacity went first
    assert alone.placement is None and (alone.waits, alone.ahead, alone.first) == (
        "no_capacity",
        0,
        1,
    )
    # submitted after `same`, whose entry let the waiting job take the GPU: nothing is left
    assert same.waits == "no_capacity" and same.first == 1
    assert late.placement is None and (late.waits, late.ahead, late.first) == (
        "no_capacity",
        0,
        0,
    )
    assert allocations_of(store, "job-waiting") == []  # a read: nothing was admitted
    entry = _entry(store, "waiting")
    assert entry is not None and entry.state == "waiting"


def test_the_room_reserved_for_a_blocked_job_holds_a_job_that_would_fit(store: Store) -> None:
    _fleet(store, gpus=4, cpus=32)
    for k in range(3):
        assert _enqueue(store, f"r{k}", k).placement is not None
    assert _enqueue(store, "big", 5, resources={"gpu": "A100:4"}).placement is None
    with store.read() as session:
        (small,) = preview(session, [_spec("small")])
        (short,) = preview(session, [_spec("short", max_duration="1m")])
    assert small.placement is None and small.waits == "reserved_for:job-big"
    assert small.ahead == 1
    # a job that declares its end backfills only before a known reserved start: no running
    # job declares one here, so the start is not known and it waits too
    assert short.placement is None and short.waits == "reserved_for:job-big"


def test_a_plan_previews_the_jobs_a_pass_would_preempt(store: Store) -> None:
    _fleet(store, cpus=8)
    assert _enqueue(store, "victim", 0, preemptible=True).placement is not None
    with store.read() as session:
        boss, peer = preview(session, [_spec("boss", priority=100), _spec("peer")])
    assert boss.preempts == ["job-victim"]
    assert peer.preempts == [] and peer.waits == "no_capacity"  # the same priority: nothing
    assert len(allocations_of(store, "job-victim")) == 1  # a read: nothing changed
    entry = _entry(store, "victim")
    assert entry is not None and entry.state == "admitted"


def test_each_planned_job_enters_after_the_ones_before_it(store: Store) -> None:
    """Jobs submitted one after the other: each is decided on what the ones before it left,
    not all in one pass. The first two start while nothing waits; the third, of a higher
    priority, preempts the lowest of them, which the plan names as the job planned above."""
    _fleet(store, gpus=4, cpus=32)
    jobs = [
        _spec(f"r{k}", priority=10 * k, preemptible=True, resources={"gpu": "A100:2"})
        for k in (1, 2, 3)
    ]
    with store.read() as session:
        before = _usage(read_snapshot(session))
        r1, r2, r3 = preview(session, jobs)
        assert _usage(read_snapshot(session)) == before  # a read: nothing taken
    assert r1.placement is not None and r1.waits is None and r1.preempts == []
    assert r2.placement is not None and r2.waits is None
    assert r3.preempts == ["planned r1"] and r3.placement is not None
    assert r3.placement.nodes[0].gpu_indices == r1.placement.nodes[0].gpu_indices
    assert r3.freed == (r1.placement,) and r3.took == (r3.placement,)


def test_a_plan_places_each_job_on_what_admission_leaves_it(store: Store) -> None:
    """A job admission holds on its queue's quota takes nothing in the plan: the job after
    it goes where the GPUs are free, and is not told the one before took them."""
    _fleet(store, gpus=2, cpus=8)
    apply_queue(store, QueueSpec(name="tiny", gpus={"A100": 1}))
    assert _enqueue(store, "t1", 0, queue="tiny").placement is not None
    held, other = _spec("t2", queue="tiny"), _spec("d1")
    with store.read() as session:
        fates = preview(session, [held, other])
        outcomes = [(fate.took, fate.freed) for fate in fates]
        plans = plan_together([held, other], read_snapshot(session), outcomes)
    assert fates[0].waits == "quota" and fates[1].placement is not None
    assert plans[1].placement == fates[1].placement and not plans[1].displaced


def test_a_planned_job_waiting_behind_an_earlier_one_names_it(store: Store) -> None:
    """The quota held for, or the room reserved for, a job of the same plan is named by that
    job's name, as a planned victim is, not by the pass's placeholder."""
    _fleet(store, gpus=2, cpus=8)
    apply_queue(store, QueueSpec(name="tiny", gpus={"A100": 1}))
    assert _enqueue(store, "t1", 0, queue="tiny").placement is not None
    waits = {"on_events": ["no-capacity"], "duration": "1h"}
    big = _spec("big", queue="tiny", retry=waits)
    small = _spec("small", queue="tiny", retry=waits)
    with store.read() as session:
        held, behind = preview(session, [big, small])
    assert held.waits == "quota"
    assert behind.waits == "quota_held_for:planned big"


def test_each_option_is_previewed_on_the_fleet_as_it_is(store: Store) -> None:
    """A dry run previews each resource option on its own, on one read of the fleet: what one
    option's pass takes (or preempts) is given back before the next, and the caller's read
    comes back as it was."""
    _fleet(store, gpus=2, cpus=8)
    assert _enqueue(store, "victim", 0, preemptible=True).placement is not None  # 1 of 2 GPUs
    one, both = _spec("one"), _spec("boss", priority=100, resources={"gpu": "A100:2"})
    with store.read() as session:
        given = read_snapshot(session)  # a dry run's own read, previewed on and given back
        fates = preview_each(session, [[one], [both], [both], [one]], given)
        assert _usage(given) == _usage(read_snapshot(session))
        assert preview_each(session, []) == []  # nothing to preview: nothing read
    first_one, first_both, second_both, second_one = (fate for (fate,) in fates)
    assert first_one.placement is not None and first_one == second_one  # the free GPU, twice
    assert first_both.preempts == second_both.preempts == ["job-victim"]
    assert first_both.placement == second_both.placement is not None


def test_a_plan_says_when_the_quota_is_held_for_a_job_before_it(store: Store) -> None:
    _fleet(store, gpus=4, cpus=32)
    apply_queue(store, QueueSpec(name="small", gpus=2))
    assert _enqueue(store, "first", 0, queue="small").placement is not None
    assert _enqueue(store, "big", 1, queue="small", resources={"gpu": "A100:2"}).placement is None
    with store.read() as session:
        (later,) = preview(session, [_spec("later", queue="small")])
        (other,) = preview(session, [_spec("other")])
    assert later.placement is None and later.waits == "quota_held_for:job-big"
    assert later.ahead == 1 and other.placement is not None
