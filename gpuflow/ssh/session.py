"""SSH sessions to the hosts of ssh fleets: how to reach a host (`SshTarget`), connecting with
a host key policy, running a remote command, writing files through the session, and the one-line
errors every way of failing gets (`ProvisioningError`). Used by `provisioning`, which keeps the
host agents running."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shlex
import socket
from collections.abc import AsyncIterator, Mapping
from enum import StrEnum
from pathlib import Path
from typing import Any

import asyncssh
from pydantic import BaseModel, ConfigDict, Field, field_validator

from gpuflow.errors import GpuflowError

__all__ = [
    "ProvisioningError",
    "ProvisioningProblem",
    "SshTarget",
    "connect",
    "gpuflow_known_hosts",
    "push_ssh_file",
    "push_ssh_files",
]

logger = logging.getLogger(__name__)


class ProvisioningProblem(StrEnum):
    """What went wrong while provisioning a host; it knows whether trying again can help."""

    UNREACHABLE = "unreachable"
    CONNECTION_REFUSED = "connection_refused"
    AUTH_FAILED = "auth_failed"
    HOST_KEY_MISMATCH = "host_key_mismatch"
    IDENTITY_FILE = "identity_file"
    PYTHON_MISSING = "python_missing"
    GPUFLOW_MISSING = "gpuflow_missing"
    STATE_DIR_IN_USE = "state_dir_in_use"
    AGENT_EXITED = "agent_exited"
    LOGIN_SHELL = "login_shell"
    REMOTE_COMMAND_FAILED = "remote_command_failed"

    @property
    def retryable(self) -> bool:
        """Network trouble may pass; a wrong key, file or interpreter needs a person."""
        return self in (
            ProvisioningProblem.UNREACHABLE,
            ProvisioningProblem.CONNECTION_REFUSED,
            ProvisioningProblem.REMOTE_COMMAND_FAILED,
        )


class ProvisioningError(GpuflowError):
    """A host could not be provisioned. The message is one line: the host and what to change."""

    def __init__(self, message: str, *, host_id: str, problem: ProvisioningProblem) -> None:
        super().__init__(message)
        self.host_id = host_id
        self.problem = problem

    def __reduce__(self) -> tuple[Any, ...]:
        # keyword-only arguments do not survive the default exception pickling
        return (_provisioning_error, (str(self), self.host_id, self.problem.value))


def _provisioning_error(message: str, host_id: str, problem: str) -> ProvisioningError:
    return ProvisioningError(message, host_id=host_id, problem=ProvisioningProblem(problem))


class SshTarget(BaseModel):
    """How to reach one host of an ssh fleet."""

    # a key pasted by mistake into identity_file must not be echoed in the validation error
    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

    host_id: str
    """gpuflow's id of the host; names it in every message."""
    hostname: str
    port: int = Field(default=22, ge=1, le=65535)
    user: str | None = None
    """Login user; None: the user that runs the control worker."""
    identity_file: str | None = None
    """Path of the private key on the control worker (never the key itself); None: the default
    keys of ~/.ssh and ssh-agent."""
    python: str = "python3"
    """The interpreter on the host that has gpuflow installed."""
    known_hosts: str | None = None
    """A known_hosts file to check the host key against strictly; None: accept a new host's key
    and remember it in GPUFLOW_HOME/known_hosts, refuse a changed one."""
    connect_timeout: float = Field(default=10.0, gt=0)
    """Seconds to connect, exchange keys and log in."""
    command_timeout: float = Field(default=60.0, gt=0)
    """Seconds for one remote command."""

    @field_validator("identity_file")
    @classmethod
    def _path_not_key(cls, value: str | None) -> str | None:
        if value is not None and ("\n" in value or "PRIVATE KEY" in value):
            raise ValueError("identity_file must be the path of a key file, not the key itself")
        return value

    @property
    def address(self) -> str:
        user = f"{self.user}@" if self.user else ""
        return f"{user}{self.hostname}:{self.port}"

    def error(self, problem: ProvisioningProblem, what: str) -> ProvisioningError:
        return ProvisioningError(
            f"host {self.host_id} ({self.address}): {what}", host_id=self.host_id, problem=problem
        )


def gpuflow_known_hosts() -> Path:
    """Where accepted host keys are remembered: GPUFLOW_HOME/known_hosts."""
    home = os.environ.get("GPUFLOW_HOME") or "~/.gpuflow"
    return Path(home).expanduser() / "known_hosts"


