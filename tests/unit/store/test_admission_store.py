"""The admission pass over the store (gpuflow/services/admission.py), on SQLite and PostgreSQL:
what it commits, what it leaves waiting and why, and the warm state it leaves behind."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from gpuflow.scheduler.model import Placement
from gpuflow.services import queue_entries
from gpuflow.services.admission import run_pass_in
from gpuflow.services.capacity import allocations_of, release_allocation_in
from gpuflow.services.fleets import apply_fleet
from gpuflow.services.queue_entries import (
    enqueue_in,
    enter_at_submit_in,
    leave_queue_in,
    withdraw_in,
)
from gpuflow.services.queues import apply_queue
from gpuflow.specs import FleetSpec, JobSpec, QueueSpec
from gpuflow.status import JobStatus
from gpuflow.store.db import Store
from gpuflow.store.tables import JobRow, QueueEntryRow
from gpuflow.workflows.queue_models import EnqueueInput, QueueVerdict
from tests.unit.store.test_warm import _look, _memory_checked

T0 = datetime(2026, 11, 1, tzinfo=UTC)


def _fleet(store: Store, gpus: int = 1, cpus: int = 8) -> None:
    apply_fleet(
        store,
        FleetSpec.model_validate(
            {
                "type": "fleet",
                "name": "sim",
                "kind": "sim",
                "hosts": [
                    {
                        "name": "h1",
                        "cpus": cpus,
                        "gpus": [{"name": "A100", "memory": "80GB", "count": gpus}],
                    }
                ],
            }
        ),
    )


def _enqueue(
    store: Store, name: str, k: int, *, may_wait: bool = True, **fields: Any
) -> QueueVerdict:
    spec = JobSpec.model_validate(
        {"name": name, "commands": ["true"], "resources": {"gpu": "A100:1"}, **fields}
    )
    with store.placement_transaction() as session:
        return enqueue_in(
            session,
            EnqueueInput(
                job_id=f"job-{name}",
                attempt=1,
                spec=spec,
                submitted_at=T0 + timedelta(seconds=k),
                may_wait=may_wait,
            ),
        )


def _entry(store: Store, name: str) -> QueueEntryRow | None:
    with store.read() as session:
        return session.get(QueueEntryRow, f"job-{name}")


def _release(store: Store, name: str) -> None:
    with store.placement_transaction() as session:
        release_allocation_in(session, job_id=f"job-{name}")
        leave_queue_in(session, job_id=f"job-{name}")


def test_alone_a_job_is_admitted_in_its_enqueue_and_asking_again_gives_the_same(
    store: Store,
) -> None:
    _fleet(store)
    first = _enqueue(store, "first", 0)
    assert isinstance(first.placement, Placement)
    again = _enqueue(store, "first", 0)
    assert again.placement == first.placement
    assert len(allocations_of(store, "job-first")) == 1
    entry = _entry(store, "first")
    assert entry is not None and entry.state == "admitted"


def test_a_pass_admits_the_highest_priority_then_the_earliest(store: Store) -> None:
    _fleet(store)
    assert _enqueue(store, "blocker", 0).placement is not None
    held = _enqueue(store, "low", 1)
    assert held.placement is None and held.reason == "no_capacity"
    assert held.detail and held.detail[0].startswith("h1: ")
    _enqueue(store, "high", 2, priority=100)
    _enqueue(store, "low2", 3)
    _release(store, "blocker")
    with store.placement_transaction() as session:
        outcome = run_pass_in(session, reservation=None)
    assert [a.job_id for a in outcome.admitted] == ["job-high"]
    assert outcome.waiting == 2
    assert len(allocations_of(store, "job-high")) == 1
    low, low2 = _entry(store, "low"), _entry(store, "low2")
    assert low is not None and (low.state, low.position, low.reason) == (
        "waiting",
        0,
        "no_capacity",
    )
    assert low2 is not None and low2.position == 1
    # Withdrawing a waiting job removes it; an admitted one keeps its placement.
    with store.placement_transaction() as session:
        assert withdraw_in(session, job_id="job-low2", attempt=1).placement is None
        assert withdraw_in(session, job_id="job-high", attempt=1).placement is not None
    assert _entry(store, "low2") is None


def test_a_job_that_may_not_wait_is_refused_once_with_reasons(store: Store) -> None:
    _fleet(store)
    apply_queue(store, QueueSpec(name="tiny", gpus=0))
    refused = _enqueue(store, "late", 0, may_wait=False, queue="tiny")
    assert refused.refused == [
        "queue tiny can never admit it: it asks 1 GPU(s) of A100, more than its quota (0) allows"
    ]
    again = _enqueue(store, "late", 0, may_wait=False, queue="tiny")
    assert again.refused == refused.refused
    assert allocations_of(store, "job-late") == []


def test_a_lone_job_that_fits_nowhere_is_refused_without_reading_the_running_jobs(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With nothing of its queue to preempt, what the full pass would say is known without
    it: refused, with the same per-host reasons (the pass reads every running job's
    placement: seconds at fleet scale). With a preemptible job below it, the pass decides."""
    _fleet(store)
    assert _enqueue(store, "blocker", 0).placement is not None
    with monkeypatch.context() as patched:  # what the full pass says
        patched.setattr(queue_entries, "_decided_alone", lambda *_: None)
        by_pass = _enqueue(store, "by-pass", 1, may_wait=False)
    assert by_pass.refused

    def no_full_pass(*_: Any, **__: Any) -> Any:
        raise AssertionError("the full pass ran")

    monkeypatch.setattr(queue_entries, "run_pass_in", no_full_pass)
    refused = _enqueue(store, "late", 2, may_wait=False)
    assert refused.refused and refused.refused[0].startswith("h1: ")
    assert refused.refused == by_pass.refused
    entry = _entry(store, "late")
    assert entry is not None and (entry.state, entry.reason) == ("refused", "no_capacity")
    assert allocations_of(store, "job-late") == []

    _release(store, "blocker")
    assert _enqueue(store, "victim", 3, preemptible=True).placement is not None
    with pytest.raises(AssertionError, match="the full pass ran"):
        _enqueue(store, "above", 4, may_wait=False, priority=100)


