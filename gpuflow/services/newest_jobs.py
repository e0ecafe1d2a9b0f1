"""A fleet's newest jobs, newest first, as its learned mix reads them (services/mix.py): the
jobs placed on it and those pending without a fleet, by submission time (then id), from the
jobs' index by submission (store/tables.py `JOBS_BY_SUBMISSION`).

Two reads give the same ids. `newest_ids` filters in the database: the cheaper read for a
window's thousands. `newest_few`, for the few hundred a placement transaction reads to find its
fleet's checkpoint job, reads the first rows of the index for every fleet and keeps the fleet's
own, so that no planner statistics can change how it is read: a fresh PostgreSQL database,
whose jobs table autovacuum has not analyzed yet, plans `newest_ids`'s filter as rare and sorts
the whole table instead (752 of 9,000 ids: 3.5 ms against 0.9; analyzed, 1.1 against 0.8;
SQLite 0.48 against 0.45; for 5,376 ids `newest_ids` is cheaper on both: the other fleets' rows
and two more columns cost more than the sort saves).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import func, or_
from sqlalchemy import select as sa_select
from sqlmodel import Session

from gpuflow.status import JobStatus
from gpuflow.store.tables import JobRow

__all__ = ["JobCounts", "count_jobs", "jobs_of", "newest_few", "newest_ids"]

_TABLE = JobRow.__table__.c  # type: ignore[attr-defined]
_PENDING = JobStatus.PENDING.value

MAX_SPREAD = 4.0
"""Rows per id wanted past which `newest_few` leaves a fleet to `newest_ids`: its share of the
newest jobs (under a quarter) is too small for reading everyone's."""
RETRY = 0.97
"""What a fleet left to `newest_ids` has its spread multiplied by at each read: from where a
share of 1% puts it, `newest_few` is tried again after some hundred reads, and a fleet just
past the bound after a few dozen."""
_SPREAD: dict[tuple[str, str], float] = {}
"""(database, fleet) -> rows of the index `newest_few` reads per id it wants: 1 while the
newest jobs are all the fleet's (one fleet), more as other fleets' come between them."""


def jobs_of(fleet: str) -> Any:
    """The fleet's jobs: placed on it, or pending without a fleet."""
    return or_(_TABLE.fleet == fleet, _TABLE.fleet.is_(None) & (_TABLE.status == _PENDING))


def newest_ids(session: Session, fleet: str, count: int) -> list[str]:
    """The ids of the fleet's `count` newest jobs, newest first."""
    query = (
        sa_select(_TABLE.id)
        .where(jobs_of(fleet))
        .order_by(_TABLE.submitted_at.desc(), _TABLE.id.desc())
        .limit(count)
    )
    # The driver's rows as they come (SQLAlchemy's row processing of thousands of ids cost
    # more than the query).
    result = session.connection().execute(query)
    try:
        return [row[0] for row in result.cursor.fetchall()]
    finally:
        result.close()


def newest_few(session: Session, fleet: str, count: int) -> list[str]:
    """`newest_ids`, read from the first rows of the index for every fleet (see the module
    docstring); `newest_ids` itself when those hold too few of the fleet's."""
    key = (str(session.get_bind().engine.url), fleet)
    spread = _SPREAD.get(key, 1.0)
    if spread > MAX_SPREAD:
        _SPREAD[key] = spread * RETRY  # tried again after a while: the share may have grown
        return newest_ids(session, fleet, count)
    reach = math.ceil(count * spread)
    query = (
        sa_select(_TABLE.id, _TABLE.fleet, _TABLE.status)
        .order_by(_TABLE.submitted_at.desc(), _TABLE.id.desc())
        .limit(reach)
    )
    result = session.connection().execute(query)
    try:
        rows = result.cursor.fetchall()
    finally:
        result.close()
    ids: list[str] = []
    needed = 0  # rows up to the last id kept
    for job_id, on, status in rows:
        needed += 1
        if on == fleet or (on is None and status == _PENDING):
            ids.append(job_id)
            if len(ids) == count:
                break
    if len(ids) == count:
        # as many rows as this read needed next time, with room for the share to move
        _SPREAD[key] = 1.0 if needed == count else 1.25 * needed / count
        return ids
    if len(rows) < reach:
        return ids  # every job there is
    _SPREAD[key] = max(2 * spread, 1.25 * len(rows) / max(1, len(ids)))
    return newest_ids(session, fleet, count)


@dataclass
class JobCounts:
    """What a control worker's warm state remembers of its fleets' numbers of jobs, so that a
    placement transaction need not count them (services/mix.py `checkpoint_at`): `saturated`,
    the fleets seen with at least as many jobs as can move their checkpoints (not counted
    again); `counted`, for the others, the fleet's newest job when its jobs were last known and
    their number then: the jobs since are the ids before that job among the newest ids a
    transaction reads anyway.

    New jobs come newest first, so both stay exact but for changes to older jobs (one deleted,
    a pending job placed on another fleet or refused). Those are missed until the next exact
    count, which every window read (a comparison's, `seen`) and every count make; one missed
    costs at most a comparison at another checkpoint job than a cold reader's (the mix learned
    at any job is the same for every reader)."""

    saturated: set[str] = field(default_factory=set)
    counted: dict[str, tuple[str, int]] = field(default_factory=dict)

    def seen(self, fleet: str, newest: list[str], enough: int) -> None:
        """The fleet's newest ids as a window read them: at least `enough`, or all of them."""
        self.note(fleet, newest[0] if newest else "", min(len(newest), enough), enough)

    def note(self, fleet: str, newest: str, jobs: int, enough: int) -> None:
        """The fleet has `jobs` jobs (`enough` meaning at least that many), `newest` the newest."""
        self.counted.pop(fleet, None)
        if jobs >= enough:
            self.saturated.add(fleet)
            return
        self.saturated.discard(fleet)
        if newest:
            self.counted[fleet] = (newest, jobs)


def count_jobs(
    session: Session, fleet: str, newest: list[str], enough: int, known: JobCounts | None
) -> int:
    """The fleet's number of jobs, up to `enough`, given its newest ids (newest first, as many
    as the transaction read): from what `known` remembers where it can, else counted."""
    if known is not None:
        if fleet in known.saturated:
            return enough
        last = known.counted.get(fleet)
        since = _position(newest, last[0]) if last is not None else None
        if last is not None and since is not None:
            jobs = min(enough, last[1] + since)
            known.note(fleet, newest[0], jobs, enough)
            return jobs
    some = sa_select(_TABLE.id).where(jobs_of(fleet)).limit(enough).subquery()
    jobs = int(session.connection().execute(sa_select(func.count()).select_from(some)).scalar_one())
    if known is not None:
        known.note(fleet, newest[0], jobs, enough)
    return jobs


def _position(ids: list[str], job_id: str) -> int | None:
    try:
        return ids.index(job_id)
    except ValueError:
        return None
