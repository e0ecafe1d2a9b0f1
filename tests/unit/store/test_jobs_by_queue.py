"""The listing of one queue's jobs (gpuflow/services/jobs.py `list_jobs(queue=...)`), asked of
the spec each job row holds, on SQLite and PostgreSQL: a spec recorded before queues names none
and counts as the default queue's."""

from __future__ import annotations

from gpuflow.services.jobs import list_jobs, record_status_in
from gpuflow.status import JobStatus
from gpuflow.store.db import Store


def test_jobs_are_listed_by_the_queue_their_spec_names(store: Store) -> None:
    specs = {
        "a1": {"queue": "a"},
        "a2": {"queue": "a", "priority": 5},
        "b1": {"queue": "b"},
        "named": {"queue": "default"},
        "older": {},
    }
    with store.session() as session:
        for name, spec in specs.items():
            record_status_in(
                session,
                job_id=f"job-{name}",
                name=name,
                spec={"commands": ["x"], **spec},
                status=JobStatus.PENDING,
                event_key=f"submitted-{name}",
            )
        session.commit()

    def names(queue: str | None) -> list[str]:
        return sorted(row.name for row in list_jobs(store, queue=queue))

    assert names("a") == ["a1", "a2"]
    assert names("b") == ["b1"]
    assert names("default") == ["named", "older"]
    assert names("c") == []
    assert names(None) == sorted(specs)
