"""`gpuflow schedule create`: a bad --cron, --every or --id is refused in one line that names
the flag (not the job file, which is fine), in gpuflow's words, not Temporal's; the client's
`schedule` names its argument the same way. Cron times are UTC, and the command says what its
runs are named."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuflow.client.schedules import run_id_prefix
from gpuflow.errors import SpecError
from tests.unit.cli.conftest import Cli

HELLO = str(Path(__file__).parents[3] / "examples" / "hello.yaml")
FIELDS = "(5 fields: minute hour day-of-month month day-of-week)"


def _error(output: str) -> str:
    lines = [line for line in output.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), output
    return lines[0].removeprefix("error: ")


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--cron", "61 3 * * *"], "--cron '61 3 * * *': the minute must be 0-59"),
        (["--cron", "bogus"], f"--cron: 'bogus' is not a cron expression {FIELDS}"),
        (["--cron", "0 3 * * * *"], f"--cron: '0 3 * * * *' is not a cron expression {FIELDS}"),
        (["--cron", "0 24 * * *"], "--cron '0 24 * * *': the hour must be 0-23"),
        (["--cron", "0 3 0 * *"], "--cron '0 3 0 * *': the day of month must be 1-31"),
        (["--cron", "0 3 * 13 *"], "--cron '0 3 * 13 *': the month must be 1-12 or jan..dec"),
        (
            ["--cron", "0 3 * * 8"],
            "--cron '0 3 * * 8': the day of week must be 0-7 (0 and 7: Sunday) or sun..sat",
        ),
        (
            ["--cron", "0 5-3 * * *"],
            "--cron '0 5-3 * * *': the hour range '5-3' goes down; write it low-high",
        ),
        (
            ["--cron", "*/0 * * * *"],
            "--cron '*/0 * * * *': the minute step in '*/0' must be 1 or more",
        ),
        (
            ["--cron", "0 3 ? * *"],
            "--cron '0 3 ? * *': the day of month '?' is not *, a value, a range (1-5) or a step "
            "(*/15), or a list",
        ),
        (
            ["--cron", "@every 5s"],
            "--cron '@every 5s': an interval is given with --every, not in --cron",
        ),
        (["--cron", " "], f"--cron is empty: give {FIELDS[1:-1]}, e.g. '0 3 * * *'"),
        (
            ["--cron", "CRON_TZ=Nowhere/Land 0 3 * * *"],
            "--cron 'CRON_TZ=Nowhere/Land 0 3 * * *': unknown time zone 'Nowhere/Land', e.g. "
            "Europe/Berlin",
        ),
        (["--every", "1s"], "--every 1s: a schedule runs at most once a minute; give 1m or more"),
        (["--every", "59s"], "--every 59s: a schedule runs at most once a minute; give 1m or more"),
        (["--cron", "0 3 * * *", "--every", "1h"], "give exactly one of --cron or --every"),
        ([], "give exactly one of --cron or --every"),
        (
            ["--every", "1h", "--id", "Bad Id!"],
            "--id 'Bad Id!' must start with a letter and hold only lowercase letters, digits "
            "and '-' (at most 63 characters)",
        ),
    ],
)
def test_a_bad_flag_is_refused_naming_the_flag(cli: Cli, flags: list[str], said: str) -> None:
    assert _error(cli("schedule", "create", "-f", HELLO, *flags, code=1)) == said
    assert cli.temporal.schedules == {}


@pytest.mark.parametrize(
    "cron",
    [
        "0 3 * * *",
        "*/15 * * * *",
        "0 9-17/2 * * mon-fri",
        "30 4 1,15 jan,jul sun",
        "0 0 * * 7",
        "0 3 * * tu",
        "5/10 * * * *",
        "@daily",
        "@hourly",
        "CRON_TZ=Europe/Berlin 0 3 * * *",
    ],
)
def test_what_temporal_takes_is_taken(cli: Cli, cron: str) -> None:
    out = cli("schedule", "create", "-f", HELLO, "--cron", cron)
    assert "schedule schedule-hello created" in out
    assert cli.temporal.schedules["schedule-hello"].spec.cron_expressions == [cron]


def test_the_run_ids_are_said(cli: Cli) -> None:
    """A schedule other than the job's own names its runs with a tag: a hash of its id."""
    out = " ".join(
        cli("schedule", "create", "-f", HELLO, "--every", "1h", "--id", "qa-min").split()
    )
    prefix = run_id_prefix("hello", "qa-min")
    assert prefix.startswith("job-hello-") and len(prefix) == len("job-hello-") + 6
    assert f"its runs show up in `gpuflow ps` as {prefix}-<time>" in out
    assert cli.temporal.schedules["qa-min"].action.id == prefix
    out = " ".join(cli("schedule", "create", "-f", HELLO, "--cron", "0 3 * * *").split())
    assert "as job-hello-<time>" in out


def test_the_help_says_cron_times_are_utc(cli: Cli) -> None:
    text = " ".join(cli("schedule", "create", "--help").split())
    assert "Cron times are UTC" in text
    assert "'0 3 * * *' (03:00 UTC)" in text


def test_the_clients_checks_name_its_arguments() -> None:
    from gpuflow.client.cron import check_cron
    from gpuflow.client.schedules import check_every

    with pytest.raises(SpecError, match=r"^cron '61 3 \* \* \*': the minute must be 0-59$"):
        check_cron("61 3 * * *")
    with pytest.raises(SpecError, match=r"^cron: 'bogus' is not a cron expression \(5 fields"):
        check_cron("bogus")
    with pytest.raises(SpecError, match=r"^every 1s: a schedule runs at most once a minute"):
        check_every(1)
    assert check_cron("  0 3 * * *  ") == "0 3 * * *"  # what Temporal is given


async def test_client_schedule_refuses_a_bad_cron_before_asking_anything(cli: Cli) -> None:
    from gpuflow.client import Client
    from tests.local_api import LocalApi

    class NoApi(LocalApi):
        async def call(self, *_: object, **__: object) -> object:
            raise AssertionError("asked the control plane")

    client = Client(temporal=cli.temporal, api=NoApi(None))  # type: ignore[arg-type]
    job = {"name": "hello", "commands": ["true"]}
    with pytest.raises(SpecError, match=r"^cron '61 3 \* \* \*': the minute must be 0-59$"):
        await client.schedule(job, cron="61 3 * * *")
    with pytest.raises(SpecError, match=r"^every 30s: a schedule runs at most once a minute"):
        await client.schedule(job, every_s=30)
