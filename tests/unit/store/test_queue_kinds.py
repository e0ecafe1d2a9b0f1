"""Queues in the database (gpuflow/services/queues.py), on SQLite and PostgreSQL: a cohort's
queues all have a total quota or all a quota per GPU model (found in QA: a total's idle quota
was never lent to per-model queues of its cohort, silently), a queue stored with `*` among its
models, jobs between attempts counted by `queue list` as `queue delete` counts them, and a
malformed name refused as such."""

from __future__ import annotations

from typing import Any

import pytest

from gpuflow.errors import GpuflowError, SpecError
from gpuflow.services.queues import apply_queue, delete_queue, list_queues, queues_in
from gpuflow.specs import QueueSpec
from gpuflow.status import JobStatus
from gpuflow.store.db import Store
from gpuflow.store.tables import JobRow, QueueEntryRow, QueueRow


def _queue(name: str, gpus: Any, **extra: Any) -> QueueSpec:
    return QueueSpec.model_validate({"type": "queue", "name": name, "gpus": gpus, **extra})


def _queues(store: Store) -> list[QueueSpec]:
    with store.read() as session:
        return queues_in(session)


def test_a_cohort_mixing_a_total_and_per_model_quotas_is_refused_either_way(
    store: Store,
) -> None:
    apply_queue(store, _queue("research", {"A100": 4}, cohort="lab"))
    apply_queue(store, _queue("prod", {"A100": 4}, cohort="lab"))
    with pytest.raises(SpecError) as refused:
        apply_queue(store, _queue("mix", 4, cohort="lab"))
    assert str(refused.value) == (
        "queue mix: the other queues of cohort lab (prod, research) have a quota per GPU "
        "model, and a total quota shares nothing with them (a cohort lends per model, or as "
        "one total, never across the two); write mix's per model (gpus: {A100: 4}), or use "
        "another cohort"
    )
    assert [q.name for q in _queues(store)] == ["default", "prod", "research"]
    # the other order: a total first, then a queue per model
    apply_queue(store, _queue("mix", 4, cohort="pool"))
    with pytest.raises(SpecError) as refused:
        apply_queue(store, _queue("research", {"A100": 2, "T4": 1}, cohort="pool"))
    assert str(refused.value).startswith(
        "queue research: the other queues of cohort pool (mix) have a total quota, and a "
        "quota per GPU model shares nothing with them"
    )
    assert str(refused.value).endswith(
        "write research's as a total (gpus: 3), or use another cohort"
    )
    # a queue changing its own kind is not counted against itself; one alone is fine
    assert apply_queue(store, _queue("mix", {"A100": 4}, cohort="pool")) == "updated"
    assert apply_queue(store, _queue("mix", {"A100": 4}, cohort="lab")) == "updated"


def test_a_queue_stored_with_star_among_its_models_reads_as_it_was_counted(store: Store) -> None:
    """`*` among models is refused now; one stored before was counted as a total of its `*`
    (its models' quotas meant nothing), and still reads (admission reads every queue)."""
    with store.session() as session:
        session.add(QueueRow(name="old", spec={"name": "old", "gpus": {"A100": 2, "*": 3}}))
        session.commit()
    (_, old) = _queues(store)
    assert old.quota == {"*": 3}


def _job(store: Store, job_id: str, queue: str | None, status: JobStatus) -> None:
    spec = {"name": job_id, "commands": ["true"], **({"queue": queue} if queue else {})}
    with store.session() as session:
        session.add(JobRow(id=job_id, name=job_id, status=status, spec=spec))
        session.commit()


def test_list_counts_jobs_between_attempts_as_delete_does(store: Store) -> None:
    apply_queue(store, _queue("research", 8))
    _job(store, "job-a", "research", JobStatus.PENDING)  # between attempts: no entry
    _job(store, "job-b", "research", JobStatus.PENDING)  # waiting: an entry
    _job(store, "job-c", "research", JobStatus.FAILED)  # ended: holds nothing
    _job(store, "job-d", None, JobStatus.PENDING)  # names no queue: the default's
    with store.session() as session:
        session.add(
            QueueEntryRow(job_id="job-b", attempt=1, name="b", queue="research", state="waiting")
        )
        session.commit()
    usage = {q.spec.name: q for q in list_queues(store)}
    assert (usage["research"].waiting, usage["research"].between_attempts) == (1, 1)
    assert usage["default"].between_attempts == 1
    with pytest.raises(GpuflowError, match=r"\(1 waiting, 0 running, 1 between attempts\)"):
        delete_queue(store, "research")


def test_delete_of_a_malformed_name_says_what_a_name_is(store: Store) -> None:
    with pytest.raises(SpecError, match=r"^queue name 'Bad_Name' must start with a letter"):
        delete_queue(store, "Bad_Name")
