"""Files that hold secrets or job data are their owner's alone: GPUFLOW_HOME 0700, the SQLite
database 0600, the secrets file 0600 written atomically whatever was there before. (A broken
secrets file in `gpuflow secret …`: tests/unit/cli/test_secrets_cli.py.)"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuflow import secrets
from gpuflow.config import ensure_home
from gpuflow.store.db import Store


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture(autouse=True)
def loose_umask() -> Iterator[None]:
    old = os.umask(0o022)
    yield
    os.umask(old)


@pytest.fixture
def home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv("GPUFLOW_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("GPUFLOW_SECRETS_FILE", raising=False)
    monkeypatch.delenv("GPUFLOW_DATABASE_URL", raising=False)
    return tmp_path / "home"


def test_home_is_created_private_and_an_existing_one_tightened(tmp_path: Path) -> None:
    assert _mode(ensure_home(tmp_path / "new" / "home")) == 0o700
    old = tmp_path / "old"
    old.mkdir(mode=0o755)
    os.chmod(old, 0o755)
    assert _mode(ensure_home(old)) == 0o700


def test_the_default_database_is_private(home: Path) -> None:
    store = Store().init()
    try:
        with store.session() as session:
            session.connection().exec_driver_sql("SELECT 1")
    finally:
        store.dispose()
    assert _mode(home) == 0o700
    assert _mode(home / "gpuflow.db") == 0o600
    for extra in home.glob("gpuflow.db-*"):  # WAL and shared memory follow the database
        assert _mode(extra) == 0o600, extra


def test_an_existing_database_file_is_tightened(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    path.touch(mode=0o644)
    os.chmod(path, 0o644)
    Store(f"sqlite:///{path}").init().dispose()
    assert _mode(path) == 0o600


def test_a_stale_temporary_file_never_lends_its_mode(home: Path) -> None:
    home.mkdir(mode=0o755)
    stale = home / "secrets.tmp"
    stale.write_text("old")
    os.chmod(stale, 0o644)
    secrets.set_secret("token", "value-1")
    secrets.set_secret("other", "value-2")
    path = home / "secrets.json"
    assert _mode(path) == 0o600
    assert json.loads(path.read_text()) == {"token": "value-1", "other": "value-2"}
    assert sorted(p.name for p in home.iterdir()) == ["secrets.json", "secrets.tmp"]


def test_a_secrets_file_of_another_mode_is_replaced_by_a_private_one(home: Path) -> None:
    home.mkdir()
    path = home / "secrets.json"
    path.write_text('{"a": "b"}')
    os.chmod(path, 0o644)
    assert secrets.delete_secret("a")
    assert _mode(path) == 0o600 and json.loads(path.read_text()) == {}
