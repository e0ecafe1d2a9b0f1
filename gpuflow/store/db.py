"""Engine set-up: a SQLite file under GPUFLOW_HOME by default, PostgreSQL when
GPUFLOW_DATABASE_URL says so."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Table, event, inspect, text
from sqlalchemy.engine import Connection, Engine, Inspector
from sqlalchemy.exc import (
    ArgumentError,
    DBAPIError,
    NoSuchModuleError,
    OperationalError,
    ProgrammingError,
)
from sqlmodel import Session, SQLModel, create_engine

from gpuflow.config import ensure_home, private_dir
from gpuflow.config import gpuflow_home as gpuflow_home  # re-exported: it lived here
from gpuflow.errors import ConnectionFailed, GpuflowError

_PLACEMENT_LOCK_KEY = 0x6770_7566  # "gpuf": the advisory lock that serializes placement
PLACEMENT = "gpuflow_placement"
"""Set in a session's `info` by `placement_transaction`: the session holds the placement lock,
so it may write what placements share besides allocations (a fleet's mix in use)."""
SUBMITTED = "gpuflow_submitted_at"
"""In a session's `info`: job id -> when it was submitted, for the job rows the transaction
inserted itself without the ORM (services/group_entry.py): what reads a job's submission time
later in the transaction finds it there instead of reading the row."""


def database_url() -> str:
    url = os.environ.get("GPUFLOW_DATABASE_URL")
    if url:
        return url
    return f"sqlite:///{gpuflow_home() / 'gpuflow.db'}"


def _normalize(url: str) -> str:
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def redact(url: str) -> str:
    """The URL without its password, for messages and logs."""
    head, sep, tail = url.partition("@")
    if not sep or "://" not in head:
        return url
    scheme, _, creds = head.partition("://")
    user = creds.split(":", 1)[0]
    return f"{scheme}://{user}:***@{tail}" if ":" in creds else url


def _add_columns(connection: Connection, inspector: Inspector, table: Table) -> None:
    """Columns added to an existing table since a database was made (create_all adds them only
    with a new table): each is added, empty. Only columns that may be empty are ever added to
    a table after its first release."""
    have = {column["name"] for column in inspector.get_columns(table.name)}
    for column in table.columns:
        if column.name in have:
            continue
        if not column.nullable:
            raise RuntimeError(f"column {table.name}.{column.name} cannot be added: not nullable")
        kind = column.type.compile(dialect=connection.dialect)
        # SQLite: init's transaction holds the write lock (BEGIN IMMEDIATE) from the look to the
        # add; PostgreSQL: another process may add it between the two.
        exists = "IF NOT EXISTS " if connection.dialect.name == "postgresql" else ""
        add = f'ALTER TABLE "{table.name}" ADD COLUMN {exists}"{column.name}" {kind}'
        connection.execute(text(add))


def _reason(exc: DBAPIError) -> str:
    """The driver's first line of what went wrong."""
    return str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)


