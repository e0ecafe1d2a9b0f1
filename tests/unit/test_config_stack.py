"""GPUFLOW_HOME names the stack its commands reach, as a docker context does: the address its
`gpuflow up` recorded in up.ready, while that process lives. With two embedded stacks on one
machine, a command run with the second's home (and no port variable) reached the first's
Temporal on 7233: `down` stopped the first's jobs and held its admission."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuflow.config import TEMPORAL_VARIABLES, TemporalConfig
from gpuflow.stack_record import StackRecord, read_stack_record, write_stack_record


@pytest.fixture(autouse=True)
def home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    for name in TEMPORAL_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("GPUFLOW_HOME", str(home))
    return home


@pytest.fixture
def live_up() -> Iterator[int]:
    """The pid of a live process standing for `gpuflow up` (`gpuflow` in its command line)."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "gpuflow"])
    cmdline = Path(f"/proc/{process.pid}/cmdline")
    for _ in range(200):  # until it has exec'd (a fork has its parent's command line)
        if b"gpuflow" in cmdline.read_bytes():
            break
        time.sleep(0.01)
    yield process.pid
    process.kill()
    process.wait()


def _exited_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass", "gpuflow"])
    process.wait()
    return process.pid


def _record(home: Path, pid: int, temporal: str | None = "127.0.0.1:27433") -> None:
    write_stack_record(home / "up.ready", StackRecord(pid=pid, ui="http://x", temporal=temporal))


def test_the_homes_running_stack_is_reached(home: Path, live_up: int) -> None:
    _record(home, live_up)
    config = TemporalConfig.from_env()
    assert (config.address, config.embedded) == ("127.0.0.1:27433", True)
    assert not config.uses_tls


def test_a_stale_record_is_not_followed(home: Path) -> None:
    """Its port may be another stack's by now."""
    _record(home, _exited_pid())
    assert TemporalConfig.from_env().address == "127.0.0.1:7233"


def test_a_pid_reused_by_another_program_is_stale(home: Path) -> None:
    other = subprocess.Popen(["sleep", "60"])
    try:
        _record(home, other.pid)
        assert TemporalConfig.from_env().address == "127.0.0.1:7233"
    finally:
        other.kill()
        other.wait()


def test_the_variables_win(home: Path, live_up: int, monkeypatch: pytest.MonkeyPatch) -> None:
    _record(home, live_up)
    monkeypatch.setenv("GPUFLOW_TEMPORAL_PORT", "17233")
    assert TemporalConfig.from_env().address == "127.0.0.1:17233"
    monkeypatch.setenv("GPUFLOW_TEMPORAL_ADDRESS", "temporal.example.com")
    config = TemporalConfig.from_env()
    assert (config.address, config.embedded) == ("temporal.example.com:7233", False)


def test_up_serves_what_the_variables_say_never_a_record(home: Path, live_up: int) -> None:
    _record(home, live_up)
    assert TemporalConfig.to_serve().address == "127.0.0.1:7233"


def test_a_stack_that_joined_a_cluster_is_not_followed(home: Path, live_up: int) -> None:
    """Its cluster's TLS and API key are in the variables: without them, no address."""
    _record(home, live_up, temporal=None)
    assert TemporalConfig.from_env().address == "127.0.0.1:7233"


def test_records_of_older_versions_and_of_this_one(home: Path, live_up: int) -> None:
    (home / "up.ready").write_text("http://127.0.0.1:8233")  # an older gpuflow's: its UI alone
    assert read_stack_record(home) == StackRecord(pid=None, ui="http://127.0.0.1:8233")
    assert TemporalConfig.from_env().address == "127.0.0.1:7233"
    _record(home, live_up)
    assert json.loads((home / "up.ready").read_text()) == {
        "pid": live_up,
        "ui": "http://x",
        "temporal": "127.0.0.1:27433",
    }
    assert [p.name for p in home.iterdir()] == ["up.ready"]  # written whole, by a rename
