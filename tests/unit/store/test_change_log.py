"""The change log (gpuflow/services/changes.py): a warm state that missed another control
worker's writes of allocations or host readiness re-reads the hosts those writes changed, not
every host, and reads every host's whenever the log cannot say; on SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from unittest import mock

import pytest
from sqlalchemy import event, func, text
from sqlmodel import select

from gpuflow.scheduler.model import Placement
from gpuflow.services import changes, snapshot, warm
from gpuflow.services.capacity import release_allocation, take_allocation
from gpuflow.services.changes import bump, changed_hosts
from gpuflow.services.fleets import apply_fleet, set_host_state
from gpuflow.services.warm import WarmCapacity
from gpuflow.status import HostState
from gpuflow.store.db import Store
from gpuflow.store.tables import AllocationRow, CapacityChangeRow
from tests.unit.store.test_warm import (
    _fleet_spec,
    _job,
    _memory_checked,
    _never_over_allocated,
    _warm_up,
)


@pytest.fixture
def two(store: Store) -> Iterator[tuple[Store, Store]]:
    """Two control workers (two engines) on one database with a fleet of eight 1-GPU hosts,
    both warm."""
    apply_fleet(store, _fleet_spec("a", [1] * 8))
    other = Store(store.url)
    try:
        _warm_up(store)
        _warm_up(other)
        yield store, other
    finally:
        other.dispose()


def _state(store: Store) -> WarmCapacity:
    with store.session() as session:  # the engine placements write through
        return warm.warm_capacity(session)


def _reads(calls: list[list[str] | None]) -> Any:
    """read_uses, recording which hosts each call asked for (None: every host)."""
    original = snapshot.read_uses

    def read_uses(session: Any, host_ids: list[str] | None) -> Any:
        calls.append(None if host_ids is None else list(host_ids))
        return original(session, host_ids)

    return mock.patch.object(warm, "read_uses", read_uses)


def _take(store: Store, job_id: str) -> Placement:
    result = take_allocation(store, job_id=job_id, attempt=1, job=_job(job_id, "A100:1"))
    assert isinstance(result, Placement), result
    return result


def test_a_worker_behind_reads_only_the_hosts_the_other_changed(two: tuple[Store, Store]) -> None:
    store, other = two
    hosts = {f"job-{n}": _take(other, f"job-{n}").nodes[0].host_id for n in range(3)}
    taken = set(hosts.values())
    release_allocation(other, job_id="job-1")
    state = _state(store)
    reloads, partial = state.reloads, state.partial_reads
    calls: list[list[str] | None] = []
    with _reads(calls), _memory_checked() as checks:
        mine = _take(store, "job-mine")
    # one catch-up, of the three hosts the other worker's four writes named
    assert calls[:1] == [sorted(taken)], calls
    assert (state.reloads, state.partial_reads, checks[0]) == (reloads, partial + 1, 1)
    # not on a host the other worker still holds (1 GPU each)
    assert mine.nodes[0].host_id not in {hosts["job-0"], hosts["job-2"]}
    _never_over_allocated(store)


def test_a_version_the_log_lacks_means_every_host_is_read(two: tuple[Store, Store]) -> None:
    """A write counted but not logged (a gpuflow from before the log): the reader cannot know
    which hosts it changed, so it reads them all and never gives that GPU again."""
    store, other = two
    _take(other, "job-logged")
    with other.placement_transaction() as session:
        session.add(
            AllocationRow(
                job_id="job-old", attempt=1, rank=0, fleet="a", host_id="a/h7", gpu_indices=[0]
            )
        )
        session.flush()
        bump(session, "allocations")
    state = _state(store)
    partial = state.partial_reads
    calls: list[list[str] | None] = []
    with _reads(calls), _memory_checked():
        placed = {_take(store, f"mine-{n}").nodes[0].host_id for n in range(6)}
    assert calls[0] is None and state.partial_reads == partial
    assert "a/h7" not in placed
    _never_over_allocated(store)


def test_the_log_keeps_only_its_newest_versions(
    two: tuple[Store, Store], monkeypatch: pytest.MonkeyPatch
) -> None:
    store, other = two
    monkeypatch.setattr(changes, "KEPT_VERSIONS", 8)
    monkeypatch.setattr(changes, "_PRUNE_EVERY", 2)
    for n in range(15):
        _take(other, f"job-{n}")
        release_allocation(other, job_id=f"job-{n}")
    with store.read() as session:
        logged = select(CapacityChangeRow.version).where(CapacityChangeRow.kind == "allocations")
        versions = session.exec(logged).all()
        newest = max(versions)
        assert min(versions) > newest - 8 - 2
        assert set(range(newest - 7, newest + 1)) <= set(versions)
        # within the kept versions the log answers; further back it cannot
        assert changed_hosts(session, "allocations", newest - 8, newest) is not None
        assert changed_hosts(session, "allocations", newest - 12, newest) is None
    calls: list[list[str] | None] = []
    with _reads(calls), _memory_checked():
        _take(store, "job-mine")  # 30 versions behind: every host read, nothing given twice
    assert calls[0] is None
    _never_over_allocated(store)


def test_counting_from_zero_again_starts_an_empty_log(store: Store) -> None:
    """A database whose counter row was lost gets it back at init, from zero: the log of the
    old count goes with it, or its versions would name hosts the new ones never changed."""
    apply_fleet(store, _fleet_spec("a", [1, 1]))
    _take(store, "job-0")
    with store.session() as session:
        session.connection().execute(text("DELETE FROM capacity_versions"))
        session.commit()
    Store(store.url).init().dispose()
    with store.read() as session:
        count = session.exec(select(func.count()).select_from(CapacityChangeRow)).one()
    assert count == 0


def test_a_worker_behind_reads_the_states_of_the_hosts_that_changed(
    two: tuple[Store, Store],
) -> None:
    """Host readiness set by another worker (or a health check): the catch-up reads the state
    rows of those hosts only, and no job goes to a host that is not ready."""
    store, other = two
    set_host_state(other, "a/h0", HostState.NOT_READY, "agent not answering")
    set_host_state(other, "a/h3", HostState.UNREACHABLE, "ssh refused")
    state = _state(store)
    reloads, partial = state.reloads, state.partial_reads
    hosts: list[str] = []

    def seen(conn: Any, cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        if "FROM hosts" in statement and "WHERE" in statement:
            hosts.append(repr(parameters))

    event.listen(store.engine, "before_cursor_execute", seen)
    try:
        with _memory_checked() as checks:
            placed = {_take(store, f"mine-{n}").nodes[0].host_id for n in range(6)}
    finally:
        event.remove(store.engine, "before_cursor_execute", seen)
    assert placed.isdisjoint({"a/h0", "a/h3"}) and len(placed) == 6
    assert (state.reloads, state.partial_reads) == (reloads, partial + 1)
    assert len(hosts) == 1 and "a/h0" in hosts[0] and "a/h3" in hosts[0], hosts
    assert checks[0] >= 1