def test_a_preemption_changes_nothing_in_the_database_or_the_warm_state(store: Store) -> None:
    """The preemptor is admitted only once its victim has released: until then the victim keeps
    its allocation, and the warm snapshot the pass changed in memory is the database's again."""
    _fleet(store, cpus=8)
    with _memory_checked() as checks:
        victim = _enqueue(store, "victim", 0, preemptible=True)
        assert victim.placement is not None
        boss = _enqueue(store, "boss", 1, priority=100, resources={"gpu": "A100:1", "cpu": 6})
        assert boss.placement is None and boss.reason == "preempting:job-victim"
        entry = _entry(store, "boss")
        assert entry is not None and entry.reason == "preempting:job-victim"
        assert entry.position == 0  # ps: default/#1 preempting job-victim (it said "submitted")
        assert len(allocations_of(store, "job-victim")) == 1
        assert allocations_of(store, "job-boss") == []
        _look(store)  # memory equals a cold read: the boss's 6 CPUs are not held in memory
        with store.placement_transaction() as session:
            outcome = run_pass_in(session, reservation=None)
        assert [(p.job_id, p.for_job) for p in outcome.preempted] == [("job-victim", "job-boss")]
        assert outcome.admitted == []
        _release(store, "victim")
        with store.placement_transaction() as session:
            outcome = run_pass_in(session, reservation=None)
        assert [a.job_id for a in outcome.admitted] == ["job-boss"]
        _look(store)
    assert checks[0] >= 3


def test_a_submit_that_comes_after_its_job_ended_enters_nothing(store: Store) -> None:
    """The job's workflow may enter its queue, be refused and release before the submit that
    started it enters it (or a retry of the submit comes late): no entry and no allocation
    come back for a job that ended."""
    _fleet(store)
    spec = JobSpec(name="quick", commands=["true"], resources={"gpu": "A100:1"})

    def submit() -> QueueVerdict:
        with store.placement_transaction() as session:
            return enter_at_submit_in(session, job_id="job-quick", run_id="r1", spec=spec, at=T0)

    first = submit()
    assert first.placement is not None
    assert submit().placement == first.placement  # a retry: the same answer, nothing new
    assert len(allocations_of(store, "job-quick")) == 1
    _release(store, "quick")  # the job ended
    assert submit() == QueueVerdict()
    assert _entry(store, "quick") is None
    assert allocations_of(store, "job-quick") == []


