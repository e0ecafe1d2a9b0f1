"""`gpuflow down` never leaves running jobs' processes behind without saying so."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuflow.status import JobStatus
from tests.unit.cli.conftest import Cli


@pytest.fixture
def stack(cli: Cli, tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A process standing for the stack of `gpuflow up -d`, with its pid file."""
    # `gpuflow` in its command line, as the stack's (a pid reused by another program is not)
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "gpuflow"])
    # Reap it when it is stopped, so that `down` sees it gone (not a zombie).
    threading.Thread(target=process.wait, daemon=True).start()
    home = tmp_path / "home"
    home.mkdir(parents=True, exist_ok=True)
    (home / "up.pid").write_text(str(process.pid))
    yield process
    if process.poll() is None:
        process.kill()


def _alive(process: subprocess.Popen[bytes]) -> bool:
    for _ in range(50):
        if process.poll() is not None:
            return False
        time.sleep(0.02)
    return True


def test_down_refuses_with_running_jobs_and_no_terminal(
    cli: Cli, stack: subprocess.Popen[bytes]
) -> None:
    cli.job("train", JobStatus.RUNNING, hosts=["box"])
    out = cli("down", code=1)
    assert "1 job(s) running:\n  train (job-train-a1b2c3) on box" in out
    assert "error: 1 job(s) still running; nothing was stopped" in out
    assert "--stop-jobs" in out and "--force" in out
    assert _alive(stack)
    assert cli.temporal.signals == []


