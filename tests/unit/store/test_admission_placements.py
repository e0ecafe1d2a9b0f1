"""The running jobs' placements an admission pass keeps between passes
(gpuflow/services/capacity.py `placements_of`), on SQLite and PostgreSQL: a pass must decide on
what each running job holds in the database now, whichever worker admitted it and however often
it was released and admitted again, with the same attempt."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlmodel import select

from gpuflow.scheduler.model import Placement
from gpuflow.services.admission import PassOutcome, run_pass_in
from gpuflow.services.capacity import held_allocation, placements_of, release_allocation_in
from gpuflow.services.fleets import apply_fleet, set_host_state
from gpuflow.services.queue_entries import enqueue_in, leave_queue_in, withdraw_in
from gpuflow.services.queues import apply_queue
from gpuflow.services.verdicts import ADMITTED
from gpuflow.specs import FleetSpec, JobSpec, QueueSpec
from gpuflow.status import HostState
from gpuflow.store.db import Store
from gpuflow.store.tables import QueueEntryRow
from gpuflow.workflows.queue_models import EnqueueInput, QueueVerdict

T0 = datetime(2026, 11, 1, tzinfo=UTC)


def _fleet(store: Store, hosts: dict[str, str]) -> None:
    """One sim fleet `sim`: per host name, the model of its one GPU."""
    apply_fleet(
        store,
        FleetSpec.model_validate(
            {
                "type": "fleet",
                "name": "sim",
                "kind": "sim",
                "hosts": [
                    {"name": name, "cpus": 8, "gpus": [{"name": model, "memory": "80GB"}]}
                    for name, model in hosts.items()
                ],
            }
        ),
    )


def _enqueue(
    worker: Store, name: str, k: int, gpu: str = "A100:1", *, may_wait: bool = True, **fields: Any
) -> QueueVerdict:
    """The job's first attempt enters its queue, submitted at T0 + k s (asking again after a
    release, as its workflow would, gives the same k)."""
    spec = JobSpec.model_validate(
        {"name": name, "commands": ["true"], "resources": {"gpu": gpu}, **fields}
    )
    ask = EnqueueInput(
        job_id=f"job-{name}",
        attempt=1,
        spec=spec,
        submitted_at=T0 + timedelta(seconds=k),
        may_wait=may_wait,
    )
    with worker.placement_transaction() as session:
        return enqueue_in(session, ask)


def _release(worker: Store, name: str) -> None:
    """What release_job does: the allocation and the entry go together."""
    with worker.placement_transaction() as session:
        release_allocation_in(session, job_id=f"job-{name}")
        leave_queue_in(session, job_id=f"job-{name}")


def _withdraw(worker: Store, name: str) -> None:
    with worker.placement_transaction() as session:
        withdraw_in(session, job_id=f"job-{name}", attempt=1)


def _pass(worker: Store) -> PassOutcome:
    with worker.placement_transaction() as session:
        return run_pass_in(session, reservation=None)


def _host(verdict: QueueVerdict) -> str:
    assert verdict.placement is not None, verdict
    return verdict.placement.nodes[0].host_name


def _state(store: Store, host: str, state: HostState) -> None:
    set_host_state(store, f"sim/{host}", state)


def _cache_filled(worker: Store) -> None:
    """A pass of this worker that reads every running job (a job that waits for a GPU model
    no host has, then leaves)."""
    _enqueue(worker, "never", 99, "B200:1")
    _withdraw(worker, "never")


def _readmitted_elsewhere(first: Store, second: Store) -> None:
    """`first` keeps job-j's placement on host a from a pass; then `second` releases job-j and
    admits the same attempt again on host h, after job-k took host a."""
    _state(first, "h", HostState.MAINTENANCE)
    assert _host(_enqueue(first, "j", 0)) == "a"
    _cache_filled(first)
    _release(second, "j")
    assert _host(_enqueue(second, "k", 1)) == "a"
    _state(second, "h", HostState.READY)
    assert _host(_enqueue(second, "j", 0)) == "h"


def test_a_job_readmitted_with_the_same_attempt_elsewhere_is_seen_where_it_runs(
    store: Store,
) -> None:
    """The pass reserves for a blocked job the host of the most recent job to start (job-j,
    admitted again on h): on a, where it ran before, a stale placement would reserve a."""
    _fleet(store, {"a": "A100", "h": "A100"})
    _readmitted_elsewhere(store, store)
    _enqueue(store, "blocked", 2)
    outcome = _pass(store)
    assert outcome.reservation is not None
    assert outcome.reservation.job == "job-blocked"
    assert outcome.reservation.hosts == ["sim/h"]


def test_a_placement_another_worker_admitted_again_is_read_again(store: Store) -> None:
    _fleet(store, {"a": "A100", "h": "A100"})
    other = Store(store.url)
    try:
        _readmitted_elsewhere(store, other)
        _enqueue(store, "blocked", 2)
        outcome = _pass(store)
        assert outcome.reservation is not None
        assert outcome.reservation.hosts == ["sim/h"]
    finally:
        other.dispose()


def test_quota_counts_the_model_a_job_holds_after_another_worker_moved_it(store: Store) -> None:
    """Per-model quota: job-j runs on the A100 when the first worker's pass sees it, then the
    second worker releases it and admits the same attempt on the H100. The A100 quota is free
    again: the first worker's next pass admits the job that waits for it."""
    _fleet(store, {"a": "A100", "h": "H100"})
    apply_queue(store, QueueSpec(name="team", gpus={"A100": 1, "H100": 1}))
    other = Store(store.url)
    try:
        _state(store, "h", HostState.MAINTENANCE)
        assert _host(_enqueue(store, "j", 0, "A100,H100:1", queue="team")) == "a"
        waits = _enqueue(store, "w", 1, "A100:1", queue="team")  # a pass of the first worker
        assert waits.placement is None
        _release(other, "j")
        _state(other, "a", HostState.MAINTENANCE)
        _state(other, "h", HostState.READY)
        _enqueue(other, "j", 0, "A100,H100:1", queue="team")  # waits behind job-w
        admitted = _pass(other).admitted
        assert [(a.job_id, a.placement.nodes[0].host_name) for a in admitted] == [("job-j", "h")]
        _state(other, "a", HostState.READY)
        outcome = _pass(store)
        assert [a.job_id for a in outcome.admitted] == ["job-w"]
    finally:
        other.dispose()


