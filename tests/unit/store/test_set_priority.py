"""A job's priority changed while it waits or runs (gpuflow/services/queue_entries.py
`set_priority_in`, what `gpuflow set-priority` writes), on SQLite and PostgreSQL: the next pass
orders the waiting jobs by it, and `ps` reads it from the job's row."""

from __future__ import annotations

from gpuflow.services.admission import run_pass_in
from gpuflow.services.capacity import allocations_of
from gpuflow.services.jobs import find_job, record_status_in
from gpuflow.services.queue_entries import set_priority_in
from gpuflow.status import JobStatus
from gpuflow.store.db import Store
from tests.unit.store.test_admission_store import _enqueue, _entry, _fleet, _release


def test_a_raised_priority_moves_a_waiting_job_ahead_at_the_next_pass(store: Store) -> None:
    _fleet(store, gpus=1)
    assert _enqueue(store, "runner", 0).placement is not None
    assert _enqueue(store, "early", 1).placement is None
    assert _enqueue(store, "late", 2).placement is None
    with store.session() as session:
        record_status_in(
            session,
            job_id="job-late",
            name="late",
            spec={"commands": ["x"], "priority": 0},
            status=JobStatus.PENDING,
            event_key="submitted",
        )
        session.commit()
    with store.placement_transaction() as session:
        assert set_priority_in(session, job_id="job-late", priority=50)
        assert not set_priority_in(session, job_id="job-none", priority=50)  # no entry
    entry = _entry(store, "late")
    assert entry is not None and entry.priority == 50 and entry.spec["priority"] == 50
    assert find_job(store, "job-late").spec["priority"] == 50

    _release(store, "runner")
    with store.placement_transaction() as session:
        run_pass_in(session, reservation=None)
    assert len(allocations_of(store, "job-late")) == 1
    assert allocations_of(store, "job-early") == []
    early = _entry(store, "early")
    assert early is not None and early.state == "waiting" and early.position == 0
