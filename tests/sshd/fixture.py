"""A real OpenSSH server on 127.0.0.1 for integration tests (pytest plugin module).

Register it with `pytest_plugins = ["tests.sshd.fixture"]`. The `sshd` fixture (session scope)
yields an `SshServer`: a throwaway sshd with its own host key, one generated client key in
`authorized_keys`, and logins allowed only for the user running the tests, by key.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

SSHD = "/usr/sbin/sshd"
STARTUP_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class SshServer:
    host: str
    """Always a loopback address."""
    port: int
    user: str
    identity_file: str
    """Path of a private key that the server accepts."""
    host_public_key: str
    """The server's host key, `<type> <base64>`, for writing a known_hosts line."""
    authorized_keys: str
    """Path of the server's authorized_keys file; append a public key line to admit it."""
    log_file: str
    """sshd's own log (-e), to read when a test fails."""

    def known_hosts_line(self) -> str:
        """This server's line in OpenSSH known_hosts format."""
        return f"[{self.host}]:{self.port} {self.host_public_key}\n"

    def fleet(
        self, name: str, tmp_path: Path, temporal_address: str, env: pytest.MonkeyPatch
    ) -> dict[str, Any]:
        """The fields of an ssh fleet of one host `box`: this server, its agent this checkout's
        gpuflow (an interpreter wrapper on PYTHONPATH) in `tmp_path/remote-agent`, reaching
        Temporal at `temporal_address`; GPUFLOW_HOME (`tmp_path/home`) and the agent's Temporal
        address are set in the environment through `env`."""
        python = tmp_path / "python"
        python.write_text(f'#!/bin/sh\nPYTHONPATH="{REPO}" exec "{sys.executable}" "$@"\n')
        python.chmod(0o755)
        env.setenv("GPUFLOW_HOME", str(tmp_path / "home"))
        env.setenv("GPUFLOW_AGENT_TEMPORAL_ADDRESS", temporal_address)
        host = {
            "name": "box",
            "hostname": self.host,
            "port": self.port,
            "user": self.user,
            "identity_file": self.identity_file,
            "python": str(python),
            "agent_dir": str(tmp_path / "remote-agent"),
        }
        return {"type": "fleet", "name": name, "kind": "ssh", "hosts": [host]}


REPO = Path(__file__).resolve().parents[2]


def agent_pid(agent_dir: Path) -> int | None:
    """The pid (and process group) of the agent started in `agent_dir`, if one was."""
    pidfile = next(agent_dir.glob("*/agent.pid"), None)
    if pidfile is None:
        return None
    pid: int = json.loads(pidfile.read_text())["pid"]
    return pid


def stop_agent(agent_dir: Path) -> None:
    """Stop the agent started in `agent_dir` (its process group), if one was."""
    pid = agent_pid(agent_dir)
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)


def generate_key(path: Path, *, comment: str = "gpuflow-test") -> Path:
    """A new ed25519 key pair without passphrase at `path` (private) and `path`.pub."""
    ssh_keygen = shutil.which("ssh-keygen") or "/usr/bin/ssh-keygen"
    subprocess.run(
        [ssh_keygen, "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True,
        stdin=subprocess.DEVNULL,
        capture_output=True,
    )
    return path


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2) as sock:
            # sshd speaks first; its banner means it is really sshd, not a reused port
            sock.settimeout(1.0)
            return sock.recv(4).startswith(b"SSH-")
    except OSError:
        return False


def _config(root: Path, port: int, host_key: Path, authorized_keys: Path) -> str:
    return "\n".join(
        [
            "ListenAddress 127.0.0.1",
            f"Port {port}",
            f"HostKey {host_key}",
            f"AuthorizedKeysFile {authorized_keys}",
            f"PidFile {root / 'sshd.pid'}",
            "PermitRootLogin prohibit-password",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "StrictModes no",
            "UsePAM no",
            "PrintMotd no",
            "X11Forwarding no",
            "AllowTcpForwarding no",
            "LogLevel VERBOSE",
            "",
        ]
    )


def _start(
    root: Path, authorized_keys: Path, host_key: Path, log: Path
) -> tuple[subprocess.Popen[bytes], int]:
    """sshd in the foreground on a free port; a port taken in between gets one more try."""
    last_error = ""
    for _ in range(3):
        port = _free_port()
        config = root / "sshd_config"
        config.write_text(_config(root, port, host_key, authorized_keys))
        with log.open("ab") as log_out:
            process = subprocess.Popen(
                [SSHD, "-D", "-e", "-f", str(config)],
                stdin=subprocess.DEVNULL,
                stdout=log_out,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline and process.poll() is None:
            if _accepts(port):
                return process, port
            time.sleep(0.05)
        if process.poll() is None:
            process.kill()
            process.wait()
        last_error = log.read_text(errors="replace")[-2000:]
    raise RuntimeError(f"sshd did not start on 127.0.0.1; its log:\n{last_error}")


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshServer]:
    """A running OpenSSH server on 127.0.0.1 that admits `identity_file` for the current user."""
    if not os.path.exists(SSHD):
        pytest.skip(
            f"OpenSSH server is not installed ({SSHD} is missing; apt install openssh-server)"
        )
    root = tmp_path_factory.mktemp("sshd")
    host_key = generate_key(root / "ssh_host_ed25519_key", comment="gpuflow-test-host")
    client_key = generate_key(root / "client_ed25519", comment="gpuflow-test-client")
    authorized_keys = root / "authorized_keys"
    authorized_keys.write_text(Path(f"{client_key}.pub").read_text())
    if os.geteuid() == 0:
        # sshd's privilege separation directory; Debian creates it only from its service unit
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
    log = root / "sshd.log"
    process, port = _start(root, authorized_keys, host_key, log)
    key_type, key_base64 = Path(f"{host_key}.pub").read_text().split()[:2]
    try:
        yield SshServer(
            host="127.0.0.1",
            port=port,
            user=getpass.getuser(),
            identity_file=str(client_key),
            host_public_key=f"{key_type} {key_base64}",
            authorized_keys=str(authorized_keys),
            log_file=str(log),
        )
    finally:
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
