"""Rows written many at a time without the ORM's unit of work: one INSERT with every row
(SQLAlchemy's insertmanyvalues) instead of an object per row and a flush that walks them, for
the writes a group of submits makes per job (gpuflow/services/group_entry.py)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pydantic_core import PydanticUndefined
from sqlalchemy import insert
from sqlmodel import Session, SQLModel

__all__ = ["IDS_PER_STATEMENT", "insert_rows"]

IDS_PER_STATEMENT = 500
"""Ids in one `IN (...)` at most (SQLite limits a statement's parameters)."""

_DEFAULTS: dict[type[SQLModel], dict[str, tuple[Any, Callable[[], Any] | None]]] = {}


def _defaults(model: type[SQLModel]) -> dict[str, tuple[Any, Callable[[], Any] | None]]:
    """Per column left out: its default, or its default factory (as a model built with it
    would take them). Primary keys defaulting to None are left to the database."""
    found = _DEFAULTS.get(model)
    if found is None:
        found = {}
        table = model.__table__  # type: ignore[attr-defined]
        for name, field in model.model_fields.items():
            column = table.c.get(name)
            if column is None:
                continue
            if field.default_factory is not None:
                found[name] = (None, field.default_factory)  # type: ignore[assignment]
            elif field.default is not PydanticUndefined and not (
                column.primary_key and field.default is None
            ):
                found[name] = (field.default, None)
        _DEFAULTS[model] = found
    return found


def insert_rows(
    session: Session,
    model: type[SQLModel],
    rows: Sequence[Mapping[str, Any]],
    *,
    returning: str | None = None,
) -> list[Any]:
    """Insert `rows` (column -> value; columns left out take the model's defaults, factories
    called once per row) into the model's table, in the caller's transaction. The session's
    pending objects are flushed first, so the order of writes is the caller's. `returning`: a
    column whose values the database gave the rows (an id), returned in the rows' order."""
    if not rows:
        return []
    defaults = _defaults(model)
    values = []
    for row in rows:
        full = dict(row)
        for name, (default, factory) in defaults.items():
            if name not in full:
                full[name] = factory() if factory is not None else default
        values.append(full)
    if session.new or session.dirty:
        session.flush()
    table = model.__table__  # type: ignore[attr-defined]
    if returning is None:
        session.connection().execute(insert(table), values)
        return []
    statement = insert(table).returning(table.c[returning], sort_by_parameter_order=True)
    return list(session.connection().execute(statement, values).scalars())
