"""Rows written and deleted many at a time without the ORM's unit of work, for the writes a
group of submits makes per job (gpuflow/services/group_entry.py) and the deletes of a group of
releases (gpuflow/control/releases.py): instead of an object per row and a
flush that walks them, one INSERT per table. On PostgreSQL, for several rows, that statement
takes each column as one binary array (`INSERT ... SELECT * FROM unnest(...)`), so the server
runs it once for all the rows: psycopg's executemany runs it once per row, and SQLAlchemy's
insertmanyvalues sends a new text for every number of rows. SQLite, a few rows, and values
not already of their column's type get SQLAlchemy's executemany and insertmanyvalues, which
write them as a row written alone would be.

Updates are left to executemany: an `UPDATE ... FROM unnest(...)` joins the arrays to the table,
and the generic plan of a prepared statement, made while a new database's table is small,
reads the whole table for every call for as long as the plan is kept."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from pydantic_core import PydanticUndefined
from sqlalchemy import ColumnElement, Float, Integer, String, Table, UniqueConstraint, insert
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Connection
from sqlmodel import Session, SQLModel

__all__ = [
    "ARRAYS_FROM",
    "IDS_PER_STATEMENT",
    "delete_rows",
    "flush_pending",
    "insert_new_rows",
    "insert_rows",
]

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
    values = _completed(model, rows)
    flush_pending(session)
    table = model.__table__  # type: ignore[attr-defined]
    connection = session.connection()
    key = _unique_key(table, values[0]) if returning is not None else ()
    if _arrays_fit(connection, values) and (returning is None or key):
        arrays = _arrays(connection, table, list(values[0]), values)
        if arrays is not None:
            return _insert_arrays(connection, table, arrays, returning, key)
    if returning is None:
        session.connection().execute(insert(table), values)
        return []
    statement = insert(table).returning(table.c[returning], sort_by_parameter_order=True)
    return list(session.connection().execute(statement, values).scalars())


def insert_new_rows(
    session: Session, model: type[SQLModel], rows: Sequence[Mapping[str, Any]]
) -> set[Any]:
    """`insert_rows` for rows whose primary key (one column) may be taken already: a row whose
    key is taken is left as it is (`INSERT ... ON CONFLICT DO NOTHING`). Returns the keys of
    the rows written. One statement where reading which keys are taken and then inserting took
    two: on a fresh PostgreSQL database the read's generic plan, made while the table was
    small, went on reading the whole table (benchmarks/README.md, "Fleet scale", fifteenth
    pass)."""
    if not rows:
        return set()
    values = _completed(model, rows)
    flush_pending(session)
    table: Table = model.__table__  # type: ignore[attr-defined]
    (key,) = (column.name for column in table.primary_key.columns)
    connection = session.connection()
    if _arrays_fit(connection, values):
        arrays = _arrays(connection, table, list(values[0]), values)
        if arrays is not None:
            statement, parameters = _arrays_statement(table, arrays)
            statement += f' ON CONFLICT ("{key}") DO NOTHING RETURNING "{key}"'
            return {row[0] for row in connection.exec_driver_sql(statement, parameters)}
    if connection.dialect.name == "postgresql":
        dialect_insert: Any = postgresql_insert
    else:
        dialect_insert = sqlite_insert
    statement = dialect_insert(table).on_conflict_do_nothing(index_elements=[key])
    return set(connection.execute(statement.returning(table.c[key]), values).scalars())


def _completed(model: type[SQLModel], rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The rows with the columns they leave out at the model's defaults (factories called once
    per row)."""
    defaults = _defaults(model)
    values = []
    for row in rows:
        full = dict(row)
        for name, (default, factory) in defaults.items():
            if name not in full:
                full[name] = factory() if factory is not None else default
        values.append(full)
    return values


def flush_pending(session: Session) -> None:
    """Write what the session holds unwritten (new, changed or deleted objects), so that a
    statement run beside the ORM sees it, as the ORM's own reads do."""
    if session.new or session.dirty or session.deleted:
        session.flush()