def test_kept_placements_equal_the_database_after_a_random_stream(store: Store) -> None:
    """Two workers admit, release and admit again the same attempts at random (a job released
    often comes back at once, elsewhere: its host went away); whenever one of them looks, what
    it kept equals a fresh read of the allocation rows."""
    hosts = [f"h{i}" for i in range(4)]
    _fleet(store, dict.fromkeys(hosts, "A100"))
    workers = [store, Store(store.url)]
    rng = random.Random(7)
    try:
        for step in range(80):
            worker = rng.choice(workers)
            name = f"j{rng.randrange(6)}"
            with worker.read() as session:
                entry = session.get(QueueEntryRow, f"job-{name}")
            if entry is None:
                _enqueue(worker, name, step)
            elif entry.state == ADMITTED:
                held = _held(worker, f"job-{name}")
                _release(worker, name)
                _state(worker, held.nodes[0].host_name, HostState.MAINTENANCE)
                if rng.random() < 0.7:
                    _enqueue(worker, name, _step_of(entry))
            _state(worker, rng.choice(hosts), HostState.READY)
            if rng.random() < 0.5:
                _pass(worker)
            _kept_are_fresh(rng.choice(workers))
    finally:
        workers[1].dispose()


def _step_of(entry: QueueEntryRow) -> int:
    """The k it was enqueued with (its workflow asks again with the same submission time)."""
    submitted = entry.submitted_at.replace(tzinfo=UTC)
    return round((submitted - T0).total_seconds())


def _held(worker: Store, job_id: str) -> Placement:
    with worker.read() as session:
        found = held_allocation(session, job_id, 1)
    assert found is not None
    return found


def _kept_are_fresh(worker: Store) -> None:
    with worker.placement_transaction() as session:
        entries = session.exec(select(QueueEntryRow).where(QueueEntryRow.state == ADMITTED))
        admitted = [(entry.job_id, entry.attempt, entry.admitted_at) for entry in entries]
        kept = placements_of(session, admitted)
        fresh = {key: held_allocation(session, key[0], key[1]) for key in admitted}
    assert kept == {key: placement for key, placement in fresh.items() if placement is not None}


def test_many_jobs_are_read_a_few_at_a_time(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """Running placements and waiting specs are read in queries of JOBS_PER_READ job ids (SQLite
    bounds a statement's parameters): every job is read whatever the number."""
    monkeypatch.setattr("gpuflow.services.capacity.JOBS_PER_READ", 2)
    monkeypatch.setattr("gpuflow.services.admission.JOBS_PER_READ", 2)
    _fleet(store, {f"h{i}": "A100" for i in range(5)})
    for k in range(5):
        assert _enqueue(store, f"r{k}", k).placement is not None
    for k in range(5):
        assert _enqueue(store, f"w{k}", 10 + k).placement is None
    _release(store, "r2")
    _release(store, "r4")
    assert [a.job_id for a in _pass(store).admitted] == ["job-w0", "job-w1"]
    _kept_are_fresh(store)
    with store.placement_transaction() as session:
        entries = session.exec(select(QueueEntryRow).where(QueueEntryRow.state == ADMITTED))
        keys = [(entry.job_id, entry.attempt, entry.admitted_at) for entry in entries]
        assert len(placements_of(session, keys)) == 5
