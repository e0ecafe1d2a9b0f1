"""A submit to a queue with a quota, decided alone (services/queue_usage.py): the same verdicts
as the full admission pass it stands for, with the usage counted once and followed through the
control worker's own admissions, and counted again after a release or another worker's write.
On SQLite and PostgreSQL, one control worker and two (two engines on one database)."""

from __future__ import annotations

import random
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from gpuflow.scheduler.model import Placement
from gpuflow.services import queue_entries, queue_usage
from gpuflow.services.admission import run_pass_in
from gpuflow.services.capacity import release_allocation_in
from gpuflow.services.fleets import apply_fleet
from gpuflow.services.queue_entries import enter_at_submit_in, leave_queue_in
from gpuflow.services.queues import apply_queue, queues_in
from gpuflow.specs import FleetSpec, JobSpec, QueueSpec
from gpuflow.store.db import Store

T0 = datetime(2026, 11, 1, tzinfo=UTC)
FLEET = {
    "type": "fleet",
    "name": "lab",
    "kind": "sim",
    "hosts": [
        *(
            {"name": f"a{i}", "cpus": 64, "gpus": [{"name": "A100", "memory": "80GB", "count": 4}]}
            for i in range(4)
        ),
        *(
            {"name": f"l{i}", "cpus": 32, "gpus": [{"name": "L4", "memory": "24GB", "count": 2}]}
            for i in range(2)
        ),
    ],
}
QUEUES = [
    QueueSpec(name="research", gpus=8, cohort="lab", borrowing_limit=4),
    QueueSpec(name="lab2", gpus=4, cohort="lab"),
    QueueSpec(name="prod", gpus={"A100": 6, "L4": 2}, cohort="ops", lending_limit=3),
    QueueSpec(name="infra", gpus={"A100": 4, "L4": 1}, cohort="ops", borrowing_limit=2),
    QueueSpec(name="solo", gpus=4),
]
ASKS = ["A100:1", "A100:2", "A100:4", "L4:1", "24GB..:1", "A100:0.5"]
Verdict = tuple[Any, ...]


def _setup(store: Store) -> None:
    apply_fleet(store, FleetSpec.model_validate(FLEET))
    for queue in QUEUES:
        apply_queue(store, queue)


def _stream(seed: int, steps: int = 120) -> list[tuple[str, Any]]:
    rng = random.Random(seed)
    ops: list[tuple[str, Any]] = []
    for k in range(steps):
        if k > 5 and rng.random() < 0.4:
            ops.append(("release", rng.random()))
        else:
            queue = rng.choice(["research", "lab2", "prod", "infra", "solo", "default"])
            ops.append(("submit", (k, queue, rng.choice(ASKS), rng.random() < 0.1)))
    return ops


def _run(stores: list[Store], ops: list[tuple[str, Any]]) -> list[Verdict]:
    """The stream through the submits' own path, each op on the next store in turn (two
    stores: two control workers); a release is followed by a pass, as the loop's wake is."""
    seen: list[Verdict] = []
    running: list[str] = []
    for index, (kind, arg) in enumerate(ops):
        store = stores[index % len(stores)]
        with store.placement_transaction() as session:
            if kind == "submit":
                k, queue, gpu, may_wait = arg
                retry = {"retry": {"on_events": ["no-capacity"], "duration": "1h"}}
                spec = JobSpec.model_validate(
                    {
                        "name": f"j{k}",
                        "commands": ["true"],
                        "queue": queue,
                        "resources": {"gpu": gpu},
                        **(retry if may_wait else {}),
                    }
                )
                verdict = enter_at_submit_in(
                    session, job_id=f"job-{k}", run_id="r", spec=spec, at=T0 + timedelta(seconds=k)
                )
                placed = verdict.placement
                if placed is not None:
                    running.append(f"job-{k}")
                seen.append(("submit", k, _where(placed), bool(verdict.refused)))
            elif running:
                job_id = running.pop(int(arg * len(running)))
                release_allocation_in(session, job_id=job_id)
                leave_queue_in(session, job_id=job_id)
                outcome = run_pass_in(session, reservation=None)
                admitted = sorted((a.job_id, _where(a.placement)) for a in outcome.admitted)
                running.extend(job_id for job_id, _ in admitted)
                seen.append(("release", job_id, admitted))
    return seen


def _where(placement: Placement | None) -> Any:
    if placement is None:
        return None
    return [
        (node.host_name, tuple(node.gpu_indices), node.gpu_fraction) for node in placement.nodes
    ]


