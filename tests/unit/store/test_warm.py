"""The warm fleet state (gpuflow/services/warm.py): every decision it makes is the one a cold
read of the database makes, no GPU is ever given twice, and two control workers racing for the
last GPU get it once; on SQLite and PostgreSQL."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import tempfile
import threading
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from sqlmodel import Session, SQLModel, select

from gpuflow.errors import GpuflowError
from gpuflow.scheduler import place
from gpuflow.scheduler.model import Placement, Snapshot, Unschedulable
from gpuflow.services import mix
from gpuflow.services.capacity import read_snapshot, release_allocation, take_allocation
from gpuflow.services.changes import Versions
from gpuflow.services.fleets import apply_fleet, delete_fleet, set_host_state
from gpuflow.services.snapshot import read_fleets
from gpuflow.services.warm import WarmCapacity, warm_capacity
from gpuflow.specs import FleetSpec, JobSpec
from gpuflow.status import HostState
from gpuflow.store.db import Store
from gpuflow.store.tables import AllocationRow
from tests.conftest import PG_ADMIN_URL, _pg_available

EPSILON = 1e-9
REQUESTS: list[Any] = ["A100:1", "A100:2", "A100:4", 0.5, 0.25, "H100:1"]


EmptyDatabase = Callable[[], AbstractContextManager[str]]


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def empty_database(request: pytest.FixtureRequest) -> Iterator[EmptyDatabase]:
    """Gives the URL of an empty database for each hypothesis example: a new SQLite file, or
    this module's PostgreSQL database with its tables dropped (a database per example would
    cost more than the example)."""
    if request.param == "sqlite":

        @contextlib.contextmanager
        def sqlite() -> Iterator[str]:
            with tempfile.TemporaryDirectory() as home:
                yield f"sqlite:///{Path(home) / 'gpuflow.db'}"

        yield sqlite
        return
    reason = _pg_available()
    if reason is not None:
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    import psycopg

    name = f"gpuflow_warm_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = f"{PG_ADMIN_URL.rsplit('/', 1)[0]}/{name}"

    @contextlib.contextmanager
    def postgresql() -> Iterator[str]:
        store = Store(url)
        SQLModel.metadata.drop_all(store.engine)
        store.dispose()
        # What this process learned of the jobs of the database of that URL is gone with it.
        mix._KINDS.clear()
        mix._MIXES.clear()
        yield url

    try:
        yield postgresql
    finally:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _fleet_spec(name: str, sizes: list[int], model: str = "A100") -> FleetSpec:
    return FleetSpec.model_validate(
        {
            "type": "fleet",
            "name": name,
            "kind": "sim",
            "hosts": [
                {
                    "name": f"h{i}",
                    "cpus": 16,
                    "gpus": [{"name": model, "memory": "80GB", "count": n}],
                }
                for i, n in enumerate(sizes)
            ],
        }
    )


def _job(name: str, gpu: Any) -> JobSpec:
    return JobSpec.model_validate(
        {"name": name, "commands": ["true"], "resources": {"gpu": gpu, "cpu": 1}}
    )


def _cold(store: Store, job: JobSpec, fleets: list[str] | None) -> Placement | Unschedulable:
    with store.read() as session:
        return place(job, read_snapshot(session, fleets=fleets), fleets=fleets)


def _aged(text: str) -> str:
    # How long ago a lost host was heard is worded at each read: a second may pass between two.
    return re.sub(r"last heartbeat \S+ ago", "last heartbeat ? ago", text)


def _words(result: Placement | Unschedulable) -> Any:
    if isinstance(result, Placement):
        return result
    return [_aged(line) for line in result.lines]


def _plain(snapshot: Snapshot) -> Any:
    """The snapshot as plain data that two reads of one database state give alike: fleets and
    hosts in order, each host's state and usage (GPU shares, blocks, CPUs, memory, disk)."""
    fleets = []
    for fleet in snapshot.fleets:
        hosts = []
        for host in fleet.hosts:
            data = dataclasses.asdict(host)
            data["state_detail"] = host.state_detail and _aged(host.state_detail)
            data["blocks_used"] = sorted(host.blocks_used)
            data["cpus_used"] = round(host.cpus_used, 9)
            data["gpus"] = [
                {**dataclasses.asdict(gpu), "used": round(gpu.used, 9)} for gpu in host.gpus
            ]
            hosts.append(data)
        fleets.append(
            {
                "name": fleet.name,
                "kind": fleet.kind,
                "scorer": fleet.scorer,
                "scorer_weights": fleet.scorer_weights,
                "workload": fleet.workload,
                "hosts": hosts,
            }
        )
    return fleets


