"""Rows written many at a time without the ORM's unit of work, for the writes a group of
submits makes per job (gpuflow/services/group_entry.py): instead of an object per row and a
flush that walks them, one INSERT per table. On PostgreSQL, for several rows, that statement
takes each column as one binary array (`INSERT ... SELECT * FROM unnest(...)`), so the server
runs it once for all the rows: psycopg's executemany runs it once per row, and SQLAlchemy's
insertmanyvalues sends a new text for every number of rows. SQLite, and a few rows, get
SQLAlchemy's executemany and insertmanyvalues.

Updates are left to executemany: an `UPDATE ... FROM unnest(...)` joins the arrays to the table,
and the generic plan of a prepared statement, made while a new database's table is small,
reads the whole table for every call for as long as the plan is kept."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from pydantic_core import PydanticUndefined
from sqlalchemy import Table, UniqueConstraint, insert
from sqlalchemy.engine import Connection
from sqlmodel import Session, SQLModel

__all__ = ["ARRAYS_FROM", "IDS_PER_STATEMENT", "insert_rows"]

ARRAYS_FROM = 4
"""Rows from which an INSERT on PostgreSQL takes each column as one array. Its fixed cost (the
arrays, a longer statement) is about what a few rows cost run one by one (benchmarks/
bulk_rows.py): events and allocations are cheaper as arrays from 3-4 rows on (32 allocations:
1.5 against 2.9 ms), a single row of any table is not (0.56 against 0.44 ms). The jobs' rows,
each with a spec of about a kilobyte of JSON, gain only from about 16 rows and cost up to 0.15
ms more below: not worth a threshold of their own."""

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
    connection = session.connection()
    key = _unique_key(table, values[0]) if returning is not None else ()
    if _arrays_fit(connection, values) and (returning is None or key):
        return _insert_arrays(connection, table, values, returning, key)
    if returning is None:
        session.connection().execute(insert(table), values)
        return []
    statement = insert(table).returning(table.c[returning], sort_by_parameter_order=True)
    return list(session.connection().execute(statement, values).scalars())


def _arrays_fit(connection: Connection, rows: Sequence[Mapping[str, Any]]) -> bool:
    """PostgreSQL, `ARRAYS_FROM` rows at least, every row naming the same columns (one array
    per column)."""
    if connection.dialect.name != "postgresql" or len(rows) < ARRAYS_FROM:
        return False
    names = rows[0].keys()
    return all(row.keys() == names for row in rows)


def _arrays(
    connection: Connection, table: Table, names: Sequence[str], rows: Sequence[Mapping[str, Any]]
) -> list[tuple[list[Any], str]]:
    """Per column: its rows' values as the driver takes them (the column type's own bind
    processing: JSON, UTC timestamps; plain values made one Python type, since an array holds
    one: 0 in a float column is 0.0), and the server's name of its type."""
    dialect = connection.dialect
    arrays = []
    for name in names:
        kind = table.c[name].type
        process = kind._cached_bind_processor(dialect)
        values = [row[name] for row in rows]
        if process is not None:
            values = [process(value) for value in values]
        else:
            plain = _PLAIN.get(_python_type(kind) or object)
            if plain is not None:
                values = [None if value is None else plain(value) for value in values]
        arrays.append((values, kind.compile(dialect=dialect)))
    return arrays


_PLAIN: dict[type, Callable[[Any], Any]] = {str: str, int: int, float: float, bool: bool}


def _python_type(kind: Any) -> type | None:
    try:
        found: type = kind.python_type
    except NotImplementedError:
        return None
    return found


def _insert_arrays(
    connection: Connection,
    table: Table,
    values: Sequence[Mapping[str, Any]],
    returning: str | None,
    key: tuple[str, ...],
) -> list[Any]:
    """`insert_rows` on PostgreSQL: one `INSERT ... SELECT * FROM unnest(...)`. The rows the
    database numbered are matched back to the caller's by a unique key they carry, since the
    order of RETURNING is not promised."""
    names = list(values[0])
    arrays = _arrays(connection, table, names, values)
    source = ", ".join(f"%b::{kind}[]" for _, kind in arrays)
    columns = ", ".join(f'"{name}"' for name in names)
    statement = f'INSERT INTO "{table.name}" ({columns}) SELECT * FROM unnest({source})'
    parameters = tuple(column for column, _ in arrays)
    if returning is None:
        connection.exec_driver_sql(statement, parameters)
        return []
    back = ", ".join(f'"{name}"' for name in (returning, *key))
    found = connection.exec_driver_sql(f"{statement} RETURNING {back}", parameters).all()
    given = {tuple(row[1:]): row[0] for row in found}
    # the key as sent (each value of its column's one type), so it compares with what comes back
    sent = dict(zip(names, parameters, strict=True))
    return [given[row_key] for row_key in zip(*(sent[name] for name in key), strict=True)]


def _unique_key(table: Table, names: Iterable[str]) -> tuple[str, ...]:
    """Columns the rows carry that tell them apart: the primary key's or a unique constraint's
    (none: the rows carry no such key)."""
    names = set(names)
    candidates = [tuple(c.name for c in table.primary_key.columns)]
    candidates += [
        tuple(c.name for c in constraint.columns)
        for constraint in table.constraints
        if isinstance(constraint, UniqueConstraint)
    ]
    for candidate in candidates:
        if candidate and all(name in names for name in candidate):
            return candidate
    return ()
