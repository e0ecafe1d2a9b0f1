"""Errors a user can cause that ended in a traceback: a cron that is not text (the Python
client), and an orphaned dev server of another user's that `gpuflow down` cannot stop."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuflow.client.cron import check_cron
from gpuflow.control import embedded
from gpuflow.errors import GpuflowError, SpecError


def test_a_cron_that_is_not_text_is_refused_in_words() -> None:
    with pytest.raises(SpecError, match=r"^cron is text, e.g. '0 3 \* \* \*', not int$"):
        check_cron(123)  # type: ignore[arg-type]
    with pytest.raises(SpecError, match=r"^cron is empty"):
        check_cron("  ")


def test_an_orphan_of_another_users_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refused(pid: int, sig: int) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "kill", refused)
    embedded.server_pid_file(tmp_path).write_text("4242")
    with pytest.raises(GpuflowError, match=r"\(pid 4242\) .* is another user's"):
        embedded.stop_orphaned_server(tmp_path, 4242)
    assert embedded.server_pid_file(tmp_path).exists()  # not forgotten: it still runs
