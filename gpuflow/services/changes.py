"""The capacity change counters (store/tables.py, CapacityVersionRow): every write that changes
what placement reads bumps one in its own transaction; the warm state reads them all at once.

A write of allocations or of host readiness also logs which hosts it changed, under the
counter's new value (CapacityChangeRow): a warm state that missed a few writes of another
control worker (or of host health checks) re-reads those hosts, not every host. The log keeps
the newest `KEPT_VERSIONS` versions of each; a reader further behind, or behind a write that
logged nothing (a gpuflow without the log), finds a version missing and reads every host's, as
it would without the log."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from sqlalchemy import (
    Insert,
    String,
    Update,
    bindparam,
    delete,
    func,
    insert,
    literal,
    true,
    update,
)
from sqlalchemy import select as sa_select
from sqlalchemy.dialects.postgresql import ARRAY
from sqlmodel import Session

from gpuflow.store.bulk import insert_rows
from gpuflow.store.tables import CapacityChangeRow, CapacityVersionRow

Change = Literal["structure", "states", "allocations"]
PerHost = Literal["states", "allocations"]
"""The counters whose writes log the hosts they changed."""

_TABLE = CapacityVersionRow.__table__  # type: ignore[attr-defined]
_LOG = CapacityChangeRow.__table__  # type: ignore[attr-defined]

KEPT_VERSIONS = 512
"""Versions of each counter's log kept. A reader this far behind has missed hundreds of writes,
which name about as many hosts as a fleet has: reading every host's allocations costs it about
what reading the log would. The log stays a few thousand rows, however long the database runs."""
_PRUNE_EVERY = KEPT_VERSIONS // 4


@dataclass(frozen=True)
class Versions:
    structure: int
    states: int
    allocations: int


def read_versions(session: Session) -> Versions | None:
    """The counters as this transaction sees them; None when the row is missing."""
    row = (
        session.connection()
        .execute(
            sa_select(_TABLE.c.structure, _TABLE.c.states, _TABLE.c.allocations).where(
                _TABLE.c.id == 1
            )
        )
        .first()
    )
    return None if row is None else Versions(*row)


def bump(session: Session, change: Change) -> int | None:
    """Count one change of this kind in the caller's transaction; returns the new value (None
    when the row is missing: no warm state then trusts itself)."""
    value = session.connection().execute(_BUMP[change]).scalar()
    return None if value is None else int(value)


def bump_hosts(session: Session, change: PerHost, host_ids: Iterable[str]) -> int | None:
    """Count one change of this kind in the caller's transaction and log the hosts it
    changed; returns the new counter (None when the row is missing)."""
    hosts = sorted(set(host_ids)) or [""]  # a version with a row, so a reader sees it logged
    connection = session.connection()
    if connection.dialect.name == "postgresql":
        # one statement: every write of allocations runs it under the placement lock
        found = connection.execute(_BUMP_AND_LOG[change], {"hosts": hosts}).first()
        version = None if found is None else int(found[0])
    else:
        version = bump(session, change)
        if version is not None:
            rows = [{"kind": change, "version": version, "host_id": h} for h in hosts]
            insert_rows(session, CapacityChangeRow, rows)
    if version is None:
        return None
    if version % _PRUNE_EVERY == 0:
        connection.execute(_PRUNE, {"kind": change, "below": version - KEPT_VERSIONS})
    return version


def _bump_statement(change: Change) -> Update:
    column = _TABLE.c[change]
    return update(_TABLE).where(_TABLE.c.id == 1).values({change: column + 1}).returning(column)


_BUMP: dict[Change, Update] = {
    change: _bump_statement(change) for change in ("structure", "states", "allocations")
}


def _bump_and_log_statement(change: PerHost) -> Insert:
    """PostgreSQL: the bump and its log as one statement (the bump as a CTE)."""
    bumped = _BUMP[change].cte("bumped")
    hosts = func.unnest(bindparam("hosts", type_=ARRAY(String))).table_valued("host")
    hosts = hosts.render_derived()  # `unnest(...) AS anon(host)`: the column has a name
    logged = sa_select(literal(change), bumped.c[change], hosts.c.host).select_from(
        bumped.join(hosts, true())
    )
    return (
        insert(_LOG).from_select(["kind", "version", "host_id"], logged).returning(_LOG.c.version)
    )


_BUMP_AND_LOG: dict[PerHost, Insert] = {
    change: _bump_and_log_statement(change) for change in ("states", "allocations")
}
_KIND = _LOG.c.kind == bindparam("kind")
_PRUNE = delete(_LOG).where(_KIND, _LOG.c.version <= bindparam("below"))
_SINCE = sa_select(_LOG.c.version, _LOG.c.host_id).where(
    _KIND, _LOG.c.version > bindparam("since"), _LOG.c.version <= bindparam("upto")
)


def changed_hosts(session: Session, change: PerHost, since: int, upto: int) -> set[str] | None:
    """The hosts that the writes of this kind after version `since` up to `upto` changed;
    None when the log does not hold every one of those versions (read every host's)."""
    if upto <= since:
        return set()
    if upto - since > KEPT_VERSIONS:
        return None
    asked = {"kind": change, "since": since, "upto": upto}
    rows = session.connection().execute(_SINCE, asked).all()
    if len({version for version, _ in rows}) != upto - since:
        return None
    return {host_id for _, host_id in rows if host_id}