async def push_ssh_file(
    target: SshTarget, *, remote_path: str, content: bytes, mode: int = 0o600
) -> None:
    """Write a file on the host through the SSH session's standard input (no SFTP needed),
    created with `mode` before any byte is written and moved into place atomically. For the
    agent's secrets, Temporal TLS files and API key: they reach a host over SSH only, never
    through Temporal. A file that already holds `content` is left as it is, so that its
    identity (inode, mtime) changes only with its content. A leading `~/` is the login user's
    home."""
    await push_ssh_files(target, files={remote_path: content}, mode=mode)


async def push_ssh_files(
    target: SshTarget, *, files: Mapping[str, bytes], mode: int = 0o600
) -> None:
    """`push_ssh_file` for several files (remote path: content) over one SSH connection: a
    login costs far more than a file."""
    if not files:
        return
    async with connect(target) as conn:
        for remote_path, content in files.items():
            path = remote_path.removeprefix("~/")
            quoted = shlex.quote(path)
            script = (
                f'umask {0o777 & ~mode:03o} && mkdir -p "$(dirname {quoted})" && '
                f"cat > {quoted}.tmp && chmod {mode:o} {quoted}.tmp && "
                f"if cmp -s {quoted}.tmp {quoted}; "
                f"then rm -f {quoted}.tmp && chmod {mode:o} {quoted}; "
                f"else mv -f {quoted}.tmp {quoted}; fi"
            )
            try:
                result = await conn.run(
                    script,
                    input=content,
                    encoding=None,
                    check=False,
                    timeout=target.command_timeout,
                )
            except (asyncssh.Error, OSError):
                raise target.error(
                    ProvisioningProblem.UNREACHABLE,
                    "the SSH connection broke while writing a file; check the host",
                ) from None
            if result.exit_status != 0:
                raise target.error(
                    ProvisioningProblem.REMOTE_COMMAND_FAILED,
                    f"could not write {remote_path} on the host (exit {result.exit_status}); "
                    "check the login user's permissions there",
                )


# --- connecting -------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def connect(target: SshTarget) -> AsyncIterator[asyncssh.SSHClientConnection]:
    known_hosts, remember_in = _host_key_policy(target)
    options: dict[str, Any] = {
        "port": target.port,
        "known_hosts": known_hosts,
        "connect_timeout": target.connect_timeout,
        "preferred_auth": "publickey",
    }
    if target.user:
        options["username"] = target.user
    if target.identity_file:
        key_path = _readable_identity_file(target)
        # like OpenSSH's IdentitiesOnly: a named key is the only key offered
        options["client_keys"] = [str(key_path)]
        options["agent_path"] = None
    logger.debug("connecting to host %s at %s", target.host_id, target.address)
    try:
        conn = await asyncssh.connect(target.hostname, **options)
    except Exception as exc:
        raise _connect_error(target, exc) from None
    async with conn:
        if remember_in is not None:
            _remember_host_key(target, remember_in, conn.get_server_host_key())
        yield conn


def _readable_identity_file(target: SshTarget) -> Path:
    assert target.identity_file is not None
    path = Path(target.identity_file).expanduser()
    if not path.is_file() or not os.access(path, os.R_OK):
        raise target.error(
            ProvisioningProblem.IDENTITY_FILE,
            f"identity file {path} does not exist or cannot be read on the control worker; "
            "fix `identity_file` in the fleet file",
        )
    return path


