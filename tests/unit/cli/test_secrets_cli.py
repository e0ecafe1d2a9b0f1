"""`gpuflow secret set/list/delete` through the control plane's API (served in-process by its
activities): values are sealed on the way, a broken secrets file on the control plane is one
line naming the file, never a traceback, and nothing is overwritten."""

from __future__ import annotations

import json

import pytest

from gpuflow import secrets
from tests.unit.cli.conftest import Cli


def test_set_list_delete(cli: Cli) -> None:
    assert "stored by the control plane" in cli("secret", "set", "token", stdin="s3cret-value\n")
    assert json.loads(cli("secret", "list", "--json")) == ["token"]
    path = cli.tmp_path / "control" / "secrets.json"
    assert secrets.load(path) == {"token": "s3cret-value"}
    assert "secret token deleted" in cli("secret", "delete", "token")
    assert "no secret named 'token'" in cli("secret", "delete", "token", code=1)
    assert cli("secret", "list").strip() == "no secrets"


@pytest.mark.parametrize(
    ("content", "reason"),
    [("{not json", "Expecting property name"), ('["a"]', "expected an object")],
)
@pytest.mark.parametrize(
    "command",
    [["secret", "list"], ["secret", "delete", "x"], ["secret", "set", "x"]],
)
def test_a_broken_secrets_file_is_one_line(
    cli: Cli, content: str, reason: str, command: list[str]
) -> None:
    home = cli.tmp_path / "control"
    home.mkdir(mode=0o700)
    path = home / "secrets.json"
    path.write_text(content)
    lines = cli(*command, code=1, stdin="value\n").strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"error: secrets file {path} is not valid JSON: ")
    assert reason in lines[0] and lines[0].endswith("; fix or remove it")
    assert path.read_text() == content  # nothing overwritten


def test_a_short_value_is_stored_with_a_warning_that_logs_will_show_it(cli: Cli) -> None:
    assert "not masked in job logs" in cli("secret", "set", "pin", stdin="42\n")
    assert secrets.load(cli.tmp_path / "control" / "secrets.json") == {"pin": "42"}


def test_an_empty_value_is_refused(cli: Cli) -> None:
    assert "empty value; nothing stored" in cli("secret", "set", "x", stdin="\n", code=1)