def delete_rows(
    session: Session, model: type[SQLModel], *where: ColumnElement[bool], returning: Sequence[str]
) -> list[tuple[Any, ...]]:
    """Delete the rows of `model` that match with one `DELETE ... RETURNING` (SQLite 3.35+ and
    PostgreSQL), what the session holds unwritten written first; those columns of each row
    deleted. The rows are not loaded as objects: one the session holds already is stale after."""
    flush_pending(session)
    table: Table = model.__table__  # type: ignore[attr-defined]
    statement = table.delete().where(*where).returning(*(table.c[name] for name in returning))
    return [tuple(row) for row in session.connection().execute(statement)]


def _arrays_fit(connection: Connection, rows: Sequence[Mapping[str, Any]]) -> bool:
    """PostgreSQL, `ARRAYS_FROM` rows at least, every row naming the same columns (one array
    per column)."""
    if connection.dialect.name != "postgresql" or len(rows) < ARRAYS_FROM:
        return False
    names = rows[0].keys()
    return all(row.keys() == names for row in rows)


def _arrays(
    connection: Connection, table: Table, names: Sequence[str], rows: Sequence[Mapping[str, Any]]
) -> dict[str, tuple[list[Any], str]] | None:
    """Per column: its rows' values as the driver takes them, and the server's name of its
    type. Values go through the column type's own bind processing (JSON, UTC timestamps); a
    plain column's must already be of its Python type (an int in a float column is made a
    float: a model's default of 0), since psycopg dumps an array of one type only. None when
    some are not (a str subclass beside str, "1" in an int column): the caller writes the rows
    the driver's way, which takes them as it always did."""
    dialect = connection.dialect
    arrays: dict[str, tuple[list[Any], str]] = {}
    for name in names:
        kind = table.c[name].type
        process = kind._cached_bind_processor(dialect)
        values = [row[name] for row in rows]
        if process is not None:
            values = [process(value) for value in values]
        else:
            plain = _plain_type(kind)
            if plain is float:
                values = [float(v) if type(v) is int else v for v in values]
            if plain is not None and any(v is not None and type(v) is not plain for v in values):
                return None
        arrays[name] = (values, kind.compile(dialect=dialect))
    return arrays


def _plain_type(kind: Any) -> type | None:
    """str, int or float for a column of such a type; None for any other."""
    for plain, types in ((str, String), (float, Float), (int, Integer)):
        if isinstance(kind, types):
            return plain
    return None


def _insert_arrays(
    connection: Connection,
    table: Table,
    arrays: dict[str, tuple[list[Any], str]],
    returning: str | None,
    key: tuple[str, ...],
) -> list[Any]:
    """`insert_rows` on PostgreSQL: one `INSERT ... SELECT * FROM unnest(...)` of the columns'
    arrays. The rows the database numbered are matched back to the caller's by a unique key
    they carry (as sent), since the order of RETURNING is not promised."""
    statement, parameters = _arrays_statement(table, arrays)
    if returning is None:
        connection.exec_driver_sql(statement, parameters)
        return []
    back = ", ".join(f'"{name}"' for name in (returning, *key))
    found = connection.exec_driver_sql(f"{statement} RETURNING {back}", parameters).all()
    given = {tuple(row[1:]): row[0] for row in found}
    return [given[row_key] for row_key in zip(*(arrays[name][0] for name in key), strict=True)]


def _arrays_statement(
    table: Table, arrays: dict[str, tuple[list[Any], str]]
) -> tuple[str, tuple[list[Any], ...]]:
    """`INSERT ... SELECT * FROM unnest(...)` of the columns' arrays, and its parameters: one
    array a column."""
    source = ", ".join(f"%b::{kind}[]" for _, kind in arrays.values())
    columns = ", ".join(f'"{name}"' for name in arrays)
    statement = f'INSERT INTO "{table.name}" ({columns}) SELECT * FROM unnest({source})'
    return statement, tuple(column for column, _ in arrays.values())


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