def test_a_job_its_queue_could_never_admit_waits_saying_why(store: Store) -> None:
    """The words `ps` shows, as the pass writes them: the job asks a model its queue (and a
    cohort of one) has no quota for, so it waits for a quota change, not for capacity."""
    from types import SimpleNamespace

    from gpuflow.cli.waiting import queue_wait
    from gpuflow.services.jobs import find_job, record_job

    _fleet(store, gpus=2)
    apply_queue(store, QueueSpec(name="l4s", gpus={"L4": 2}))
    record_job(store, job_id="job-a100", name="a100", spec={})
    _enqueue(store, "a100", 0, queue="l4s")
    with store.placement_transaction() as session:
        outcome = run_pass_in(session, reservation=None)
    assert outcome.waiting == 1 and not outcome.admitted
    never = (
        "queue l4s can never admit it: it asks 1 GPU(s) of A100, more than its quota "
        "(L4:2) allows; it waits until a queue's quota changes (gpuflow queue apply)"
    )
    entry = _entry(store, "a100")
    assert entry is not None and (entry.reason, entry.detail) == ("quota", never)
    row = find_job(store, "job-a100")
    shown = SimpleNamespace(
        status=row.status,
        message=row.message,
        queue="l4s",
        queue_position=entry.position,
        queue_reason=entry.reason,
    )
    assert queue_wait(shown) == "over quota: " + never


def test_a_preemptor_says_why_it_waits_once_its_victims_have_gone(store: Store) -> None:
    """`preempting` is shown only while a job stopped for it still holds capacity: when the
    victim has released and the preemptor still does not fit (the host shrank meanwhile), it
    waits as any job does, saying why."""
    _fleet(store, cpus=8)
    assert _enqueue(store, "victim", 0, preemptible=True).placement is not None
    boss = _enqueue(store, "boss", 1, priority=100, resources={"gpu": "A100:1", "cpu": 6})
    assert boss.reason == "preempting:job-victim"
    with store.placement_transaction() as session:  # the victim is still stopping
        run_pass_in(session, reservation=None)
    entry = _entry(store, "boss")
    assert entry is not None and entry.reason == "preempting:job-victim"
    _release(store, "victim")
    _fleet(store, cpus=4)  # no allocation left on the host: it may change
    with store.placement_transaction() as session:
        outcome = run_pass_in(session, reservation=None)
    assert outcome.admitted == [] and outcome.preempted == []
    entry = _entry(store, "boss")
    assert entry is not None and (entry.state, entry.reason) == ("waiting", "no_capacity")
    assert entry.detail and "CPU" in entry.detail


def test_a_cut_quota_gives_back_what_the_queue_borrows_never_its_own(store: Store) -> None:
    """A queue's quota cut from 8 to 2 while it runs two 2-GPU jobs: it borrows 2 of them. A job
    of the other queue that needs all 4 GPUs preempts nothing (taking back the borrowed 2 does
    not make room, and the other 2 are the queue's own), and waits."""
    _fleet(store, gpus=4, cpus=32)
    research = {"name": "research", "cohort": "lab", "borrowing_limit": 4}
    apply_queue(store, QueueSpec.model_validate({**research, "gpus": {"A100": 8}}))
    apply_queue(store, QueueSpec(name="prod", gpus={"A100": 8}, cohort="lab", lending_limit=4))
    two = {"queue": "research", "preemptible": True, "resources": {"gpu": "A100:2"}}
    for k, name in enumerate(["r1", "r2"]):
        assert _enqueue(store, name, k, **two).placement is not None
    apply_queue(store, QueueSpec.model_validate({**research, "gpus": {"A100": 2}}))
    prod = _enqueue(store, "p1", 3, queue="prod", priority=100, resources={"gpu": "A100:4"})
    assert prod.placement is None and prod.reason == "no_capacity"
    with store.placement_transaction() as session:
        outcome = run_pass_in(session, reservation=None)
    assert outcome.preempted == [] and outcome.admitted == []
    assert len(allocations_of(store, "job-r1")) == len(allocations_of(store, "job-r2")) == 1


def test_the_next_job_of_a_queue_says_why_it_waits_as_the_fleet_is_now(store: Store) -> None:
    """Its words are made again at each pass (`ps` and `describe` show them): once a blocker
    ends, they count the GPUs that came free, not the ones free when it first waited."""
    from gpuflow.services.jobs import find_job, record_job

    _fleet(store, gpus=4)
    for k, name in enumerate(["one", "two"]):
        assert _enqueue(store, name, k, resources={"gpu": "A100:2"}).placement is not None
    record_job(store, job_id="job-big", name="big", spec={})
    held = _enqueue(store, "big", 2, resources={"gpu": "A100:4"})
    assert held.reason == "no_capacity"
    with store.placement_transaction() as session:
        run_pass_in(session, reservation=None)
    assert "h1: 0 of 4 GPUs free, job needs 4" in (find_job(store, "job-big").message or "")
    _release(store, "one")
    with store.placement_transaction() as session:
        outcome = run_pass_in(session, reservation=None)
    assert outcome.held == []  # nothing new to tell its workflow: only the words follow
    message = find_job(store, "job-big").message or ""
    assert "h1: 2 of 4 GPUs free, job needs 4" in message, message
    entry = _entry(store, "big")
    assert entry is not None and entry.detail is not None
    assert entry.detail.startswith("h1: 2 of 4 GPUs free, job needs 4")


