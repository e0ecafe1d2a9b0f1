"""Queues in the database (gpuflow/services/queues.py), on SQLite and PostgreSQL: the built-in
default queue, apply and delete with their refusals, and usage counted from admitted entries'
allocations as admission counts it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from gpuflow.errors import GpuflowError, NotFoundError
from gpuflow.scheduler.model import NodePlacement
from gpuflow.services.queues import (
    apply_queue,
    delete_queue,
    list_queues,
    queue_names,
    queues_in,
    waiting_places,
)
from gpuflow.specs import QueueSpec
from gpuflow.specs.queue import MAX_QUOTA_GPUS
from gpuflow.store.db import Store
from gpuflow.store.tables import AllocationRow, QueueEntryRow


def _queue(name: str, gpus: Any, **extra: Any) -> QueueSpec:
    return QueueSpec.model_validate({"type": "queue", "name": name, "gpus": gpus, **extra})


def _entry(
    store: Store,
    job: str,
    queue: str,
    state: str,
    *,
    holds: Sequence[tuple[str, int, float | None]] = (),
    position: int | None = None,
    reason: str | None = None,
) -> None:
    """A queue entry, and one allocation row per node in `holds`: (GPU model, GPUs, fraction)."""
    with store.session() as session:
        session.add(
            QueueEntryRow(
                job_id=job,
                attempt=1,
                name=job.removeprefix("job-"),
                queue=queue,
                state=state,
                position=position,
                reason=reason,
                spec={"name": job, "commands": ["true"]},
            )
        )
        for rank, (model, gpus, fraction) in enumerate(holds):
            node = NodePlacement(
                rank=rank,
                host_id=f"sim/h{rank}",
                host_name=f"h{rank}",
                fleet="sim",
                task_queue=f"host-h{rank}",
                gpu_indices=list(range(gpus)),
                gpu_names=[model] * gpus,
                gpu_fraction=fraction,
            )
            session.add(
                AllocationRow(
                    job_id=job,
                    attempt=1,
                    rank=rank,
                    fleet="sim",
                    host_id=node.host_id,
                    gpu_indices=node.gpu_indices,
                    gpu_fraction=fraction,
                    node=node.model_dump(mode="json"),
                )
            )
        session.commit()


def test_the_default_queue_exists_until_a_file_replaces_it(store: Store) -> None:
    with store.read() as session:
        (default,) = queues_in(session)
    assert (default.name, default.gpus, default.cohort) == ("default", MAX_QUOTA_GPUS, None)
    (info,) = list_queues(store)
    assert info.built_in and info.spec == default

    assert apply_queue(store, _queue("research", 8)) == "created"
    assert apply_queue(store, _queue("research", 8)) == "unchanged"
    assert apply_queue(store, _queue("default", {"A100": 4})) == "updated"  # it exists, built in
    with store.read() as session:
        assert [(q.name, q.quota) for q in queues_in(session)] == [
            ("default", {"A100": 4}),
            ("research", {"*": 8}),
        ]
    assert [q.built_in for q in list_queues(store)] == [False, False]

    # Deleting the applied default brings the built-in one back; that one cannot be deleted.
    delete_queue(store, "default")
    assert queue_names(store) == ["default", "research"]
    assert list_queues(store)[0].built_in and list_queues(store)[0].spec.gpus == MAX_QUOTA_GPUS
    with pytest.raises(GpuflowError, match=r"^queue default is built in and cannot be deleted"):
        delete_queue(store, "default")


def test_apply_creates_then_updates(store: Store) -> None:
    assert apply_queue(store, _queue("research", 8, cohort="lab")) == "created"
    assert (
        apply_queue(store, _queue("research", {"a100": 4}, cohort="lab", lending_limit=2))
        == "updated"
    )
    (_, research) = list_queues(store)
    assert research.spec == _queue("research", {"A100": 4}, cohort="lab", lending_limit=2)
    assert research.spec.borrowing_limit is None


def test_delete_refuses_a_queue_that_holds_jobs_and_names_how_many(store: Store) -> None:
    apply_queue(store, _queue("research", 8))
    _entry(store, "job-a", "research", "waiting")
    _entry(store, "job-b", "research", "admitted", holds=[("A100", 1, None)])
    _entry(store, "job-c", "research", "admitted")
    with pytest.raises(GpuflowError) as refused:
        delete_queue(store, "research")
    assert str(refused.value) == (
        "queue research still holds 3 job(s) (1 waiting, 2 running); "
        "stop them or let them finish first"
    )
    assert queue_names(store) == ["default", "research"]
    with pytest.raises(
        NotFoundError,
        match=r'^queue "reserch" does not exist \(did you mean research\?\); known: default, '
        r"research$",
    ):
        delete_queue(store, "reserch")


def test_an_empty_queue_is_deleted(store: Store) -> None:
    apply_queue(store, _queue("research", 8))
    _entry(store, "job-a", "other", "waiting")  # another queue's entries do not hold it
    delete_queue(store, "research")
    assert queue_names(store) == ["default"]


def test_usage_borrowing_and_lending_in_a_cohort(store: Store) -> None:
    apply_queue(store, _queue("prod", {"A100": 4}, cohort="lab"))
    apply_queue(store, _queue("dev", {"A100": 2}, cohort="lab", lending_limit=1))
    apply_queue(store, _queue("research", {"A100": 2}, cohort="lab"))
    apply_queue(store, _queue("solo", 2))
    # prod runs 1 A100: 3 idle, lent as needed.
    _entry(store, "job-p", "prod", "admitted", holds=[("A100", 1, None)])
    # research: a gang of 2 x 1 A100, half an A100, and 1 more: 3.5, 1.5 beyond its quota.
    _entry(store, "job-r1", "research", "admitted", holds=[("A100", 1, None), ("a100", 1, None)])
    _entry(store, "job-r2", "research", "admitted", holds=[("A100", 1, 0.5)])
    _entry(store, "job-r3", "research", "admitted", holds=[("A100", 1, None)])
    _entry(store, "job-r4", "research", "waiting", position=0, reason="quota")
    # solo's quota is a total: its L4s count under `*`.
    _entry(store, "job-s", "solo", "admitted", holds=[("L4", 2, None)])
    # Neither a waiting entry's allocation nor one without an entry counts.
    _entry(store, "job-w", "default", "waiting", holds=[("A100", 4, None)])
    with store.session() as session:
        session.add(AllocationRow(job_id="job-x", attempt=1, rank=0, fleet="sim", host_id="h"))
        session.commit()

    usage = {q.spec.name: q for q in list_queues(store)}
    assert list(usage) == ["default", "dev", "prod", "research", "solo"]
    research, prod, dev = usage["research"], usage["prod"], usage["dev"]
    assert (research.used, research.borrowed, research.lent) == ({"A100": 3.5}, {"A100": 1.5}, {})
    assert (research.waiting, research.admitted) == (1, 3)
    # The 1.5 borrowed is covered by prod's 3 idle and dev's 1 (its lending limit), in
    # proportion: 3/4 and 1/4 of it.
    assert (prod.used, prod.borrowed, prod.lent) == ({"A100": 1.0}, {}, {"A100": 1.125})
    assert (dev.used, dev.lent) == ({}, {"A100": 0.375})
    assert (usage["solo"].used, usage["solo"].borrowed) == ({"*": 2.0}, {})
    assert all(not queue.over_quota for queue in usage.values())  # lending covers it all
    default = usage["default"]
    assert (default.used, default.waiting, default.admitted) == ({}, 1, 0)


def test_lending_is_capped_by_what_a_queue_has_idle(store: Store) -> None:
    # research borrows 2 while prod (the only lender) has 1 idle: prod is taking its quota
    # back and the borrowers are being preempted. prod lends no more than it has idle.
    apply_queue(store, _queue("prod", 2, cohort="lab"))
    apply_queue(store, _queue("research", 1, cohort="lab"))
    _entry(store, "job-p", "prod", "admitted", holds=[("A100", 1, None)])
    _entry(store, "job-r", "research", "admitted", holds=[("A100", 3, None)])
    usage = {q.spec.name: q for q in list_queues(store)}
    # prod lends 1 of the 2 research uses beyond its quota; the other is over quota
    assert (usage["research"].borrowed, usage["research"].over_quota) == ({"*": 1.0}, {"*": 1.0})
    assert (usage["prod"].lent, usage["prod"].over_quota) == ({"*": 1.0}, {})


def test_a_queue_without_a_cohort_is_over_its_lowered_quota_not_borrowing(store: Store) -> None:
    apply_queue(store, _queue("solo", 2))
    _entry(store, "job-s", "solo", "admitted", holds=[("A100", 2, None)])
    apply_queue(store, _queue("solo", 1))  # lowered under a running job, which keeps running
    (solo,) = [q for q in list_queues(store) if q.spec.name == "solo"]
    assert (solo.used, solo.borrowed, solo.over_quota) == ({"*": 2.0}, {}, {"*": 1.0})


def test_waiting_places_are_one_based_and_only_for_waiting_entries(store: Store) -> None:
    _entry(store, "job-a", "default", "waiting", position=0, reason="no_capacity")
    _entry(store, "job-b", "default", "waiting", position=4, reason="reserved_for:job-a")
    _entry(store, "job-c", "default", "waiting")  # no pass has looked at it yet
    _entry(store, "job-d", "default", "admitted", position=1)
    with store.read() as session:
        places = waiting_places(session, ["job-a", "job-b", "job-c", "job-d", "job-e"])
        assert waiting_places(session, []) == {}
    assert {job: (p.queue, p.position, p.reason) for job, p in places.items()} == {
        "job-a": ("default", 1, "no_capacity"),
        "job-b": ("default", 5, "reserved_for:job-a"),
        "job-c": ("default", None, None),
    }
