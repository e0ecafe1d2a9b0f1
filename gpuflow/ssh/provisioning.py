"""Provisioning of SSH hosts: read a host's facts and keep exactly one host agent running there.

Plain async functions, wrapped as Temporal activities elsewhere. Activities run at least once, so
every operation is idempotent: ensuring a running agent starts nothing, stopping a stopped one
does nothing. Only the *path* of a key file ever travels in a model or a message, never a key.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import shlex
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from gpuflow.specs.fleet import HostDecl
from gpuflow.ssh.commands import check_exit, last_line, program, run_command, shell_command
from gpuflow.ssh.remote_agent import agent_control
from gpuflow.ssh.session import (
    ProvisioningError,
    ProvisioningProblem,
    SshTarget,
    connect,
    gpuflow_known_hosts,
    push_ssh_file,
    push_ssh_files,
)
from gpuflow.workflows.models import HostFacts

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
    "ssh_target",
    "ssh_target_for",
    "stop_ssh_agent",
]

logger = logging.getLogger(__name__)

FACTS_COMMAND: tuple[str, ...] = ("{python}", "-m", "gpuflow.agent.main", "--facts")
"""Prints the host's HostFacts as JSON on stdout. `{python}` is the target's interpreter."""

AGENT_COMMAND: tuple[str, ...] = (
    "{python}", "-m", "gpuflow.agent.main",
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


def ssh_target(host_id: str, settings: Mapping[str, Any]) -> SshTarget:
    """The target of a host from its SSH settings (HostDecl.ssh_settings, as the store keeps
    them): the one place a target is built. Unset fields take the target's defaults."""
    fields = {k: v for k, v in settings.items() if k != "state_dir" and v is not None}
    return SshTarget(host_id=host_id, **fields)


def ssh_target_for(host: HostDecl, *, host_id: str) -> SshTarget:
    """The target of a host declared in an ssh fleet."""
    if not host.hostname:
        raise ValueError(f"host {host.name} has no hostname; only ssh fleet hosts have targets")
    return ssh_target(host_id, host.ssh_settings())


async def ssh_host_facts(target: SshTarget, *, command: Sequence[str] = FACTS_COMMAND) -> HostFacts:
    """The facts of the host, as gpuflow on the host reports them."""
    async with connect(target) as conn:
        result = await run_command(conn, target, shell_command(command, target.python))
    check_exit(target, result)
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


def _check_template(argv: Sequence[str]) -> None:
    try:
        for item in argv:
            item.format(**dict.fromkeys(_AGENT_FIELDS, ""))
    except (KeyError, IndexError, ValueError) as exc:
        raise ValueError(f"agent command item {item!r} is not a valid template: {exc}") from None


async def _agent_control_over_ssh(target: SshTarget, request: dict[str, Any]) -> dict[str, Any]:
    command = " ".join(
        [
            program(target.python),
            "-c",
            shlex.quote(_agent_control_script()),
            shlex.quote(json.dumps(request)),
        ]
    )
    async with connect(target) as conn:
        result = await run_command(conn, target, command)
    check_exit(target, result)
    try:
        reply: dict[str, Any] = json.loads(last_line(result.stdout))
    except ValueError:
        raise target.error(
            ProvisioningProblem.REMOTE_COMMAND_FAILED,
            f"the agent control script gave no answer: {last_line(result.stderr)}",
        ) from None
    error = reply.get("error")
    if error is not None:
        raise target.error(ProvisioningProblem(error), reply["message"])
    return reply


@functools.cache
def _agent_control_script() -> str:
    source = textwrap.dedent(inspect.getsource(agent_control))
    return (
        "from __future__ import annotations\nimport sys\n"
        f"{source}\nraise SystemExit(agent_control(sys.argv[1]))\n"
    )