def _counting(monkeypatch: pytest.MonkeyPatch) -> Callable[[], int]:
    decided = [0]
    original = queue_entries._admitted_within_quota

    def counted(*args: Any) -> Any:
        verdict = original(*args)
        decided[0] += verdict is not None
        return verdict

    monkeypatch.setattr(queue_entries, "_admitted_within_quota", counted)
    return lambda: decided[0]


@pytest.mark.parametrize("workers", [1, 2])
def test_submits_decided_alone_match_the_full_pass(
    store: Store, tmp_path: Any, monkeypatch: pytest.MonkeyPatch, workers: int
) -> None:
    ops = _stream(seed=workers)
    reference = Store(f"sqlite:///{tmp_path / 'reference.db'}").init()
    try:
        _setup(reference)
        with monkeypatch.context() as patched:  # every such submit runs the full pass
            patched.setattr(queue_entries, "_admitted_within_quota", lambda *_: None)
            expected = _run([reference], ops)
    finally:
        reference.dispose()
    _setup(store)
    decided = _counting(monkeypatch)
    others = [Store(store.url) for _ in range(workers - 1)]
    try:
        assert _run([store, *others], ops) == expected
    finally:
        for other in others:
            other.dispose()
    assert decided() >= 10  # the stream exercised the path it checks


def test_usage_is_counted_again_after_another_workers_write(store: Store) -> None:
    """A second engine admits a job: the first's count, kept from before, is stale, and the
    allocations counter says so."""
    _setup(store)
    other = Store(store.url)
    try:
        with store.placement_transaction() as session:
            quotas, first = queue_usage.quotas_now(session, queues_in(session))
            assert quotas.usage["research"].get("*", 0.0) == 0.0
        with other.placement_transaction() as session:
            spec = JobSpec.model_validate(
                {
                    "name": "x",
                    "commands": ["true"],
                    "queue": "research",
                    "resources": {"gpu": "A100:2"},
                }
            )
            verdict = enter_at_submit_in(session, job_id="job-x", run_id="r", spec=spec, at=T0)
            assert verdict.placement is not None
        with store.placement_transaction() as session:
            quotas, now = queue_usage.quotas_now(session, queues_in(session))
            assert now != first
            assert quotas.usage["research"]["*"] == 2.0
    finally:
        other.dispose()


def test_a_queue_fills_to_its_quota_and_borrowing_through_submits_decided_alone(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """research (8 GPUs, borrowing up to 4 of lab2's idle 4) takes 12 one-GPU jobs one after
    another, each decided alone on the usage its predecessors' admissions left; the 13th fits a
    host but not the quota: it is the full pass's to hold."""
    _setup(store)
    decided = _counting(monkeypatch)
    verdicts = []
    for k in range(13):
        spec = JobSpec.model_validate(
            {
                "name": f"r{k}",
                "commands": ["true"],
                "queue": "research",
                "resources": {"gpu": "A100:1"},
            }
        )
        with store.placement_transaction() as session:
            verdicts.append(
                enter_at_submit_in(session, job_id=f"job-r{k}", run_id="r", spec=spec, at=T0)
            )
    assert [v.placement is not None for v in verdicts] == [True] * 12 + [False]
    assert decided() == 12
    with store.placement_transaction() as session:
        quotas, _ = queue_usage.quotas_now(session, queues_in(session))
    assert quotas.usage["research"]["*"] == 12.0


def test_an_admission_rolled_back_leaves_nothing_counted(store: Store) -> None:
    """A submit admitted on the kept count, in a transaction that then rolled back, stayed in
    the count under the counter's next value; another worker's commit brought the database's
    counter to that value, and the phantom job passed for running (research at 3 GPUs, not 1)."""
    _setup(store)
    other = Store(store.url)

    def spec(name: str, gpu: str) -> JobSpec:
        return JobSpec.model_validate(
            {"name": name, "commands": ["true"], "queue": "research", "resources": {"gpu": gpu}}
        )

    try:
        with store.placement_transaction() as session:  # counted before: the kept count
            queue_usage.quotas_now(session, queues_in(session))
        with pytest.raises(RuntimeError), store.placement_transaction() as session:
            verdict = enter_at_submit_in(
                session, job_id="job-x", run_id="r", spec=spec("x", "A100:2"), at=T0
            )
            assert verdict.placement is not None
            raise RuntimeError("the transaction fails after the admission")
        with other.placement_transaction() as session:
            enter_at_submit_in(session, job_id="job-y", run_id="r", spec=spec("y", "A100:1"), at=T0)
        with store.placement_transaction() as session:
            quotas, _ = queue_usage.quotas_now(session, queues_in(session))
        assert quotas.usage["research"]["*"] == 1.0
    finally:
        other.dispose()
