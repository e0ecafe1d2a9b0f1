"""Provisioning of SSH hosts: read a host's facts and keep exactly one host agent running there.

Plain async functions, wrapped as Temporal activities elsewhere. Activities run at least once, so
every operation is idempotent: ensuring a running agent starts nothing, stopping a stopped one
does nothing. Only the *path* of a key file ever travels in a model or a message, never a key.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import inspect
import json
import logging
import os
import re
import shlex
import socket
import textwrap
from collections.abc import AsyncIterator, Mapping, Sequence
from enum import StrEnum
from pathlib import Path
from typing import Any

import asyncssh
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gpuflow.errors import GpuflowError
from gpuflow.specs.fleet import HostDecl
from gpuflow.worker.facts import HostFacts

__all__ = [
    "AGENT_COMMAND",
    "FACTS_COMMAND",
    "AgentStatus",
    "AgentStopped",
    "ProvisioningError",
    "ProvisioningProblem",
    "SshTarget",
    "ensure_ssh_agent",
    "gpuflow_known_hosts",
    "push_ssh_file",
    "push_ssh_files",
    "ssh_host_facts",
    "ssh_target_for",
    "stop_ssh_agent",
]

logger = logging.getLogger(__name__)

FACTS_COMMAND: tuple[str, ...] = ("{python}", "-m", "gpuflow.worker.agent", "--facts")
"""Prints the host's HostFacts as JSON on stdout. `{python}` is the target's interpreter."""

AGENT_COMMAND: tuple[str, ...] = (
    "{python}", "-m", "gpuflow.worker.agent",
    "--host-id", "{host_id}",
    "--task-queue", "{task_queue}",
    "--temporal-address", "{temporal_address}",
    "--namespace", "{namespace}",
    "--state-dir", "{state_dir}",
)  # fmt: skip
"""The host agent's argv; each item is formatted with the fields above (`{{` for a brace)."""

_AGENT_FIELDS = ("python", "host_id", "task_queue", "temporal_address", "namespace", "state_dir")
_AGENT_TLS_FLAGS = {
    "tls_ca": "--tls-ca",
    "tls_cert": "--tls-cert",
    "tls_key": "--tls-key",
    "api_key_file": "--api-key-file",
    "tls_server_name": "--tls-server-name",
}
"""Optional agent flags, by the `ensure_ssh_agent` argument that sets them; appended to the
command only when set, so an agent without TLS keeps the command line it always had."""
_AGENT_FILE_FIELDS = ("tls_ca", "tls_cert", "tls_key", "api_key_file")
"""Those that name a file on the host, which the agent reads when it connects."""
_STOP_TIMEOUT_S = 10.0
_STARTUP_GRACE_S = 1.0


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


class AgentStatus(BaseModel):
    """The host agent that runs after `ensure_ssh_agent`."""

    model_config = ConfigDict(frozen=True)

    host_id: str
    started: bool
    """False when the agent was already running with the same command."""
    pid: int
    log_path: str
    """The agent's log on the host."""
    replaced_pid: int | None = None
    """The agent that ran with another command and was stopped to start this one."""


class AgentStopped(BaseModel):
    model_config = ConfigDict(frozen=True)

    host_id: str
    stopped: bool
    """False when no agent was running."""
    pid: int | None = None


def ssh_target_for(host: HostDecl, *, host_id: str) -> SshTarget:
    """The target of a host declared in an ssh fleet."""
    if not host.hostname:
        raise ValueError(f"host {host.name} has no hostname; only ssh fleet hosts have targets")
    return SshTarget(
        host_id=host_id,
        hostname=host.hostname,
        port=host.port,
        user=host.user,
        identity_file=host.identity_file,
        python=host.python,
        known_hosts=host.known_hosts,
    )


def gpuflow_known_hosts() -> Path:
    """Where accepted host keys are remembered: GPUFLOW_HOME/known_hosts."""
    home = os.environ.get("GPUFLOW_HOME") or "~/.gpuflow"
    return Path(home).expanduser() / "known_hosts"


async def ssh_host_facts(target: SshTarget, *, command: Sequence[str] = FACTS_COMMAND) -> HostFacts:
    """The facts of the host, as gpuflow on the host reports them."""
    async with _connect(target) as conn:
        result = await _run(conn, target, _shell(command, target.python))
    _check_exit(target, result)
    stdout = str(result.stdout or "").strip()
    for candidate in (stdout, stdout.rsplit("\n", 1)[-1]):
        try:
            return HostFacts.model_validate_json(candidate)
        except ValidationError:
            continue
    raise target.error(
        ProvisioningProblem.REMOTE_COMMAND_FAILED,
        "the host printed facts this gpuflow cannot read; install the same gpuflow version "
        "on the host and on the control worker",
    )


