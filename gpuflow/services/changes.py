"""The capacity change counters (store/tables.py, CapacityVersionRow): every write that changes
what placement reads bumps one in its own transaction; the warm state reads them all at once."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from sqlalchemy import select as sa_select
from sqlalchemy import update
from sqlmodel import Session

from gpuflow.store.tables import CapacityVersionRow

Change = Literal["structure", "states", "allocations"]

_TABLE = CapacityVersionRow.__table__  # type: ignore[attr-defined]


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
    column = _TABLE.c[change]
    found = session.connection().execute(
        update(_TABLE).where(_TABLE.c.id == 1).values({change: column + 1}).returning(column)
    )
    value = found.scalar()
    return None if value is None else int(value)