def _connect_error(target: SshTarget, exc: Exception) -> ProvisioningError:
    """One line per way a connection fails. Our own words only: no library text can leak a key."""
    logger.debug("connecting to host %s failed: %s", target.host_id, type(exc).__name__)
    problem = ProvisioningProblem
    if isinstance(exc, asyncssh.HostKeyNotVerifiable):
        return _host_key_error(target)
    if isinstance(exc, asyncssh.PermissionDenied):
        key = f"key {target.identity_file}" if target.identity_file else "the default SSH keys"
        return target.error(
            problem.AUTH_FAILED,
            f"login as {target.user or 'the current user'} with {key} was refused; add the "
            "public key to the user's ~/.ssh/authorized_keys on the host or fix `user` / "
            "`identity_file`",
        )
    if isinstance(exc, asyncssh.KeyImportError | asyncssh.KeyEncryptionError):
        return target.error(
            problem.IDENTITY_FILE,
            f"identity file {target.identity_file} is not a private key gpuflow can use (or it "
            "needs a passphrase); point `identity_file` at an unencrypted private key",
        )
    if isinstance(exc, ConnectionRefusedError):
        return target.error(
            problem.CONNECTION_REFUSED,
            f"unreachable: connection refused; check that sshd runs on the host and that "
            f"`port` ({target.port}) is right",
        )
    if isinstance(exc, TimeoutError):
        return target.error(
            problem.UNREACHABLE,
            f"unreachable: no SSH login within {target.connect_timeout:g} s; check `hostname`, "
            "`port` and firewalls",
        )
    if isinstance(exc, socket.gaierror):
        return target.error(
            problem.UNREACHABLE,
            f"unreachable: cannot resolve {target.hostname}; fix `hostname`",
        )
    if isinstance(exc, OSError):
        return target.error(
            problem.UNREACHABLE,
            f"unreachable: {exc.strerror or type(exc).__name__}; check `hostname`, `port` and "
            "the network",
        )
    if isinstance(exc, asyncssh.DisconnectError):
        return target.error(
            problem.UNREACHABLE,
            "the SSH server closed the connection during login; check that `port` is an SSH "
            "server and read its log",
        )
    return target.error(
        problem.UNREACHABLE, f"SSH connection failed ({type(exc).__name__}); check the host"
    )


# --- host keys --------------------------------------------------------------------------------


def _host_key_error(target: SshTarget) -> ProvisioningError:
    if target.known_hosts:
        return target.error(
            ProvisioningProblem.HOST_KEY_MISMATCH,
            f"its host key is not trusted by {target.known_hosts}; add the host's key there "
            f"(ssh-keyscan -p {target.port} {target.hostname}) or fix `known_hosts`",
        )
    return target.error(
        ProvisioningProblem.HOST_KEY_MISMATCH,
        f"its host key changed since gpuflow first saw it (in {gpuflow_known_hosts()}); if "
        "the host was reinstalled delete its line there, otherwise the connection may be "
        "intercepted",
    )


def _known_hosts_pattern(target: SshTarget) -> str:
    return target.hostname if target.port == 22 else f"[{target.hostname}]:{target.port}"


def _known_keys(target: SshTarget, path: Path) -> tuple[asyncssh.SSHKey, ...] | None:
    """The keys `path` trusts for the target, or None when it names the target nowhere."""
    try:
        known = asyncssh.import_known_hosts(path.read_text()) if path.exists() else None
    except (OSError, ValueError):
        raise target.error(
            ProvisioningProblem.HOST_KEY_MISMATCH,
            f"known_hosts file {path} cannot be read; fix or delete it",
        ) from None
    if known is None:
        return None
    port = None if target.port == 22 else target.port
    host_keys, ca_keys, *_ = known.match(target.hostname, "", port)
    if not host_keys and not ca_keys:
        return None
    return tuple(host_keys)


def _host_key_policy(target: SshTarget) -> tuple[str | None, Path | None]:
    """(known_hosts argument for asyncssh, file to remember a new key in)."""
    if target.known_hosts:
        path = Path(target.known_hosts).expanduser()
        if not path.is_file():
            raise target.error(
                ProvisioningProblem.HOST_KEY_MISMATCH,
                f"known_hosts file {path} does not exist; fix `known_hosts` or leave it out to "
                "accept the host's key on first contact",
            )
        return str(path), None
    store = gpuflow_known_hosts()
    if _known_keys(target, store) is not None:
        return str(store), None
    # first contact: accept any key, then remember it (accept-new)
    return None, store


def _remember_host_key(target: SshTarget, store: Path, key: asyncssh.SSHKey | None) -> None:
    if key is None:
        return
    store.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(store, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "r+") as file:
        fcntl.flock(file, fcntl.LOCK_EX)
        # another connection may have remembered a key since we looked
        known = _known_keys(target, store)
        if known is not None:
            if key not in known:
                raise _host_key_error(target)
            return
        key_type, key_base64 = key.export_public_key("openssh").decode().split()[:2]
        file.write(f"{_known_hosts_pattern(target)} {key_type} {key_base64}\n")
    logger.info("remembered the host key of host %s in %s", target.host_id, store)