async def ensure_ssh_agent(
    target: SshTarget,
    *,
    temporal_address: str,
    namespace: str,
    task_queue: str,
    state_dir: str,
    tls: bool | None = None,
    tls_ca: str | None = None,
    tls_cert: str | None = None,
    tls_key: str | None = None,
    tls_server_name: str | None = None,
    api_key_file: str | None = None,
    agent_command: Sequence[str] = AGENT_COMMAND,
) -> AgentStatus:
    """Make sure exactly one agent for this host runs on it, with this command line.

    An agent already running with the same command is left alone; one with another command
    (say, a new Temporal address) is stopped and replaced, and so is one whose TLS or API key
    files changed on the host since it started (it reads them only when connecting). Concurrent
    calls are serialized by a lock file in `state_dir`, which belongs to this host's agent alone.

    `tls` and the rest map onto the agent's `--tls`/`--no-tls`, `--tls-ca`... flags and are
    passed only when set; the files are paths on the host (`~/` is the login user's home),
    already there: see `push_ssh_file`. The API key goes only as a file: the command line is
    visible in `ps` on the host and kept in the agent's pidfile."""
    _check_template(agent_command)
    options = {
        "tls_ca": tls_ca,
        "tls_cert": tls_cert,
        "tls_key": tls_key,
        "api_key_file": api_key_file,
        "tls_server_name": tls_server_name,
    }
    flags = [] if tls is None else ["--tls" if tls else "--no-tls"]
    values = {
        "python": target.python,
        "host_id": target.host_id,
        "task_queue": task_queue,
        "temporal_address": temporal_address,
        "namespace": namespace,
    }
    for name, value in options.items():
        if value is not None:
            # the value goes through `values`, so a brace in a path is not read as a template
            flags += [_AGENT_TLS_FLAGS[name], "{" + name + "}"]
            values[name] = value
    request = {
        "op": "ensure",
        "host_id": target.host_id,
        "state_dir": state_dir,
        "argv_template": [*agent_command, *flags],
        "values": values,
        "files": [name for name in _AGENT_FILE_FIELDS if options[name] is not None],
        "stop_timeout": _STOP_TIMEOUT_S,
        "startup_grace": _STARTUP_GRACE_S,
    }
    reply = await _agent_control_over_ssh(target, request)
    status = AgentStatus(
        host_id=target.host_id,
        started=reply["started"],
        pid=reply["pid"],
        log_path=reply["log_path"],
        replaced_pid=reply.get("replaced_pid"),
    )
    verb = "started" if status.started else "already running"
    logger.info("agent of host %s %s (pid %d)", target.host_id, verb, status.pid)
    return status


async def stop_ssh_agent(target: SshTarget, *, state_dir: str) -> AgentStopped:
    """Stop this host's agent (SIGTERM, then SIGKILL after a grace); nothing to do is fine.

    Job processes run in their own sessions and are not touched."""
    request = {
        "op": "stop",
        "host_id": target.host_id,
        "state_dir": state_dir,
        "stop_timeout": _STOP_TIMEOUT_S,
    }
    reply = await _agent_control_over_ssh(target, request)
    stopped = AgentStopped(host_id=target.host_id, stopped=reply["stopped"], pid=reply["pid"])
    if stopped.stopped:
        logger.info("agent of host %s stopped (pid %d)", target.host_id, stopped.pid)
    return stopped


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
    async with _connect(target) as conn:
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
async def _connect(target: SshTarget) -> AsyncIterator[asyncssh.SSHClientConnection]:
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


# --- remote commands --------------------------------------------------------------------------


def _program(python: str) -> str:
    # a quoted ~ is not expanded by the remote shell, and `~/venv/bin/python` is a natural value
    if python.startswith("~/"):
        return '"$HOME"/' + shlex.quote(python[2:])
    return shlex.quote(python)


def _shell(argv: Sequence[str], python: str) -> str:
    words = []
    for item in argv:
        if item == "{python}":
            words.append(_program(python))
        else:
            words.append(shlex.quote(item.format(python=python)))
    return " ".join(words)


def _check_template(argv: Sequence[str]) -> None:
    try:
        for item in argv:
            item.format(**dict.fromkeys(_AGENT_FIELDS, ""))
    except (KeyError, IndexError, ValueError) as exc:
        raise ValueError(f"agent command item {item!r} is not a valid template: {exc}") from None


