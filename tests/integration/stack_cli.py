"""What the tests that run the `gpuflow` command as a user does share: a free loopback port,
and the command run to its end (it must succeed)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def gpuflow(*args: str, timeout_s: float = 180) -> str:
    """`python -m gpuflow ARGS`'s stdout and stderr; it must exit 0."""
    done = subprocess.run(
        [sys.executable, "-m", "gpuflow", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert done.returncode == 0, f"gpuflow {' '.join(args)} -> {done.returncode}\n{done.stderr}"
    return done.stdout + done.stderr
