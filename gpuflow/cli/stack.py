"""`gpuflow up` and `gpuflow down`."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console

from gpuflow.errors import GpuflowError
from gpuflow.store.db import gpuflow_home


def _pid_file(home: Path) -> Path:
    return home / "up.pid"


def _ready_file(home: Path) -> Path:
    return home / "up.ready"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def up_foreground(console: Console) -> None:
    from gpuflow.worker.embedded import serve

    home = gpuflow_home()
    home.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    ready = _ready_file(home)
    ready.unlink(missing_ok=True)
    _pid_file(home).write_text(str(os.getpid()))
    console.print(f"starting gpuflow (home {home})…")
    try:
        asyncio.run(serve(home=home, ready_file=ready))
    finally:
        _pid_file(home).unlink(missing_ok=True)
        ready.unlink(missing_ok=True)


def up_detached(console: Console, *, timeout_s: float = 120) -> None:
    home = gpuflow_home()
    home.mkdir(parents=True, exist_ok=True)
    pid_file = _pid_file(home)
    if pid_file.exists() and _alive(int(pid_file.read_text() or 0)):
        ui = _ready_file(home).read_text() if _ready_file(home).exists() else "?"
        console.print(f"gpuflow is already up (pid {pid_file.read_text()}); UI {ui}")
        return
    _ready_file(home).unlink(missing_ok=True)
    log = (home / "up.log").open("ab")
    process = subprocess.Popen(
        [sys.executable, "-m", "gpuflow.cli.main", "up"],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        env=os.environ.copy(),
    )
    deadline = time.monotonic() + timeout_s
    with console.status("starting Temporal dev server, control worker and local agent…"):
        while time.monotonic() < deadline:
            if process.poll() is not None:
                tail = (home / "up.log").read_text(errors="replace").strip().splitlines()[-5:]
                raise GpuflowError("gpuflow up failed: " + " | ".join(tail))
            if _ready_file(home).exists():
                break
            time.sleep(0.2)
        else:
            process.terminate()
            raise GpuflowError(
                f"gpuflow up did not become ready in {timeout_s:.0f}s (see {home / 'up.log'})"
            )
    console.print(
        f"gpuflow is up (pid {process.pid}); Temporal UI at "
        f"[link]{_ready_file(home).read_text()}[/]; logs in {home / 'up.log'}"
    )


def down(console: Console, *, timeout_s: float = 60) -> None:
    home = gpuflow_home()
    pid_file = _pid_file(home)
    if not pid_file.exists():
        console.print("gpuflow is not up")
        return
    pid = int(pid_file.read_text() or 0)
    if not _alive(pid):
        pid_file.unlink(missing_ok=True)
        console.print("gpuflow is not up (removed a stale pid file)")
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    with console.status("stopping gpuflow…"):
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
    if _alive(pid):
        os.kill(pid, signal.SIGKILL)
    pid_file.unlink(missing_ok=True)
    console.print("gpuflow is down")
