"""The mix in use in the warm fleet state (gpuflow/services/warm.py, services/mix.py): after any
stream of job writes it is the one a cold read gives, and until the learned mix drifts from it
it stays the same list, so the scorer keeps what it prepared for it."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from sqlalchemy import update

from gpuflow.scheduler import mix as pure_mix
from gpuflow.scheduler.mix import DRIFT, drift, shares_of
from gpuflow.services.capacity import read_snapshot, take_allocation
from gpuflow.services.fleets import apply_fleet
from gpuflow.services.mix import fleet_mix
from gpuflow.services.warm import WarmCapacity, warm_capacity
from gpuflow.status import JobStatus
from gpuflow.store.db import Store
from gpuflow.store.tables import JobRow
from tests.unit.store.test_warm import (
    REQUESTS,
    EmptyDatabase,
    _fleet_spec,
    _job,
    _look,
    _memory_checked,
    empty_database,
)

__all__ = ["empty_database"]  # the fixture, shared with test_warm.py

START = datetime(2026, 1, 1, tzinfo=UTC)
HISTORY = 400
"""Jobs each example starts with: more than fleet a's window reads, so its checkpoints are a
fixed number of jobs apart (a dozen, see `_drift`)."""


@pytest.fixture(autouse=True)
def _drift() -> Iterator[None]:
    # Checkpoints every few jobs on a fleet of a few GPUs (at the real drift, dozens apart).
    with mock.patch.object(pure_mix, "CHECKPOINT_DRIFT", 0.075):
        yield


def _row(job_id: str, gpu: Any, minute: float, fleet: str | None, status: JobStatus) -> JobRow:
    spec = _job(job_id, gpu).model_dump(mode="json")
    return JobRow(
        id=job_id,
        name=job_id,
        status=status,
        spec=spec,
        fleet=fleet,
        submitted_at=START + timedelta(minutes=minute),
    )


def _history(store: Store) -> None:
    with store.session() as session:
        for n in range(HISTORY):
            fleet = "a" if n % 3 else None
            status = JobStatus.DONE if fleet else JobStatus.PENDING
            session.add(_row(f"job-old-{n}", REQUESTS[n % len(REQUESTS)], n, fleet, status))
        session.commit()


OPS = st.one_of(
    st.tuples(
        st.just("submit"),
        st.sampled_from(REQUESTS),
        st.sampled_from([None, "a", "b"]),
        st.sampled_from([JobStatus.PENDING, JobStatus.DONE]),
        st.booleans(),  # True: submitted long ago (a late commit); False: the newest
    ),
    st.tuples(st.just("place"), st.integers(0, HISTORY - 1), st.sampled_from(["a", "b"])),
    st.tuples(st.just("end"), st.integers(0, HISTORY - 1)),
    st.tuples(st.just("take"), st.sampled_from(REQUESTS)),
)


Op = tuple[bool, tuple[Any, ...], tuple[int, ...]]

EVERY_KIND: list[Op] = [  # each kind of job write, seen by both workers
    (False, ("submit", "A100:1", "a", JobStatus.DONE, False), (0, 1)),
    (True, ("submit", 0.5, None, JobStatus.PENDING, False), (0, 1)),
    (False, ("end", 3), (0, 1)),  # a pending job without a fleet ends: it leaves the window
    (True, ("place", 6, "b"), (0, 1)),  # ... or goes to another fleet
    (False, ("submit", "A100:2", "a", JobStatus.DONE, True), (0, 1)),  # a late commit
    (True, ("take", "A100:1"), (0, 1)),
]


DRIFTING: list[Op] = [  # a kind new to fleet a, until the mix in use moves
    (n % 2 == 1, ("submit", 0.25, "a", JobStatus.DONE, False), (0, 1)) for n in range(25)
]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@example(ops=EVERY_KIND)
@example(ops=DRIFTING)
@given(
    ops=st.lists(
        st.tuples(st.booleans(), OPS, st.sampled_from([(), (0,), (1,), (0, 1)])),
        min_size=1,
        max_size=25,
    )
)
def test_the_warm_mix_is_the_cold_one_after_any_job_writes(
    empty_database: EmptyDatabase, ops: list[Op]
) -> None:
    """Two workers on one database; jobs are submitted (the newest, or late with an old
    submission time), placed on a fleet, ended, and taken through the warm path; every catch-up
    leaves the warm memory (the mix included) equal to a cold read."""
    with empty_database() as url:
        _run(url, ops)


def _run(url: str, ops: list[Op]) -> None:
    with _memory_checked() as checks:
        workers = [Store(url).init(), Store(url)]
        try:
            apply_fleet(workers[0], _fleet_spec("a", [4, 4]))
            apply_fleet(workers[0], _fleet_spec("b", [2]))
            _history(workers[0])
            for worker in workers:
                _look(worker)
            for n, (second, op, looks) in enumerate(ops):
                store = workers[second]
                if op[0] == "submit":
                    minute = -n - 1 if op[4] else HISTORY + n
                    with store.session() as session:
                        session.add(_row(f"job-new-{n}", op[1], minute, op[2], op[3]))
                        session.commit()
                elif op[0] in ("place", "end"):
                    values: dict[str, Any] = (
                        {"fleet": op[2], "status": JobStatus.RUNNING}
                        if op[0] == "place"
                        else {"status": JobStatus.FAILED}
                    )
                    with store.session() as session:
                        session.execute(
                            update(JobRow).where(JobRow.id == f"job-old-{op[1]}").values(**values)
                        )
                        session.commit()
                else:
                    take_allocation(store, job_id=f"job-take-{n}", attempt=1, job=_job("t", op[1]))
                for worker in looks:
                    _look(workers[worker])
            assert checks[0] >= 2 + sum(len(looks) for _, _, looks in ops)
        finally:
            for store in workers:
                store.dispose()


def _mix_of(store: Store) -> tuple[list[Any], list[Any]]:
    with store.placement_transaction() as session:
        state = warm_capacity(session)
        versions = state.hold(session)
        assert versions is not None
        snapshot = state.catch_up(session, versions)
        return snapshot.fleets[0].workload, snapshot.fleets[1].workload


def test_the_mix_list_is_kept_until_the_learned_mix_drifts(sqlite_store: Store) -> None:
    """The learned mix moves at checkpoint jobs, the mix in use only once the learned one has
    drifted from it by DRIFT: until then each fleet's `workload` is the very same list (the
    scorer keys what it prepared by it), then it is the learned mix's, stored for every reader."""
    store = sqlite_store
    apply_fleet(store, _fleet_spec("a", [4, 4]))
    apply_fleet(store, _fleet_spec("b", [2]))
    _history(store)
    first_a, first_b = _mix_of(store)
    in_use = shares_of(first_a)
    learned_seen: set[int] = set()
    for n in range(200):
        with store.session() as session:
            session.add(_row(f"job-quarter-{n}", 0.25, HISTORY + n, "a", JobStatus.DONE))
            session.commit()
        with store.read() as session:
            learned = fleet_mix(session, "a", 8)
        learned_seen.add(id(learned))
        a, b = _mix_of(store)
        assert b is first_b  # the jobs are fleet a's only
        if drift(in_use, shares_of(learned.requests)) < DRIFT:
            assert a is first_a
            continue
        assert a is not first_a and a == list(learned.requests)
        with store.read() as session:  # a cold read, as another worker's, agrees
            assert read_snapshot(session).fleets[0].workload == a
        break
    else:
        raise AssertionError("200 jobs of a new kind never moved the mix in use")
    assert len(learned_seen) > 2  # the learned mix moved at checkpoints in between


def test_a_warm_state_without_mix_catch_up_fails_the_check(
    empty_database: EmptyDatabase,
) -> None:
    """The hypothesis test above can fail: with the mix never refreshed, jobs that move the
    learned mix far enough leave the warm mix behind a cold read."""
    with (
        empty_database() as url,
        mock.patch.object(WarmCapacity, "_refresh_mix", lambda self, session: None),
        pytest.raises(AssertionError),
    ):
        _run(url, DRIFTING)