@contextlib.contextmanager
def _memory_checked() -> Iterator[list[int]]:
    """Every catch-up of a warm state (in the product's own placement transaction, before any
    verify) leaves memory equal to a cold read of the database in that same transaction: the
    snapshot (the fleets' mixes learned afresh), and the allocations and state rows it keeps per
    host. Yields the count of checks."""
    checks = [0]
    original = WarmCapacity.catch_up

    def catch_up(state: WarmCapacity, session: Session, versions: Versions) -> Snapshot:
        snapshot = original(state, session, versions)
        with mock.patch.dict(mix._MIXES, clear=True):  # the mixes learned afresh, not kept
            cold, uses, rows = read_fleets(session)
        assert _plain(snapshot) == _plain(cold)
        assert {host.id for host in snapshot.hosts()} == {host.id for host in cold.hosts()}
        hosts = [host.id for host in cold.hosts()]
        assert {h: state.uses.get(h, []) for h in hosts} == {h: uses.get(h, []) for h in hosts}
        assert {h: state.states[h][0] for h in hosts} == {h: rows[h].state for h in hosts}
        checks[0] += 1
        return snapshot

    with mock.patch.object(WarmCapacity, "catch_up", catch_up):
        yield checks


def _look(store: Store) -> None:
    """Catch the store's warm state up as a placement does (same lock, same calls), writing
    nothing but what a catch-up writes (a fleet's new mix in use): `_memory_checked` compares it
    with the database."""
    with store.placement_transaction() as session:
        state = warm_capacity(session)
        versions = state.hold(session)
        if versions is not None:
            state.catch_up(session, versions)


def _never_over_allocated(store: Store) -> None:
    with store.read() as session:
        rows = list(session.exec(select(AllocationRow)))
    gpus: dict[tuple[str, int], float] = defaultdict(float)
    for row in rows:
        for index in row.gpu_indices:
            gpus[row.host_id, index] += row.gpu_fraction or 1.0
    assert all(used <= 1 + EPSILON for used in gpus.values()), gpus