async def _run(
    conn: asyncssh.SSHClientConnection, target: SshTarget, command: str
) -> asyncssh.SSHCompletedProcess:
    try:
        return await conn.run(command, check=False, timeout=target.command_timeout)
    except asyncssh.TimeoutError:
        raise target.error(
            ProvisioningProblem.REMOTE_COMMAND_FAILED,
            f"a gpuflow command did not finish within {target.command_timeout:g} s on the host",
        ) from None
    except (asyncssh.Error, OSError):
        raise target.error(
            ProvisioningProblem.UNREACHABLE,
            "the SSH connection broke while running a gpuflow command; check the host",
        ) from None


def _last_line(text: object) -> str:
    lines = [line.strip() for line in str(text or "").splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def _check_exit(target: SshTarget, result: asyncssh.SSHCompletedProcess) -> None:
    if result.exit_status == 0:
        return
    stderr = str(result.stderr or "")
    if result.exit_status in (126, 127):
        raise target.error(
            ProvisioningProblem.PYTHON_MISSING,
            f"{target.python} cannot be run on the host; install Python 3.11+ with gpuflow "
            "there or set `python` to the interpreter that has gpuflow",
        )
    missing = re.search(r"No module named '(gpuflow[\w.]*)'", stderr)
    if missing and missing.group(1) in ("gpuflow", "gpuflow.worker", "gpuflow.worker.agent"):
        raise target.error(
            ProvisioningProblem.GPUFLOW_MISSING,
            f"gpuflow is not installed for {target.python} on the host; pip install gpuflow "
            "there or set `python` to the interpreter that has it",
        )
    if missing:
        raise target.error(
            ProvisioningProblem.GPUFLOW_MISSING,
            f"gpuflow on the host cannot import {missing.group(1)}; install the same gpuflow "
            "version on the host as on the control worker",
        )
    detail = _last_line(stderr) or f"exit status {result.exit_status}"
    raise target.error(
        ProvisioningProblem.REMOTE_COMMAND_FAILED, f"a gpuflow command failed on the host: {detail}"
    )


async def _agent_control_over_ssh(target: SshTarget, request: dict[str, Any]) -> dict[str, Any]:
    command = " ".join(
        [
            _program(target.python),
            "-c",
            shlex.quote(_agent_control_script()),
            shlex.quote(json.dumps(request)),
        ]
    )
    async with _connect(target) as conn:
        result = await _run(conn, target, command)
    _check_exit(target, result)
    try:
        reply: dict[str, Any] = json.loads(_last_line(result.stdout))
    except ValueError:
        raise target.error(
            ProvisioningProblem.REMOTE_COMMAND_FAILED,
            f"the agent control script gave no answer: {_last_line(result.stderr)}",
        ) from None
    error = reply.get("error")
    if error is not None:
        raise target.error(ProvisioningProblem(error), reply["message"])
    return reply


@functools.cache
def _agent_control_script() -> str:
    source = textwrap.dedent(inspect.getsource(_agent_control))
    return (
        "from __future__ import annotations\nimport sys\n"
        f"{source}\nraise SystemExit(_agent_control(sys.argv[1]))\n"
    )


def _agent_control(request_json: str) -> int:
    """Runs on the host, sent as source: find, start or stop this host's agent; prints a reply.

    Self-contained on purpose (standard library only, imported inside) so that the host needs
    nothing but Python to run it. The pidfile records the agent's argv, and a pid counts as the
    agent only while its command line still ends with those arguments: a reused pid or a zombie
    does not. The pidfile also records the identity of the files the agent reads when it
    connects (TLS, API key): a changed file means a restart, or the agent would go on with an
    old certificate or key."""
    import fcntl
    import importlib.util
    import json
    import os
    import signal
    import subprocess
    import time

    request = json.loads(request_json)
    host_id = request["host_id"]
    state_dir = os.path.abspath(os.path.expanduser(request["state_dir"]))
    pid_path = os.path.join(state_dir, "agent.pid")
    log_path = os.path.join(state_dir, "agent.log")
    values = dict(request.get("values", {}), state_dir=state_dir)
    values["python"] = os.path.expanduser(values.get("python", ""))
    # the agent is started without a shell, so `~` is expanded here; relative to the login
    # directory, like `push_ssh_file`
    file_fields = request.get("files", [])
    for name in file_fields:
        values[name] = os.path.abspath(os.path.expanduser(values[name]))

    def file_identities() -> dict[str, list[int]]:
        identities: dict[str, list[int]] = {}
        for name in file_fields:
            try:
                stat = os.stat(values[name])
            except OSError:
                continue  # the agent says which file it cannot read
            identities[values[name]] = [stat.st_ino, stat.st_mtime_ns, stat.st_size]
        return identities

    def reply(**fields: object) -> int:
        print(json.dumps(fields))
        return 0

    def command_line(pid: int) -> str | None:
        try:
            os.kill(pid, 0)
        except OSError:
            return None
        if os.path.isdir("/proc/self"):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as file:
                    raw = file.read()
            except OSError:
                return None
            words = [word.decode(errors="replace") for word in raw.split(b"\0") if word]
            return " ".join(words) or None
        ps = subprocess.run(["ps", "-p", str(pid), "-o", "command="], capture_output=True)
        return ps.stdout.decode(errors="replace").strip() or None

    def running(record: dict[str, object]) -> bool:
        pid, argv = record.get("pid"), record.get("argv")
        if not isinstance(pid, int) or not isinstance(argv, list):
            return False
        line = command_line(pid)
        # only the arguments count: a wrapper such as a pyenv shim or a venv launcher script
        # execs the real interpreter under the same pid, which changes the program's name
        arguments = " ".join(str(word) for word in argv[1:])
        if line is None or not arguments:
            return line is not None
        return line == arguments or line.endswith(" " + arguments)

    def read_record() -> dict[str, object] | None:
        try:
            with open(pid_path) as file:
                record = json.load(file)
        except (OSError, ValueError):
            return None
        return record if isinstance(record, dict) else None

    def signal_agent(pid: int, signum: int) -> None:
        try:
            if os.getpgid(pid) == pid:
                os.killpg(pid, signum)
            else:
                os.kill(pid, signum)
        except OSError:
            pass

    def stop(record: dict[str, object]) -> None:
        pid = int(str(record["pid"]))
        for signum, wait_s in ((signal.SIGTERM, request["stop_timeout"]), (signal.SIGKILL, 5.0)):
            signal_agent(pid, signum)
            deadline = time.monotonic() + wait_s
            while running(record) and time.monotonic() < deadline:
                time.sleep(0.05)
            if not running(record):
                return

    def other_host(record: dict[str, object]) -> int:
        return reply(
            error="state_dir_in_use",
            message=f"state dir {state_dir} belongs to the running agent of host "
            f"{record.get('host_id')}; give every host its own state dir",
        )

    os.makedirs(state_dir, exist_ok=True)
    os.chdir(state_dir)
    with open(os.path.join(state_dir, "agent.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        record = read_record()
        is_running = record is not None and running(record)
        if record is not None and is_running and record.get("host_id") != host_id:
            return other_host(record)

        if request["op"] == "stop":
            if record is None or not is_running:
                if record is not None:
                    os.unlink(pid_path)
                return reply(stopped=False, pid=None)
            stop(record)
            os.unlink(pid_path)
            return reply(stopped=True, pid=record["pid"])

        argv = [item.format(**values) for item in request["argv_template"]]
        identities = file_identities()
        if record is not None and is_running:
            if record.get("argv") == argv and record.get("files", {}) == identities:
                return reply(started=False, pid=record["pid"], log_path=log_path)
            stop(record)
        replaced_pid = record["pid"] if record is not None and is_running else None

        if len(argv) > 2 and argv[1] == "-m":
            try:
                found = importlib.util.find_spec(argv[2]) is not None
            except ImportError:
                found = False
            if not found:
                return reply(
                    error="gpuflow_missing",
                    message=f"{argv[0]} on the host cannot import {argv[2]}; pip install "
                    "gpuflow there or set `python` to the interpreter that has it",
                )
        with open(log_path, "ab") as log:
            try:
                process = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            except OSError as exc:
                return reply(
                    error="python_missing",
                    message=f"cannot start {argv[0]} on the host ({exc.strerror}); set "
                    "`python` to the interpreter that has gpuflow",
                )
        temporary = pid_path + ".tmp"
        with open(temporary, "w") as file:
            json.dump(
                {"pid": process.pid, "host_id": host_id, "argv": argv, "files": identities}, file
            )
        os.replace(temporary, pid_path)

        deadline = time.monotonic() + request["startup_grace"]
        while process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if process.poll() is not None:
            os.unlink(pid_path)
            with open(log_path, "rb") as log_file:
                lines = log_file.read()[-4000:].decode(errors="replace").strip().splitlines()
            last = lines[-1].strip()[:300] if lines else "no output"
            return reply(
                error="agent_exited",
                message=f"the agent exited at once (status {process.returncode}): {last}; "
                f"see {log_path} on the host",
            )
        return reply(started=True, pid=process.pid, log_path=log_path, replaced_pid=replaced_pid)
