"""The processes a chaos run (chaos.py) starts, kills with SIGKILL and starts again: the Temporal
dev server and the control worker, and the job processes found under the run's home.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpuflow.control.embedded import DevServer

ROOT = Path(__file__).resolve().parent.parent
READY_LINE = "control worker polling"
T0 = time.monotonic()


def say(message: str) -> None:
    print(f"[{time.monotonic() - T0:6.1f}s] {message}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def job_processes(home: Path) -> list[int]:
    """Pids of processes whose working directory is under `home` (job processes)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cwd = os.readlink(entry / "cwd")
            except OSError:
                continue
            if cwd.startswith(str(home)):
                pids.append(int(entry.name))
    return pids


class Stack:
    """The dev server and the control worker, each killable and restartable."""

    def __init__(self, home: Path, database_url: str) -> None:
        self.home = home
        self.database_url = database_url
        self.port, self.ui_port = free_port(), free_port()
        self.server: DevServer | None = None
        self.worker: subprocess.Popen[bytes] | None = None
        self.worker_log = home / "control.log"
        self._log_offset = 0
        """Where the running worker's lines begin in the log."""
        self.worker_starts = 0
        self.worker_exits = 0
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLOW_")}
        self.env |= {
            "GPUFLOW_HOME": str(home),
            "GPUFLOW_TEMPORAL_PORT": str(self.port),
            "GPUFLOW_DATABASE_URL": database_url,
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        }

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start_server(self) -> None:
        from gpuflow.control.embedded import start_dev_server

        self.server = start_dev_server(self.home / "temporal", port=self.port, ui_port=self.ui_port)

    def kill_server(self) -> None:
        assert self.server is not None
        self.server.process.kill()
        self.server.process.wait()

    def start_worker(self) -> None:
        log = self.worker_log.open("ab")
        self._log_offset = log.tell()
        self.worker = subprocess.Popen(
            [sys.executable, "-m", "gpuflow.control.main"],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # Ctrl-C reaches this script only; it stops the worker
        )
        log.close()
        self.worker_starts += 1

    def kill_worker(self) -> None:
        assert self.worker is not None
        self.worker.kill()
        self.worker.wait()

    def worker_ready(self) -> bool:
        """Whether the running worker has started polling."""
        with self.worker_log.open("rb") as log:
            log.seek(self._log_offset)
            return READY_LINE.encode() in log.read()

    def wait_worker(self, timeout_s: float = 180) -> None:
        """Until the control worker polls; one that exited is started again (bounded)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.worker is not None
            if self.worker.poll() is not None:
                self.worker_exits += 1
                if self.worker_exits > 20:
                    raise RuntimeError(f"the control worker keeps exiting; see {self.worker_log}")
                say(f"control worker exited by itself (code {self.worker.returncode}); restart")
                self.start_worker()
            elif self.worker_ready():
                return
            time.sleep(0.1)
        raise RuntimeError(f"the control worker did not poll in {timeout_s:.0f}s")

    def close(self) -> None:
        """Stop everything this run started: worker, dev server, job processes."""
        if self.worker is not None and self.worker.poll() is None:
            self.worker.terminate()
            try:
                self.worker.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill_worker()
        if self.server is not None:
            self.server.stop()
        for pid in job_processes(self.home):
            with contextlib.suppress(OSError):  # it ended meanwhile
                os.killpg(os.getpgid(pid), signal.SIGKILL)
