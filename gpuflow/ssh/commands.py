"""Running gpuflow's commands on a host over an open SSH connection (session.py opens it): the
remote command line, and an exit status turned into the problem a user can fix."""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence

import asyncssh

from gpuflow.ssh.session import ProvisioningProblem, SshTarget


def program(python: str) -> str:
    # a quoted ~ is not expanded by the remote shell, and `~/venv/bin/python` is a natural value
    if python.startswith("~/"):
        return '"$HOME"/' + shlex.quote(python[2:])
    return shlex.quote(python)


def shell_command(argv: Sequence[str], python: str) -> str:
    words = []
    for item in argv:
        if item == "{python}":
            words.append(program(python))
        else:
            words.append(shlex.quote(item.format(python=python)))
    return " ".join(words)


async def run_command(
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


NOLOGIN = "This account is currently not available"
"""What nologin(8) prints, whatever the command, when a user whose login shell it is logs in."""


def last_line(text: object) -> str:
    lines = [line.strip() for line in str(text or "").splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def check_exit(target: SshTarget, result: asyncssh.SSHCompletedProcess) -> None:
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
    if missing and missing.group(1) in ("gpuflow", "gpuflow.worker", "gpuflow.agent.main"):
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
    stdout = str(result.stdout or "")
    if NOLOGIN in stdout or NOLOGIN in stderr:
        who = f"user {target.user}" if target.user else "the login user"
        raise target.error(
            ProvisioningProblem.LOGIN_SHELL,
            f"{who} may log in but runs no commands (its login shell is nologin); give it a "
            "shell such as /bin/sh, or set `user` to one that has one",
        )
    detail = last_line(stderr) or last_line(stdout) or f"exit status {result.exit_status}"
    if not stderr.strip() and not stdout.strip():
        detail += " and nothing printed (is the login shell one that runs commands?)"
    raise target.error(
        ProvisioningProblem.REMOTE_COMMAND_FAILED, f"a gpuflow command failed on the host: {detail}"
    )