def test_down_stop_jobs_stops_them_then_the_stack(
    cli: Cli, stack: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    job_id = cli.job("train", JobStatus.RUNNING, hosts=["box"])
    cli.job("later", JobStatus.PENDING, suffix="ffffff")
    out = cli("down", "-y")
    # admission held first: the GPUs they free must not start `later` as the stack goes down
    assert cli.temporal.signals == [("gpuflow-admission", "hold:True"), (job_id, "stop")]
    assert "train: stopped (stopped_by_user)" in out
    assert "1 pending job(s) (later) keep waiting" in out
    assert out.rstrip().endswith("gpuflow is down")
    assert not _alive(stack)
    assert not (tmp_path / "home" / "up.pid").exists()


def test_down_force_leaves_jobs_running_and_says_so(
    cli: Cli, stack: subprocess.Popen[bytes]
) -> None:
    cli.job("train", JobStatus.RUNNING, hosts=["box"])
    out = cli("down", "--force")
    assert cli.temporal.signals == []
    assert not _alive(stack)
    text = " ".join(out.split())
    assert "gpuflow is down left 1 job(s) running without gpuflow: train;" in text
    assert "nothing watches them" in text


def test_down_asks_on_a_terminal(
    cli: Cli, stack: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    cli.job("train", JobStatus.RUNNING, hosts=["box"])
    monkeypatch.setattr("gpuflow.cli.stack._confirm", lambda question: False)
    assert "nothing was stopped" in cli("down", code=1)
    assert _alive(stack)
    monkeypatch.setattr("gpuflow.cli.stack._confirm", lambda question: True)
    assert "train: stopped" in cli("down")
    assert not _alive(stack)


def test_down_without_jobs_or_stack(cli: Cli, stack: subprocess.Popen[bytes]) -> None:
    cli.job("finished", JobStatus.DONE, ended_minutes_ago=1)
    assert cli("down").strip() == "gpuflow is down"
    assert cli("down").strip() == "gpuflow is not up"
    assert os.environ.get("GPUFLOW_HOME")


def test_down_lets_admission_go_when_a_stop_fails(
    cli: Cli, stack: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpuflow.client import Client
    from gpuflow.errors import GpuflowError

    async def broken(self: Client, job: str, **_: object) -> None:
        raise GpuflowError(f"job {job}: cannot stop it")

    cli.job("train", JobStatus.RUNNING, hosts=["box"])
    monkeypatch.setattr(Client, "stop", broken)
    assert "cannot stop it" in cli("down", "-y", code=1)
    assert _alive(stack)  # the stack stays up, and so does admission
    assert cli.temporal.signals == [
        ("gpuflow-admission", "hold:True"),
        ("gpuflow-admission", "hold:False"),
    ]


def test_down_holds_no_admission_of_a_cluster(
    cli: Cli, stack: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a Temporal cluster configured, other control workers go on admitting after this
    one goes down: a hold would outlive `down` (only `gpuflow up` lets it go)."""
    monkeypatch.setenv("GPUFLOW_TEMPORAL_ADDRESS", "temporal.example:7233")
    job_id = cli.job("train", JobStatus.RUNNING, hosts=["box"])
    cli("down", "-y")
    assert cli.temporal.signals == [(job_id, "stop")]


def test_down_stops_a_job_that_started_while_it_stopped_the_others(
    cli: Cli, stack: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job submitted while `down` stops jobs may start in its own first step (the hold
    reaches only the admission loop): `down` looks again and stops it too."""
    train = cli.job("train", JobStatus.RUNNING, hosts=["box"])
    stop = cli.temporal.on_stop
    started: list[str] = []

    def on_stop(job_id: str) -> None:
        stop(job_id)
        if not started:  # submitted meanwhile, placed at once on the GPUs train freed
            started.append(cli.job("sneaky", JobStatus.RUNNING, suffix="eeeeee", hosts=["box"]))

    monkeypatch.setattr(cli.temporal, "on_stop", on_stop)
    out = cli("down", "-y")
    stops = [job for job, what in cli.temporal.signals if what == "stop"]
    assert stops == [train, started[0]]
    assert "1 more job(s) started meanwhile:\n  sneaky (job-sneaky-eeeeee)" in out
    assert "sneaky: stopped (stopped_by_user)" in out
    assert "left" not in out and out.rstrip().endswith("gpuflow is down")


def test_up_while_up_says_so_and_leaves_the_stack_reachable(
    cli: Cli, stack: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    home = tmp_path / "home"
    (home / "up.ready").write_text("http://127.0.0.1:8233")
    out = cli("up", code=1)
    assert f"gpuflow is already up (pid {stack.pid}); Temporal UI http://127.0.0.1:8233" in out
    # the running stack's files are its own: `down` still finds it
    assert (home / "up.pid").read_text() == str(stack.pid)
    assert (home / "up.ready").exists()
    assert "already up" in cli("up", "-d")
    cli("down")
    assert not _alive(stack)


def test_a_pid_file_naming_another_program_is_stale(tmp_path: Path, cli: Cli) -> None:
    other = subprocess.Popen(["sleep", "60"])  # the stack's old pid, reused by another program
    try:
        (tmp_path / "home").mkdir(parents=True, exist_ok=True)
        (tmp_path / "home" / "up.pid").write_text(str(other.pid))
        assert "gpuflow is not up" in cli("down")
        assert not (tmp_path / "home" / "up.pid").exists()
        assert other.poll() is None  # not signalled
    finally:
        other.kill()
        other.wait()


def test_a_failed_detached_start_says_why_without_colours(tmp_path: Path) -> None:
    from gpuflow.cli.stack import _failure_since

    log = tmp_path / "up.log"
    log.write_text("error: an earlier start's\n")
    start = log.stat().st_size
    with log.open("a") as handle:
        handle.write("starting gpuflow (home /h)…\n")
        handle.write("\x1b[2m2026-11-29T06:42:46Z\x1b[0m \x1b[33m WARN\x1b[0m core: noise\n")
        handle.write("error: cannot serve metrics on 127.0.0.1:9464 (Address already in use)\n")
    assert _failure_since(log, start) == (
        "cannot serve metrics on 127.0.0.1:9464 (Address already in use)"
    )
    start = log.stat().st_size
    with log.open("a") as handle:
        handle.write("\x1b[33m WARN\x1b[0m killed\n")
    assert _failure_since(log, start) == "WARN killed"


def _record(home: Path, pid: int, temporal: str | None = "127.0.0.1:27433") -> None:
    from gpuflow.stack_record import StackRecord, write_stack_record

    record = StackRecord(pid=pid, ui="http://127.0.0.1:28433", temporal=temporal)
    write_stack_record(home / "up.ready", record)


def test_down_refuses_to_stop_another_temporals_jobs(
    cli: Cli, stack: subprocess.Popen[bytes], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stack of this home serves 27433; GPUFLOW_TEMPORAL_PORT names the default stack's
    7233: `down` would have stopped that stack's jobs and held its admission, then stopped
    this one."""
    home = tmp_path / "home"
    _record(home, stack.pid)
    monkeypatch.setenv("GPUFLOW_TEMPORAL_PORT", "7233")
    cli.job("train", JobStatus.RUNNING, hosts=["box"])
    out = " ".join(cli("down", "-y", code=1).split())
    assert out == (
        f"error: the stack of GPUFLOW_HOME {home} serves Temporal at 127.0.0.1:27433, but "
        "GPUFLOW_TEMPORAL_PORT names 127.0.0.1:7233; unset it to stop this stack (nothing was "
        "stopped)"
    )
    assert cli.temporal.signals == []
    assert _alive(stack)
    monkeypatch.setenv("GPUFLOW_TEMPORAL_PORT", "27433")  # the stack's own: no conflict
    assert "train: stopped" in cli("down", "-y")
    assert not _alive(stack)
    assert not (home / "up.ready").exists()  # its `gpuflow up` is gone: so is its record


def test_down_forgets_the_record_of_a_killed_stack(cli: Cli, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir(parents=True, exist_ok=True)
    gone = subprocess.Popen([sys.executable, "-c", "pass", "gpuflow"])
    gone.wait()
    _record(home, gone.pid)
    assert cli("down").strip() == "gpuflow is not up"
    assert not (home / "up.ready").exists()


def test_up_while_up_names_the_ui_its_record_holds(
    cli: Cli, stack: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    _record(tmp_path / "home", stack.pid)
    out = " ".join(cli("up", code=1).split())
    assert f"already up (pid {stack.pid}); Temporal UI http://127.0.0.1:28433;" in out


def test_up_help_says_how_to_choose_home_and_ports(cli: Cli) -> None:
    """They were only in the README's Production section."""
    out = cli("up", "--help")
    assert max(len(line) for line in out.splitlines()) <= 80
    text = " ".join(out.split())
    for variable in (
        "GPUFLOW_HOME",
        "GPUFLOW_TEMPORAL_PORT (7233)",
        "GPUFLOW_UI_PORT (that port + 1000)",
        "GPUFLOW_METRICS_ADDRESS (127.0.0.1:9464; off",
        "GPUFLOW_TEMPORAL_ADDRESS",
    ):
        assert variable in text
    assert "A second stack on one machine needs its own value of each" in text
