"""Submits entered in groups (gpuflow/services/group_entry.py, control/admission.py
`GroupCommit`): a group leaves the rows and verdicts that the same submits entered one at a time
leave, on SQLite and PostgreSQL, with the warm state equal to the database afterwards; one bad
submit fails alone; concurrent submits share transactions."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import event
from sqlmodel import Session, select

from gpuflow.control import admission
from gpuflow.control.admission import AdmissionActivities, GroupCommit, enter_all_at_submit
from gpuflow.metrics import store as metrics
from gpuflow.services import group_entry
from gpuflow.services.fleets import apply_fleet
from gpuflow.services.group_entry import Submitted
from gpuflow.services.queue_entries import enter_at_submit_in
from gpuflow.services.queues import apply_queue
from gpuflow.specs import FleetSpec, JobSpec, QueueSpec
from gpuflow.store.db import Store
from gpuflow.store.tables import AllocationRow, JobEventRow, JobRow, QueueEntryRow
from gpuflow.workflows.queue_models import EnqueueInput, QueueVerdict
from tests.unit.store.test_warm import _look, _memory_checked

FLEET = {
    "type": "fleet",
    "name": "sim",
    "kind": "sim",
    "scorer": "binpack",  # a scorer without the learned mix: one-at-a-time is the exact oracle
    "hosts": [
        {"name": "a1", "cpus": 16, "gpus": [{"name": "A100", "memory": "80GB", "count": 4}]},
        {"name": "a2", "cpus": 16, "gpus": [{"name": "A100", "memory": "80GB", "count": 2}]},
        {"name": "h1", "cpus": 8, "gpus": [{"name": "H100", "memory": "80GB", "count": 2}]},
    ],
}

ASKS = st.fixed_dictionaries(
    {
        "gpu": st.sampled_from(["A100:1", "A100:2", "H100:1", "1", "2", "4", "0.5", "A100:8"]),
        "nodes": st.sampled_from([1, 1, 1, 2]),
        "queue": st.sampled_from(["default", "default", "default", "capped"]),
        "may_wait": st.booleans(),
        "priority": st.sampled_from([0, 10]),
        "preemptible": st.booleans(),
    }
)


def _prepared(store: Store) -> Store:
    apply_fleet(store, FleetSpec.model_validate(FLEET))
    apply_queue(store, QueueSpec(name="capped", gpus=2))
    return store


def _jobs(asks: list[dict[str, Any]]) -> list[Submitted]:
    jobs = []
    for k, ask in enumerate(asks):
        spec = JobSpec.model_validate(
            {
                "name": f"j{k}",
                "commands": ["true"],
                "nodes": 1 if "." in ask["gpu"] else ask["nodes"],
                "queue": ask["queue"],
                "priority": ask.get("priority", 0),
                "preemptible": ask.get("preemptible", False),
                "resources": {"gpu": ask["gpu"]},
                **({"retry": {"on_events": ["no-capacity"]}} if ask["may_wait"] else {}),
            }
        )
        jobs.append(Submitted(f"job-{k}", "run-1", spec))
    return jobs


def _rows(store: Store) -> dict[str, list[tuple[Any, ...]]]:
    """What the submits wrote, without ids and clocks."""
    with store.read() as session:
        jobs = session.exec(select(JobRow)).all()
        events = session.exec(select(JobEventRow)).all()
        entries = session.exec(select(QueueEntryRow)).all()
        allocations = session.exec(select(AllocationRow)).all()
        return {
            "jobs": sorted(
                (
                    *(j.id, j.name, j.status, j.message, j.fleet, j.hosts, j.gpus, j.attempt),
                    *(j.termination_reason, j.waiting_for_capacity, repr(j.spec)),
                )
                for j in jobs
            ),
            "events": sorted((e.job_id, e.key, e.kind, e.message) for e in events),
            "entries": sorted(
                (
                    *(e.job_id, e.attempt, e.name, e.queue, e.state, e.priority, e.preemptible),
                    *(e.may_wait, repr(e.spec), e.fleets, e.max_duration_s, e.position),
                    *(e.reason, e.detail, e.admitted_at is None),
                )
                for e in entries
            ),
            "allocations": sorted(
                (
                    *(a.job_id, a.attempt, a.rank, a.fleet, a.host_id, a.gpu_indices),
                    *(a.gpu_fraction, a.blocks, a.cpus, a.memory_mib, a.disk_mib, repr(a.node)),
                    *(a.score, a.scorer),
                )
                for a in allocations
            ),
        }


@pytest.fixture
def checked() -> Iterator[list[int]]:
    with _memory_checked() as checks:
        yield checks


def _alone(store: Store, job: Submitted) -> QueueVerdict:
    """A submit alone, through the per-job path (`enter_at_submit_in`) in a transaction of its
    own: the oracle, written before groups."""
    with store.placement_transaction() as session:
        at = datetime.now(UTC)
        return enter_at_submit_in(
            session, job_id=job.job_id, run_id=job.run_id, spec=job.spec, at=at
        )


def _one_at_a_time(tmp: Path, jobs: list[Submitted], known: int | None) -> tuple[Any, Any]:
    store = _prepared(Store(f"sqlite:///{tmp / 'oracle.db'}").init())
    try:
        if known is not None:  # a submit retried: its job entered already
            _alone(store, jobs[known])
        return [_alone(store, job) for job in jobs], _rows(store)
    finally:
        store.dispose()


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(asks=st.lists(ASKS, min_size=1, max_size=12), known=st.none() | st.integers(0, 11))
def test_a_group_writes_what_one_at_a_time_writes(
    tmp_path_factory: pytest.TempPathFactory, asks: list[dict[str, Any]], known: int | None
) -> None:
    tmp = tmp_path_factory.mktemp("group")
    known = None if known is None or known >= len(asks) else known
    jobs = _jobs(asks)
    expected_verdicts, expected_rows = _one_at_a_time(tmp, jobs, known)
    store = _prepared(Store(f"sqlite:///{tmp / 'group.db'}").init())
    try:
        if known is not None:
            _alone(store, jobs[known])
        with _memory_checked() as checks:
            found = enter_all_at_submit(store, jobs)
            _look(store)
        assert checks[0] >= 1
        assert found == expected_verdicts
        assert _rows(store) == expected_rows
    finally:
        store.dispose()


def test_a_group_on_both_databases(store: Store, tmp_path: Path, checked: list[int]) -> None:
    asks = [
        {"gpu": gpu, "nodes": 1, "queue": "default", "may_wait": False}
        for gpu in ["A100:2", "0.5", "H100:1", "A100:8", "1", "2", "H100:2", "0.5"]
    ]
    jobs = _jobs(asks)
    expected_verdicts, expected_rows = _one_at_a_time(tmp_path, jobs, None)
    _prepared(store)
    found = enter_all_at_submit(store, jobs)
    _look(store)
    assert found == expected_verdicts
    assert any(isinstance(v, QueueVerdict) and v.placement for v in found)
    assert any(isinstance(v, QueueVerdict) and v.refused for v in found)  # A100:8 fits nowhere
    assert _rows(store) == expected_rows
    assert checked[0] >= 2


def test_one_bad_submit_fails_alone(sqlite_store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    _prepared(sqlite_store)
    good = _jobs([{"gpu": "1", "nodes": 1, "queue": "default", "may_wait": True}] * 3)
    bad = Submitted("job-bad", "run-1", good[0].spec.model_copy(update={"queue": "capped"}))
    entered = group_entry.enter_new_in

    def enter(session: Session, **fields: Any) -> QueueVerdict:
        if fields["job_id"] == bad.job_id:
            raise RuntimeError("this submit's own error")
        return entered(session, **fields)

    monkeypatch.setattr(group_entry, "enter_new_in", enter)
    found = enter_all_at_submit(sqlite_store, [good[0], bad, good[1], good[2]])
    assert isinstance(found[1], Exception)
    assert all(isinstance(v, QueueVerdict) and v.placement for v in found[::2] + found[3:])
    with sqlite_store.read() as session:
        ids = {row.id for row in session.exec(select(JobRow))}
    assert ids == {"job-0", "job-1", "job-2"}


def test_concurrent_submits_share_transactions(sqlite_store: Store) -> None:
    _prepared(sqlite_store)
    jobs = _jobs([{"gpu": "0.5", "nodes": 1, "queue": "default", "may_wait": True}] * 20)
    entries = GroupCommit(sqlite_store)

    async def submit_all() -> list[QueueVerdict]:
        return await asyncio.gather(*(entries.enter(job) for job in jobs))

    found = asyncio.run(submit_all())
    assert all(v.placement is not None for v in found[:16])  # 8 GPUs, halves
    assert all(v.placement is None and v.refused is None for v in found[16:])  # they wait
    assert entries.groups < len(jobs) // 2


def test_a_group_that_breaks_answers_each_of_its_submits(
    sqlite_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A group whose entering fails past the per-job fallback (a bug) leaves no submit waiting:
    each hears the error, and the next group is entered."""
    _prepared(sqlite_store)
    jobs = _jobs([{"gpu": "1", "nodes": 1, "queue": "default", "may_wait": True}] * 4)
    entries = GroupCommit(sqlite_store)
    entered = admission.enter_all_at_submit

    def broken(store: Store, group: list[Submitted], **kwargs: Any) -> list[Any]:
        if any(job.job_id == "job-0" for job in group):
            raise RuntimeError("a bug")
        return entered(store, group, **kwargs)

    monkeypatch.setattr(admission, "enter_all_at_submit", broken)

    async def submit_all() -> list[Any]:
        first = await asyncio.gather(*(entries.enter(j) for j in jobs[:2]), return_exceptions=True)
        return [*first, *(await asyncio.gather(*(entries.enter(j) for j in jobs[2:])))]

    found = asyncio.run(asyncio.wait_for(submit_all(), 30))
    assert [type(v) for v in found[:2]] == [RuntimeError, RuntimeError]
    assert all(isinstance(v, QueueVerdict) and v.placement for v in found[2:])