def test_a_waiting_spec_an_older_gpuflow_accepted_is_still_read(store: Store) -> None:
    """A check added to job specs since a job entered its queue does not make the pass that
    reads its stored spec fail (for every waiting job, pass after pass)."""
    from gpuflow.naming import RECORDED

    _fleet(store)
    assert _enqueue(store, "blocker", 0).placement is not None
    old = JobSpec.model_validate(
        {
            "name": "old",
            "commands": ["true"],
            "resources": {"gpu": "A100:1"},
            "env": {"TOKEN": "${{ secret.tok }}"},  # refused as input today
        },
        context=RECORDED,
    )
    with store.placement_transaction() as session:
        verdict = enqueue_in(
            session,
            EnqueueInput(job_id="job-old", attempt=1, spec=old, submitted_at=T0, may_wait=True),
        )
    assert verdict.placement is None
    _release(store, "blocker")
    with store.placement_transaction() as session:
        outcome = run_pass_in(session, reservation=None)
    assert [a.job_id for a in outcome.admitted] == ["job-old"]


def test_a_deleted_queue_refuses_the_attempts_that_still_name_it(store: Store) -> None:
    """A queue's delete counts the jobs between attempts (no entry); an attempt that still names
    a deleted queue (a schedule's run) is refused saying so, not counted in `default` without a
    limit."""
    from gpuflow.errors import GpuflowError
    from gpuflow.services.jobs import record_job
    from gpuflow.services.queues import delete_queue

    _fleet(store)
    apply_queue(store, QueueSpec(name="qd", gpus=1))
    spec = {"name": "r", "commands": ["true"], "queue": "qd"}
    record_job(store, job_id="job-r", name="r", spec=spec)  # its attempt not in the queue yet
    with pytest.raises(GpuflowError, match=r"1 job\(s\) \(0 waiting, 0 running, 1 between"):
        delete_queue(store, "qd")
    with store.placement_transaction() as session:
        row = session.get(JobRow, "job-r")
        assert row is not None
        row.status = JobStatus.FAILED
        session.add(row)
    delete_queue(store, "qd")
    verdict = _enqueue(store, "late", 1, queue="qd")
    assert verdict.placement is None
    assert verdict.refused == [
        'queue "qd" is gone (deleted since the job was scheduled or submitted, or never '
        "applied); known: default"
    ]
    assert verdict.unknown_queue  # not a lack of capacity: the job ends start_failed
    assert _entry(store, "late") is None


def test_a_preemptor_that_may_not_wait_keeps_its_claim_while_its_victim_stops(
    store: Store,
) -> None:
    """`boss` may not wait (no retry on no-capacity) and preempts `victim`. While the victim
    stopped, a pass in which another queue's job came first and reserved the host found no
    room for `boss` and refused it: the victim was stopped for nothing, and its GPUs went to
    others (found by QA on the embedded stack). A claim that stands is never refused."""
    _fleet(store, gpus=2)
    apply_queue(store, QueueSpec(name="team", gpus=2))
    apply_queue(store, QueueSpec(name="aaa", gpus=2))
    two = {"queue": "team", "resources": {"gpu": "A100:2"}}
    assert _enqueue(store, "victim", 0, preemptible=True, **two).placement is not None
    boss = _enqueue(store, "boss", 1, may_wait=False, priority=100, **two)
    assert boss.reason == "preempting:job-victim"
    assert _enqueue(store, "other", 2, queue="aaa").placement is None
    with store.placement_transaction() as session:  # the victim is still stopping
        outcome = run_pass_in(session, reservation=None)
    assert outcome.refused == []
    entry = _entry(store, "boss")
    assert entry is not None and (entry.state, entry.reason) == ("waiting", "preempting:job-victim")
    _release(store, "victim")
    with store.placement_transaction() as session:
        outcome = run_pass_in(session, reservation=None)
    assert [a.job_id for a in outcome.admitted] == ["job-boss"]