OPS = st.one_of(
    st.tuples(
        st.just("apply"),
        st.sampled_from(["a", "b"]),
        st.lists(st.integers(1, 4), min_size=1, max_size=3),
        st.sampled_from(["A100", "H100"]),
    ),
    st.tuples(st.just("delete"), st.sampled_from(["a", "b"])),
    st.tuples(
        st.just("take"),
        st.sampled_from(REQUESTS),
        st.sampled_from([None, ["a"], ["b"], ["a", "b"], ["c"]]),
    ),
    st.tuples(st.just("take"), st.sampled_from(REQUESTS), st.none()),
    st.tuples(st.just("release"), st.integers(0, 30)),
    st.tuples(
        st.just("state"),
        st.sampled_from(["a", "b"]),
        st.integers(0, 2),
        st.sampled_from([HostState.READY, HostState.NOT_READY, HostState.UNREACHABLE]),
    ),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# Each catch-up path once, whatever the draw: allocations (worker 0 after worker 1's take),
# states (worker 1 after a state change), structure (worker 1 after a second fleet).
@example(
    ops=[
        (False, ("apply", "a", [2], "A100"), (0, 1)),
        (True, ("take", "A100:1", None), (0,)),
        (False, ("state", "a", 0, HostState.NOT_READY), (1,)),
        (False, ("apply", "b", [1], "A100"), (0, 1)),
    ]
)
@given(
    ops=st.lists(
        st.tuples(st.booleans(), OPS, st.sampled_from([(), (0,), (1,), (0, 1)])),
        min_size=1,
        max_size=30,
    )
)
def test_warm_decisions_equal_cold_ones_and_never_overallocate(
    empty_database: EmptyDatabase,
    ops: list[tuple[bool, tuple[Any, ...], tuple[int, ...]]],
) -> None:
    """Two workers (two Stores on one database) take turns at random writes; before every
    take, the decision a cold read gives is the one the worker's warm state gives, and every
    catch-up (a take's, or a look some workers take after a step) leaves the warm memory equal
    to a cold read."""
    with empty_database() as url, _memory_checked() as checks:
        workers = [Store(url).init(), Store(url)]
        held: list[str] = []
        try:
            for n, (second, op, looks) in enumerate(ops):
                store = workers[second]
                if op[0] == "apply":
                    apply_fleet(store, _fleet_spec(op[1], op[2], op[3]))
                elif op[0] == "delete":
                    with contextlib.suppress(GpuflowError):  # unknown, or still holds jobs
                        delete_fleet(store, op[1])
                elif op[0] == "take":
                    job = _job(f"j{n}", op[1])
                    cold = _cold(store, job, op[2])
                    warm = take_allocation(
                        store, job_id=f"job-{n}", attempt=1, job=job, fleets=op[2]
                    )
                    assert _words(warm) == _words(cold)
                    if isinstance(warm, Placement):
                        held.append(f"job-{n}")
                elif op[0] == "release" and held:
                    release_allocation(store, job_id=held.pop(op[1] % len(held)))
                elif op[0] == "state":
                    set_host_state(store, f"{op[1]}/h{op[2]}", op[3], "test")
                _never_over_allocated(store)
                for worker in looks:
                    _look(workers[worker])
            assert checks[0] >= sum((op[0] == "take") + len(looks) for _, op, looks in ops)
        finally:
            for store in workers:
                store.dispose()


def _warm_up(store: Store) -> None:
    """Build the store's warm state (a request nothing can take writes nothing)."""
    result = take_allocation(store, job_id="job-warm", attempt=1, job=_job("warm", "A100:64"))
    assert isinstance(result, Unschedulable)


def test_two_workers_race_for_the_last_gpu_and_one_wins(store: Store) -> None:
    apply_fleet(store, _fleet_spec("a", [2]))
    other = Store(store.url)
    try:
        _warm_up(store)
        _warm_up(other)
        # The first worker takes a GPU: the second one's warm state does not know yet.
        assert isinstance(
            take_allocation(store, job_id="job-0", attempt=1, job=_job("x", "A100:1")), Placement
        )
        results: dict[str, Placement | Unschedulable] = {}
        barrier = threading.Barrier(2)

        def race(worker: Store, job_id: str) -> None:
            barrier.wait()
            results[job_id] = take_allocation(
                worker, job_id=job_id, attempt=1, job=_job(job_id, "A100:1")
            )

        threads = [
            threading.Thread(target=race, args=(worker, f"job-{i}"))
            for i, worker in ((1, store), (2, other))
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        won = [job_id for job_id, result in results.items() if isinstance(result, Placement)]
        assert len(won) == 1, results
        _never_over_allocated(store)
    finally:
        other.dispose()


def test_a_stale_worker_never_gives_a_taken_gpu(store: Store) -> None:
    apply_fleet(store, _fleet_spec("a", [1]))
    other = Store(store.url)
    try:
        _warm_up(store)
        _warm_up(other)
        assert isinstance(
            take_allocation(store, job_id="job-1", attempt=1, job=_job("x", "A100:1")), Placement
        )
        late = take_allocation(other, job_id="job-2", attempt=1, job=_job("y", "A100:1"))
        assert isinstance(late, Unschedulable)
        release_allocation(store, job_id="job-1")
        again = take_allocation(other, job_id="job-3", attempt=1, job=_job("z", "A100:1"))
        assert isinstance(again, Placement)
        _never_over_allocated(store)
    finally:
        other.dispose()


def test_a_write_that_was_not_counted_costs_a_retry_not_a_gpu(store: Store) -> None:
    """An allocation written without bumping the counter (an older worker, a hand edit): the
    re-read of the chosen host before writing catches it."""
    apply_fleet(store, _fleet_spec("a", [1, 1]))
    _warm_up(store)
    with store.session() as session:
        session.add(
            AllocationRow(
                job_id="job-hand", attempt=1, rank=0, fleet="a", host_id="a/h0", gpu_indices=[0]
            )
        )
        session.commit()
    first = take_allocation(store, job_id="job-1", attempt=1, job=_job("x", "A100:1"))
    assert isinstance(first, Placement) and first.nodes[0].host_id == "a/h1"
    second = take_allocation(store, job_id="job-2", attempt=1, job=_job("y", "A100:1"))
    assert isinstance(second, Unschedulable)
    _never_over_allocated(store)


def test_a_rolled_back_take_leaves_nothing_in_memory(store: Store) -> None:
    apply_fleet(store, _fleet_spec("a", [1]))
    _warm_up(store)
    from gpuflow.services.capacity import take_allocation_in

    try:
        with store.placement_transaction() as session:
            result = take_allocation_in(session, job_id="job-1", attempt=1, job=_job("x", "A100:1"))
            assert isinstance(result, Placement)
            raise RuntimeError("the activity failed after placing")
    except RuntimeError:
        pass
    again = take_allocation(store, job_id="job-2", attempt=1, job=_job("y", "A100:1"))
    assert isinstance(again, Placement)