class Store:
    """One engine and its sessions: `session` for writes, `read` for reads, and
    `placement_transaction`, which serializes placement passes."""

    def __init__(self, url: str | None = None) -> None:
        self.url = _normalize(url or database_url())
        self.is_sqlite = self.url.startswith("sqlite")
        kwargs: dict[str, Any] = {}
        path = self.url.removeprefix("sqlite:///") if self.is_sqlite else ""
        on_disk = self.is_sqlite and path not in ("", ":memory:", "sqlite://")
        if self.is_sqlite:
            if on_disk:
                _private_database_file(Path(path))
            kwargs["connect_args"] = {"check_same_thread": False, "timeout": 30}
        else:
            kwargs["pool_pre_ping"] = True
            kwargs["connect_args"] = {"connect_timeout": 5}
        try:
            self.engine: Engine = create_engine(self.url, **kwargs)
        except (ArgumentError, NoSuchModuleError, ImportError) as exc:
            # An unparsable URL, or a database gpuflow has no driver for (mysql://...).
            raise GpuflowError(
                f"GPUFLOW_DATABASE_URL {redact(self.url)} is not a database gpuflow can use "
                f"({type(exc).__name__}: {str(exc).splitlines()[0]}); give "
                "sqlite:////absolute/path or postgresql://user@host:5432/database"
            ) from None
        self.read_engine: Engine = self.engine
        if self.is_sqlite:
            # Reads get their own engine whose transactions take no lock, so `gpuflow ps` and
            # the snapshot reads never queue behind (or hold up) placements and bookkeeping.
            # (An in-memory database exists once per engine, so it keeps one.)
            _sqlite_transactions(self.engine, "BEGIN IMMEDIATE")
            if on_disk:
                self.read_engine = create_engine(self.url, **kwargs)
                _sqlite_transactions(self.read_engine, "BEGIN DEFERRED")

    def init(self) -> Store:
        """Create the tables (and what older databases lack); fail with one clear line when
        the database cannot be reached or refuses it."""
        from gpuflow.store import tables  # noqa: F401  (registers the tables)

        try:
            SQLModel.metadata.create_all(self.engine)
            with self.engine.begin() as connection:
                # The change counters' one row (a database made before it existed gets it too).
                made = connection.execute(
                    text(
                        "INSERT INTO capacity_versions (id, structure, states, allocations)"
                        " VALUES (1, 0, 0, 0) ON CONFLICT DO NOTHING"
                    )
                )
                if made.rowcount:  # counting starts again: no logged version may repeat
                    connection.execute(text("DELETE FROM capacity_changes"))
                # Indexes added to existing tables (create_all makes them only with a new
                # table): a database made before them gets them here, as tables.py declares.
                inspector = inspect(connection)
                for table in SQLModel.metadata.sorted_tables:
                    _add_columns(connection, inspector, table)
                    for index in table.indexes:
                        index.create(connection, checkfirst=True)
        except OperationalError as exc:
            raise ConnectionFailed(
                f"cannot reach the database {redact(self.url)}: {_reason(exc)} "
                "(check GPUFLOW_DATABASE_URL)"
            ) from None
        except ProgrammingError as exc:  # refused: no right to create or alter the tables
            raise GpuflowError(
                f"cannot set up gpuflow's tables in {redact(self.url)}: {_reason(exc)} (connect "
                "as a role that may create and alter tables in the database, e.g. its owner)"
            ) from None
        return self

    @contextmanager
    def session(self) -> Iterator[Session]:
        with Session(self.engine, expire_on_commit=False) as session:
            yield session

    @contextmanager
    def read(self) -> Iterator[Session]:
        """A read-only session: one consistent snapshot, no write lock. Never commit in it."""
        with Session(self.read_engine, expire_on_commit=False) as session:
            yield session

    @contextmanager
    def placement_transaction(self) -> Iterator[Session]:
        """A transaction that no other placement pass runs beside; commits on success."""
        with Session(self.engine, expire_on_commit=False) as session:
            if not self.is_sqlite:
                session.execute(
                    text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PLACEMENT_LOCK_KEY}
                )
            session.info[PLACEMENT] = True
            yield session
            session.commit()

    def dispose(self) -> None:
        self.engine.dispose()
        if self.read_engine is not self.engine:
            self.read_engine.dispose()


def _private_database_file(path: Path) -> None:
    """Create the SQLite file 0600 before SQLite does (it would follow the umask, typically
    0644), and tighten one that an earlier version created; SQLite gives its -wal and -shm
    files the database file's mode."""
    if path.parent == gpuflow_home():
        ensure_home(path.parent)
    else:
        private_dir(path.parent)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        if os.fstat(fd).st_uid == os.getuid():
            os.fchmod(fd, 0o600)
    finally:
        os.close(fd)


def _sqlite_transactions(engine: Engine, begin: str) -> None:
    """WAL, a busy timeout, and explicit BEGINs: pysqlite would otherwise start transactions
    lazily and DEFERRED, so two placement passes could both read the same free GPU. Writing
    sessions take the write lock up front (IMMEDIATE); reading ones read a WAL snapshot."""

    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(connection: Any) -> None:
        connection.exec_driver_sql(begin)
