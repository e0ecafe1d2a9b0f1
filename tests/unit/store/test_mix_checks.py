"""The mix in use is compared with the learned mix only at a new comparison checkpoint job
(gpuflow/services/mix.py `checkpoint_at`): between them a placement reads several hundred
job ids, not the window; every reader still agrees; a database made before the `checked` column
gets it from `init`. On SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import event, inspect, text
from sqlmodel import col, select

from gpuflow.scheduler.mix import (
    COMPARE_SPACING,
    DRIFT,
    anchor,
    checkpoint_every,
    checkpoint_reads,
    drift,
    half_life,
    is_checkpoint,
    saturation,
    shares_of,
)
from gpuflow.services import mix
from gpuflow.services.capacity import read_snapshot
from gpuflow.services.fleets import apply_fleet
from gpuflow.services.newest_jobs import JobCounts
from gpuflow.specs import FleetSpec, JobSpec
from gpuflow.status import JobStatus
from gpuflow.store.db import Store
from gpuflow.store.tables import FleetMixRow, JobRow
from tests.unit.store.test_mix import START, _add, _fleet

GPUS = 128


def _big_fleet(store: Store) -> None:
    """16 hosts of 8 GPUs (a half-life of 128 jobs)."""
    hosts = [
        {"name": f"h{k}", "cpus": 64, "gpus": [{"name": "T4", "memory": "16GB", "count": 8}]}
        for k in range(GPUS // 8)
    ]
    spec = {"type": "fleet", "name": "sim", "kind": "sim", "hosts": hosts}
    apply_fleet(store, FleetSpec.model_validate(spec))


def _history(store: Store, count: int) -> None:
    spec = JobSpec.model_validate(
        {"name": "old", "commands": ["true"], "resources": {"gpu": 1, "cpu": 2}}
    ).model_dump(mode="json")
    with store.session() as session:
        for n in range(count):
            at = START - timedelta(minutes=count - n)
            job_id = f"old-{n:04d}"
            row = JobRow(id=job_id, name=job_id, status=JobStatus.DONE, spec=spec, fleet="sim")
            row.submitted_at = at
            session.add(row)
        session.commit()


def test_the_window_is_read_at_new_checkpoints_only(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    life = half_life(GPUS)
    assert checkpoint_every(mix._limit(life), life) > 1
    _big_fleet(store)
    reads: list[Any] = []  # the learned mix of each comparison
    learn = mix.fleet_mix

    def counted(session: Any, fleet: str, gpus: int, *rest: Any) -> Any:
        reads.append(learn(session, fleet, gpus, *rest))
        return reads[-1]

    _history(store, 420)  # enough that a checkpoint comes every 2 jobs or so
    monkeypatch.setattr(mix, "fleet_mix", counted)
    other = Store(store.url)  # another worker's cold reads
    checkpoints: list[str] = []
    try:
        for n in range(40):
            _add(store, f"job-{n:03d}", 0.5 if n < 20 else 2, minute=n)
            with store.placement_transaction() as session:
                in_use = mix.mix_in_use(session, "sim", GPUS)
                at = mix.checkpoint_at(session, "sim", GPUS)
            if not checkpoints or checkpoints[-1] != at:
                checkpoints.append(at)
            assert len(reads) == len(checkpoints), n  # read once per new checkpoint job
            with other.read() as session:
                assert read_snapshot(session).fleets[0].workload == list(in_use.requests)
            with store.read() as session:
                row = session.get(FleetMixRow, "sim")
            assert row is not None and row.checked == at
            # when compared, the mix in use is within DRIFT of the learned mix
            learned = reads[-1].requests
            assert drift(shares_of(in_use.requests), shares_of(learned)) < DRIFT
    finally:
        other.dispose()
    assert 1 < len(checkpoints) < 40


def test_a_database_before_the_checked_column_gets_it(store: Store) -> None:
    """`init` adds the column to an existing table; the stored mix (never compared, as far as
    the column knows) is compared at the next placement, which records where."""
    _fleet(store)
    _add(store, "a", 0.5, minute=0)
    with store.placement_transaction() as session:
        mix.mix_in_use(session, "sim", 4)
    with store.engine.begin() as connection:
        connection.execute(text("ALTER TABLE fleet_mixes DROP COLUMN checked"))
    assert "checked" not in {c["name"] for c in inspect(store.engine).get_columns("fleet_mixes")}
    store.init()
    assert "checked" in {c["name"] for c in inspect(store.engine).get_columns("fleet_mixes")}
    with store.read() as session:
        row = session.get(FleetMixRow, "sim")
        assert row is not None and row.checked is None and row.source == "learned"
    with store.placement_transaction() as session:
        mix.mix_in_use(session, "sim", 4)
        at = mix.checkpoint_at(session, "sim", 4)
    with store.read() as session:
        row = session.get(FleetMixRow, "sim")
        assert row is not None and row.checked == at == "a"


def _checkpoint(store: Store, gpus: int, known: JobCounts | None = None) -> tuple[str, list[str]]:
    """`checkpoint_at` in a placement transaction, and the statements it ran."""
    statements: list[str] = []

    def seen(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        statements.append(statement)

    event.listen(store.engine, "before_cursor_execute", seen)
    try:
        with store.placement_transaction() as session:
            at = mix.checkpoint_at(session, "sim", gpus, known)
    finally:
        event.remove(store.engine, "before_cursor_execute", seen)
    return at, statements


@pytest.mark.parametrize(("gpus", "history"), [(4, 40), (GPUS, 300), (GPUS, 700)])
def test_the_checkpoint_counts_jobs_only_while_the_count_can_move_it(
    store: Store, gpus: int, history: int
) -> None:
    """`checkpoint_at` is the anchor of the newest ids with the fleet's whole count of jobs
    (up to the window's limit), as a reader that counts everything finds it; a fleet whose every
    job is a checkpoint (4 GPUs) reads only the newest ids, without a count."""
    if gpus == GPUS:
        _big_fleet(store)
    else:
        _fleet(store)
    _history(store, history)
    at, statements = _checkpoint(store, gpus)
    life = half_life(gpus)
    limit = mix._limit(life)
    with store.read() as session:
        everything = list(
            session.exec(
                select(JobRow.id).order_by(col(JobRow.submitted_at).desc(), col(JobRow.id).desc())
            )
        )
    most = checkpoint_reads(limit, life)
    newest = everything[:most]
    assert at == newest[anchor(newest, min(len(everything), limit), life, spacing=COMPARE_SPACING)]
    counted = any("count(" in statement.lower() for statement in statements)
    first = min(most, mix.FIRST_INTERVALS * checkpoint_every(limit, life) * COMPARE_SPACING)
    assert counted == (checkpoint_every(limit, life) > 1 and len(everything) >= first)


def _ids(count: int, checkpoints: set[int], every: int) -> list[str]:
    """`count` job ids, newest first, that are checkpoints (for `every`) exactly at these
    positions among the newest 32 (older ones: any)."""
    ids: list[str] = []
    n = 0
    while len(ids) < count:
        n += 1
        job_id = f"j{n:05d}"
        if len(ids) >= 32 or is_checkpoint(job_id, every) == (len(ids) in checkpoints):
            ids.append(job_id)
    return ids


@pytest.mark.parametrize("position", [5, 14])
def test_the_checkpoint_is_found_past_the_ids_read_first(store: Store, position: int) -> None:
    """The newest ids are read a few checkpoint intervals at a time: a checkpoint among them
    takes one read; none among them (position 14, past the 12 read first) takes a second read
    of the whole reach, and the checkpoint is the one a reader of the whole reach finds."""
    _big_fleet(store)
    life = half_life(GPUS)
    limit = mix._limit(life)
    every = checkpoint_every(limit, life) * COMPARE_SPACING
    assert every > 1 and mix.FIRST_INTERVALS * every == 12 < checkpoint_reads(limit, life)
    count = saturation(limit, life) + 10  # the count no longer moves `every`
    newest = _ids(count, {position, 20}, every)
    with store.session() as session:
        for n, job_id in enumerate(newest):
            row = JobRow(id=job_id, name=job_id, status=JobStatus.DONE, spec={}, fleet="sim")
            row.submitted_at = START - timedelta(minutes=n)
            session.add(row)
        session.commit()
    at, statements = _checkpoint(store, GPUS)
    most = checkpoint_reads(limit, life)
    assert at == newest[position] == newest[anchor(newest[:most], limit, life, spacing=2)]
    reads = [statement for statement in statements if "order by" in statement.lower()]
    assert len(reads) == (1 if position < 12 else 2)


def test_a_fleet_seen_with_jobs_enough_is_counted_again_only_once_a_window_read_finds_fewer(
    store: Store,
) -> None:
    """A warm state's saturated fleets skip the count; the next window read (a comparison's)
    finds deletions, and its number of jobs, not a count, gives the checkpoint a cold reader
    finds."""
    _big_fleet(store)
    life = half_life(GPUS)
    enough = saturation(mix._limit(life), life)
    _history(store, enough + 40)

    def checkpoint(known: JobCounts | None) -> tuple[str, bool]:
        at, statements = _checkpoint(store, GPUS, known)
        return at, any("count(" in statement.lower() for statement in statements)

    known = JobCounts()
    cold, _ = checkpoint(None)
    assert checkpoint(known) == (cold, True) and known.saturated == {"sim"}
    assert checkpoint(known) == (cold, False)  # not counted again
    with store.session() as session:  # the oldest jobs deleted: fewer than `enough` left
        for row in session.exec(select(JobRow).order_by(col(JobRow.submitted_at)).limit(80)):
            session.delete(row)
        session.commit()
    with store.placement_transaction() as session:
        mix.fleet_mix(session, "sim", GPUS, known)
    assert known.saturated == set() and known.counted["sim"][1] == enough - 40
    cold, _ = checkpoint(None)
    assert checkpoint(known) == (cold, False)  # the window read counted them


def _newer(store: Store, since: int, count: int) -> None:
    """`count` more jobs after the history, the newest last."""
    with store.session() as session:
        for n in range(since, since + count):
            row = JobRow(id=f"new-{n:04d}", name="new", status=JobStatus.DONE, spec={}, fleet="sim")
            row.submitted_at = START + timedelta(minutes=n + 1)
            session.add(row)
        session.commit()


def test_a_warm_reader_counts_a_young_fleet_once_then_by_the_ids_it_reads(store: Store) -> None:
    """While a fleet has fewer jobs than can move its checkpoints no more, a cold lookup counts
    them every time; a warm state counts once, then adds the jobs newer than the newest it knew
    (among the ids it reads anyway) and finds the checkpoint the cold reader finds while the
    checkpoint interval grows with the jobs. More new jobs than a lookup reads are counted
    again; an older job gone is missed until a window read makes the number exact again."""
    gpus = 1024
    life = half_life(gpus)
    limit = mix._limit(life)
    first = mix.FIRST_INTERVALS * checkpoint_every(limit, life) * COMPARE_SPACING
    _history(store, 150)

    def lookup(known: JobCounts | None) -> tuple[str, bool]:
        at, statements = _checkpoint(store, gpus, known)
        return at, any("count(" in statement.lower() for statement in statements)

    known = JobCounts()
    cold, counted = lookup(None)
    assert counted and lookup(known) == (cold, True)
    added = 0
    for step in (7, 13, 20, 25, 30, 40):
        _newer(store, added, step)
        added += step
        cold, counted = lookup(None)
        assert counted and lookup(known) == (cold, False)
    assert known.counted["sim"][1] == 150 + added
    assert checkpoint_every(150, life) < checkpoint_every(150 + added, life) < limit
    _newer(store, added, first + 1)  # the newest it knew is past the ids a lookup reads
    added += first + 1
    cold, _ = lookup(None)
    assert lookup(known) == (cold, True)
    with store.session() as session:
        old = session.get(JobRow, "old-0000")
        assert old is not None
        session.delete(old)
        session.commit()
    with store.placement_transaction() as session:
        mix.fleet_mix(session, "sim", gpus, known)
    assert known.counted["sim"][1] == 150 + added - 1
    cold, _ = lookup(None)
    assert lookup(known) == (cold, False)