def test_the_admission_metric_reads_nothing_for_a_group(
    sqlite_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each job a group admits is observed in the group's transaction without a statement: the
    group inserted its row without the ORM and left its submission time in the session's info.
    Without it, every observation reads the job's row again."""
    _prepared(sqlite_store)
    gc.collect()
    statements: list[str] = []
    observed: list[str] = []
    observe = metrics.observe_admitted

    def counted(session: Session, job_id: str, attempt: int, fleet: str) -> None:
        gc.collect()  # what only the identity map's weak references hold is gone now
        event.listen(sqlite_store.engine, "before_cursor_execute", record)
        try:
            observe(session, job_id, attempt, fleet)
        finally:
            event.remove(sqlite_store.engine, "before_cursor_execute", record)
        observed.append(job_id)

    def record(*args: Any) -> None:
        statements.append(args[2])

    monkeypatch.setattr(metrics, "observe_admitted", counted)
    jobs = _jobs([{"gpu": "1", "nodes": 1, "queue": "default", "may_wait": True}] * 3)
    found = enter_all_at_submit(sqlite_store, jobs)
    assert all(isinstance(v, QueueVerdict) and v.placement for v in found)
    assert observed == ["job-0", "job-1", "job-2"]
    assert statements == []


def _first_step(job: Submitted) -> EnqueueInput:
    return EnqueueInput(
        job_id=job.job_id,
        attempt=1,
        spec=job.spec,
        submitted_at=datetime.now(UTC),
        may_wait=job.spec.may_wait,
    )


def test_a_first_step_joins_its_submit_in_flight(
    sqlite_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A workflow started eagerly may take its first step while its submit is still entering
    the job: the step waits for the submit's answer instead of reading it or taking the
    placement lock beside it (one transaction, not two)."""
    _prepared(sqlite_store)
    job = _jobs([{"gpu": "1", "nodes": 1, "queue": "default", "may_wait": True}])[0]
    entries = GroupCommit(sqlite_store)
    step = AdmissionActivities(sqlite_store)
    step.entries = entries

    def own_entry(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the step entered the job itself")

    def own_read(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the step read its verdict instead of waiting for its submit's")

    monkeypatch.setattr(admission, "enqueue_in", own_entry)
    step._looks.serve = own_read  # the step's batched read of its verdict

    async def both() -> tuple[QueueVerdict, QueueVerdict]:
        submit = asyncio.ensure_future(entries.enter(job))
        await asyncio.sleep(0)  # the submit is in flight
        first = await step.enqueue_job(_first_step(job))
        return await submit, first

    submitted, first = asyncio.run(both())
    assert submitted.placement is not None and first == submitted
    assert entries.groups == 1 and entries.entering(job.job_id) is None
    assert entries.decided(job.job_id) is None  # the step took it: not kept for another


def test_a_first_step_enters_alone_when_its_submit_fails(
    sqlite_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    _prepared(sqlite_store)
    job = _jobs([{"gpu": "1", "nodes": 1, "queue": "default", "may_wait": True}])[0]
    entries = GroupCommit(sqlite_store)
    step = AdmissionActivities(sqlite_store)
    step.entries = entries

    def broken(store: Store, group: list[Submitted], **kwargs: Any) -> list[Any]:
        raise RuntimeError("the submit's transaction failed")

    monkeypatch.setattr(admission, "enter_all_at_submit", broken)

    async def both() -> QueueVerdict:
        submit = asyncio.ensure_future(entries.enter(job))
        await asyncio.sleep(0)
        first = await step.enqueue_job(_first_step(job))
        with pytest.raises(RuntimeError):
            await submit
        return first

    assert asyncio.run(both()).placement is not None


def test_a_group_asks_once_per_queue_and_priority_whether_it_could_preempt(
    store: Store,
) -> None:
    """Jobs that fit nowhere and may not wait are refused unless a running job could be
    preempted for them: the database is asked once per queue and priority in a group (nothing
    else admits a job while the group holds the placement lock), and the group's own
    admissions are looked at besides."""
    _prepared(store)
    asks = [
        {"gpu": gpu, "nodes": 1, "queue": "default", "may_wait": False, "priority": priority}
        for gpu, priority in [("A100:8", 10), ("A100:1", 0), ("A100:8", 10), ("A100:8", 5)]
    ]
    asks.append({**asks[0], "gpu": "H100:4"})
    asked: list[str] = []

    def record(*args: Any) -> None:
        if "preemptible" in args[2] and args[2].lstrip().upper().startswith("SELECT"):
            asked.append(args[2])

    event.listen(store.engine, "before_cursor_execute", record)
    try:
        found = enter_all_at_submit(store, _jobs(asks))
    finally:
        event.remove(store.engine, "before_cursor_execute", record)
    refused = [isinstance(v, QueueVerdict) and v.refused is not None for v in found]
    assert refused == [True, False, True, True, True]
    assert len(asked) == 2  # priority 10 (three jobs), priority 5
