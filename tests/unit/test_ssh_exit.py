"""A gpuflow command's exit status on an ssh host, turned into what the user can fix."""

from __future__ import annotations

import os
import shutil
import subprocess
from types import SimpleNamespace

import pytest

from gpuflow.ssh.commands import check_exit
from gpuflow.ssh.session import ProvisioningError, ProvisioningProblem, SshTarget

TARGET = SshTarget(host_id="gpu-1", hostname="127.0.0.1", user="svc")


def _failed(exit_status: int, stdout: str = "", stderr: str = "") -> ProvisioningError:
    result = SimpleNamespace(exit_status=exit_status, stdout=stdout, stderr=stderr)
    with pytest.raises(ProvisioningError) as caught:
        check_exit(TARGET, result)  # type: ignore[arg-type]
    return caught.value


NOLOGIN = shutil.which("nologin") or next(
    (path for path in ("/usr/sbin/nologin", "/sbin/nologin") if os.path.exists(path)), None
)


@pytest.mark.skipif(NOLOGIN is None, reason="no nologin(8) on this machine")
def test_a_login_user_whose_shell_is_nologin_is_named() -> None:
    """sshd runs every command through the user's login shell; nologin(8) prints its line on
    stdout and exits 1, which read "a gpuflow command failed on the host: exit status 1"."""
    assert NOLOGIN is not None
    ran = subprocess.run([NOLOGIN, "-c", "python3 -m gpuflow.agent.main"], capture_output=True)
    error = _failed(ran.returncode, ran.stdout.decode(), ran.stderr.decode())
    assert error.problem is ProvisioningProblem.LOGIN_SHELL
    assert not error.problem.retryable
    assert str(error) == (
        "host gpu-1 (svc@127.0.0.1:22): user svc may log in but runs no commands (its login shell "
        "is nologin); give it a shell such as /bin/sh, or set `user` to one that has one"
    )


def test_a_failure_says_what_the_command_printed_or_that_it_printed_nothing() -> None:
    on_stdout = _failed(2, stdout="disk full\n")
    assert on_stdout.problem is ProvisioningProblem.REMOTE_COMMAND_FAILED
    assert str(on_stdout).endswith("a gpuflow command failed on the host: disk full")
    both = _failed(1, stdout="ignored\n", stderr="Traceback...\nOSError: no space\n")
    assert str(both).endswith("failed on the host: OSError: no space")
    silent = _failed(1)  # a login shell of /bin/false
    assert str(silent).endswith(
        "failed on the host: exit status 1 and nothing printed (is the login shell one that "
        "runs commands?)"
    )
