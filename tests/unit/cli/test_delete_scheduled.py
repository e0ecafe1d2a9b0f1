"""`gpuflow queue delete` and `gpuflow secret delete` of what a schedule's job still names: one
line naming the schedules, and `--force` deletes it anyway, warning of them on stderr (each of
their later runs fails)."""

from __future__ import annotations

import json

import pytest
from temporalio.service import RPCError, RPCStatusCode

from gpuflow import secrets
from gpuflow.client.schedules import needed_by
from tests.unit.cli.conftest import Cli

RESEARCH = "type: queue\nname: research\ngpus: 4\n"
NIGHTLY = """
name: nightly
commands: [python train.py]
queue: research
env: {HF_TOKEN: "${{ secrets.hf_token }}"}
"""


def _scheduled(cli: Cli) -> None:
    """The queue `research` and the secret `hf_token`, both named by schedules `eval` and
    `schedule-nightly`; the queue `spare` and the secret `other`, by none."""
    cli("queue", "apply", "-f", cli.write("research.yaml", RESEARCH))
    cli("queue", "apply", "-f", cli.write("spare.yaml", "type: queue\nname: spare\ngpus: 1\n"))
    cli("secret", "set", "hf_token", stdin="s3cret-value\n")
    cli("secret", "set", "other", stdin="other-value\n")
    job = cli.write("nightly.yaml", NIGHTLY)
    cli("schedule", "create", "-f", job, "--cron", "0 3 * * *")
    cli("schedule", "create", "-f", job, "--every", "6h", "--id", "eval")
    plain = cli.write("plain.yaml", "name: plain\ncommands: [x]\n")
    cli("schedule", "create", "-f", plain, "--every", "1h")  # the default queue, no secret


def _error(output: str) -> str:
    lines = [line for line in output.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), output
    return lines[0].removeprefix("error: ")


def test_a_queue_that_schedules_name_is_deleted_only_with_force(cli: Cli) -> None:
    _scheduled(cli)
    assert _error(cli("queue", "delete", "research", code=1)) == (
        "queue research is used by schedule(s) eval, schedule-nightly; delete them first, "
        "or pass --force"
    )
    assert cli("queue", "delete", "spare").strip() == "queue spare deleted"
    out, err = cli.streams("queue", "delete", "research", "--force")
    assert out.strip() == "queue research deleted"
    assert " ".join(err.split()) == (
        "warning: queue research is used by schedule(s) eval, schedule-nightly; their runs "
        "fail until it is applied again"
    )
    assert [q["name"] for q in json.loads(cli("queue", "list", "--json"))] == ["default"]


def test_a_secret_that_schedules_jobs_use_is_deleted_only_with_force(cli: Cli) -> None:
    _scheduled(cli)
    assert _error(cli("secret", "delete", "hf_token", code=1)) == (
        "secret hf_token is used by schedule(s) eval, schedule-nightly; delete them first, "
        "or pass --force"
    )
    assert cli("secret", "delete", "other").strip() == "secret other deleted"
    path = cli.tmp_path / "control" / "secrets.json"
    assert secrets.load(path) == {"hf_token": "s3cret-value"}  # the refusal kept it
    out, err = cli.streams("secret", "delete", "hf_token", "--force")
    assert out.strip() == "secret hf_token deleted"
    assert " ".join(err.split()) == (
        "warning: secret hf_token is used by schedule(s) eval, schedule-nightly; their runs "
        "fail until it is set again"
    )
    assert secrets.load(path) == {}


def test_once_its_schedules_are_deleted_a_queue_or_secret_is_deleted_as_before(cli: Cli) -> None:
    _scheduled(cli)
    cli("schedule", "delete", "eval")
    assert "schedule-nightly;" in _error(cli("queue", "delete", "research", code=1))
    cli("schedule", "delete", "schedule-nightly")
    out, err = cli.streams("queue", "delete", "research")
    assert (out.strip(), err) == ("queue research deleted", "")
    assert cli("secret", "delete", "hf_token").strip() == "secret hf_token deleted"


def test_schedules_that_cannot_be_read_refuse_the_delete_unless_forced(
    cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An API key that may not list schedules, say: the delete cannot know, so it asks for
    --force, which deletes it saying what it could not look at."""

    async def list_schedules(*_: object, **__: object) -> None:
        raise RPCError("not allowed", RPCStatusCode.PERMISSION_DENIED, b"")

    cli("queue", "apply", "-f", cli.write("research.yaml", RESEARCH))
    monkeypatch.setattr(cli.temporal, "list_schedules", list_schedules)
    assert _error(cli("queue", "delete", "research", code=1)) == (
        "could not read the schedules: not allowed; pass --force to delete it without looking"
    )
    out, err = cli.streams("queue", "delete", "research", "--force")
    assert out.strip() == "queue research deleted"
    assert err.strip() == "warning: could not read the schedules: not allowed"


def test_many_schedules_are_counted_past_the_first_ten() -> None:
    names = [f"s{k:02}" for k in range(12)]
    assert needed_by("queue q", names) == (
        "queue q is used by schedule(s) " + ", ".join(names[:10]) + " and 2 more"
    )
