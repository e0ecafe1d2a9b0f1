"""Bad input from the command line: one clear line, a non-zero exit, and nothing created."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpuflow.cli.main import app

runner = CliRunner()


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("GPUFLOW_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("GPUFLOW_TEMPORAL_ADDRESS", "127.0.0.1:1")  # nothing listens there
    monkeypatch.delenv("GPUFLOW_DATABASE_URL", raising=False)


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(text)
    return path


def _one_error_line(output: str) -> str:
    lines = [line for line in output.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), output
    assert "Traceback" not in output
    return lines[0]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("name: x\ncommands: [true\n", "malformed YAML at line"),
        ("name: x\ncommands: [echo]\nresourcez: {}\n", "resourcez: unknown field"),
        (
            "name: x\ncommands: [echo]\nresorces: {gpu: 1}\n",
            "resorces: unknown field; did you mean resources?",
        ),
        (
            "name: x\ncommands: [echo]\nretry: {limit: 3}\n",
            "retry.limit: unknown field (known here: on_events, duration, max_attempts) (got 3)",
        ),
        (
            "name: x\ncommands: [echo]\nresources: {gpu: 1, gpus: 2}\n",
            "resources.gpus: unknown field; did you mean gpu?",
        ),
        (
            "name: x\ncommands: [echo]\nresources: {gpu: 'A100:4..2'}\n",
            "range 4..2 is empty: the minimum is above the maximum",
        ),
        (
            "name: x\ncommands: [echo]\nresources: {gpu: 'A100:1.5'}\n",
            "must be a whole number, or a fraction below 1",
        ),
        ("name: Bad_Name\ncommands: [echo]\n", "job name 'Bad_Name' must start with a letter"),
        (
            "name: x\ncommands: [echo]\nutilization_policy: {min_gpu_utilization: 50, "
            "time_window: 8d}\nresources: {gpu: 1}\n",
            "time_window '8d' is outside 1m..7d",
        ),
        (
            "name: x\ncommands: [echo]\nutilization_policy: {min_gpu_utilization: 150, "
            "time_window: 10m}\nresources: {gpu: 1}\n",
            "min_gpu_utilization: must be at most 100 (got 150)",
        ),
        ("- just\n- a list\n", "expected a mapping of fields at the top, got a list of 2 items"),
        ("- one\n", "expected a mapping of fields at the top, got a list of 1 item"),
        (
            "name: x\ncommands: [echo]\nenv: {AUTH: 'Bearer ${{ secrets.tok }}'}\n",
            "env: the value of AUTH, 'Bearer ${{ secrets.tok }}', is not a secret reference; "
            "one is the whole",
        ),
        (
            "name: x\ncommands: [echo]\nenv: {TOK: '${{ secret.tok }}'}\n",
            "env: the value of TOK, '${{ secret.tok }}', is not a secret reference",
        ),
        (
            "name: x\ncommands: ['curl -H ${{ secrets.tok }} x']\n",
            "${{ ... }} is not replaced in commands; name the secret in env",
        ),
        ("name: x\npriority: 99999999999999999999999\n", "a number at line 2, column 11: "),
        (
            "name: x\ncommands: [true]\n",
            'commands.0: true was read by YAML as the boolean true; quote it: "true"',
        ),
        ("type: fleet\nname: x\nkind: sim\n", "is not a job; use `gpuflow fleet apply`"),
    ],
)
def test_apply_rejects_bad_job_files(tmp_path: Path, text: str, expected: str) -> None:
    result = runner.invoke(app, ["apply", "-y", "-f", str(_write(tmp_path, text))])
    assert result.exit_code == 1
    assert expected in _one_error_line(result.output)
    # Validation happens before any connection: nothing was created anywhere.
    assert not (tmp_path / "home").exists()


def test_missing_file(tmp_path: Path) -> None:
    result = runner.invoke(app, ["apply", "-y", "-f", str(tmp_path / "nope.yaml")])
    assert result.exit_code == 1
    assert "nope.yaml: no such file" in _one_error_line(result.output)


def test_flag_beats_job_file_and_is_validated(tmp_path: Path) -> None:
    path = _write(tmp_path, "name: x\ncommands: [echo]\nresources: {gpu: 1}\n")
    result = runner.invoke(
        app, ["apply", "-y", "-f", str(path), "--time-window", "2s", "--min-gpu-utilization", "20"]
    )
    assert result.exit_code == 1
    assert "time_window '2s' is outside 1m..7d" in _one_error_line(result.output)


def test_unreachable_temporal_is_one_line(tmp_path: Path) -> None:
    path = _write(tmp_path, "name: x\ncommands: [echo]\n")
    result = runner.invoke(app, ["apply", "-y", "-f", str(path)])
    assert result.exit_code == 1
    line = _one_error_line(result.output)
    assert "cannot reach Temporal at 127.0.0.1:1" in line
    assert "GPUFLOW_TEMPORAL_ADDRESS" in line


def test_the_cli_never_reads_the_database(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI needs only Temporal: an unreachable database is no concern of `ps`; the one
    thing it could not reach is Temporal."""
    monkeypatch.setenv("GPUFLOW_DATABASE_URL", "postgresql://gpuflow:s3cret@127.0.0.1:1/none")
    result = runner.invoke(app, ["ps"])
    assert result.exit_code == 1
    line = _one_error_line(result.output)
    assert "cannot reach Temporal at 127.0.0.1:1" in line
    assert "database" not in result.output
    assert "s3cret" not in result.output


def test_a_database_url_gpuflow_cannot_use_is_one_line() -> None:
    """An unparsable URL, or one of a database without a driver here: a 43-line traceback."""
    from gpuflow.errors import GpuflowError
    from gpuflow.store.db import Store

    for url, why in (("foo", "ArgumentError"), ("mysql://u:s3cret@127.0.0.1/db", "MySQLdb")):
        with pytest.raises(GpuflowError) as raised:
            Store(url)
        message = str(raised.value)
        assert message.startswith("GPUFLOW_DATABASE_URL ") and why in message
        assert "\n" not in message and "s3cret" not in message


def test_unreachable_database_is_one_line() -> None:
    """Where the database is read (the control worker), an unreachable one is one line with
    its password hidden."""
    from gpuflow.errors import GpuflowError
    from gpuflow.store.db import Store

    with pytest.raises(GpuflowError) as raised:
        Store("postgresql://gpuflow:s3cret@127.0.0.1:1/none").init()
    message = str(raised.value)
    assert "cannot reach the database postgresql+psycopg://gpuflow:***@127.0.0.1:1/none" in message
    assert "s3cret" not in message


def test_a_database_that_refuses_the_tables_is_one_line() -> None:
    """A PostgreSQL role without the right to create gpuflow's tables (or to add a column an
    older database lacks) gets one line that says what to change, not a traceback."""
    import psycopg

    from gpuflow.errors import GpuflowError
    from gpuflow.store.db import Store
    from tests.conftest import PG_ADMIN_URL, pg_database

    with pg_database("gpuflow_ro") as name:  # owned by the admin, not by the role below
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
            admin.execute(f'CREATE ROLE "{name}" LOGIN')
        scheme, rest = PG_ADMIN_URL.split("://", 1)
        server = rest.split("@", 1)[-1].rsplit("/", 1)[0]
        store = Store(f"{scheme}://{name}@{server}/{name}")
        try:
            with pytest.raises(GpuflowError) as raised:
                store.init()
        finally:
            store.dispose()
            with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
                admin.execute(f'DROP ROLE IF EXISTS "{name}"')
    message = str(raised.value)
    assert message.startswith(f"cannot set up gpuflow's tables in postgresql+psycopg://{name}@")
    assert "permission denied" in message and "may create and alter tables" in message


def test_bad_fleet_file(tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(
        "type: fleet\nname: f\nkind: sim\nhosts:\n  - name: a\n    blocks: 3\n"
        "    cpus: 8\n    gpus: [{name: A100, memory: 80GB, count: 4}]\n"
    )
    result = runner.invoke(app, ["fleet", "apply", "-f", str(path)])
    assert result.exit_code == 1
    assert "blocks=3 must divide its 4 GPUs and 8 CPUs evenly" in _one_error_line(result.output)


def test_sigterm_ends_a_command_as_ctrl_c_does_with_its_cleanup_run() -> None:
    """`timeout 3 gpuflow logs -f JOB` left its reader workflow in Temporal: SIGTERM killed the
    process before the reader's deletion ran."""
    import asyncio
    import os
    import signal

    import typer

    from gpuflow.cli import common

    cleaned: list[str] = []
    unhandled: list[int] = []
    before = signal.signal(signal.SIGTERM, lambda signum, frame: unhandled.append(signum))

    @common.run
    async def command() -> None:
        try:
            asyncio.get_running_loop().call_later(0.05, os.kill, os.getpid(), signal.SIGTERM)
            await asyncio.sleep(1)
        finally:
            await asyncio.sleep(0)  # a cleanup that awaits, as a reader's deletion does
            cleaned.append("reader deleted")

    try:
        with pytest.raises(typer.Exit) as ended:
            command()
    finally:
        signal.signal(signal.SIGTERM, before)
    assert unhandled == []
    assert ended.value.exit_code == 143
    assert cleaned == ["reader deleted"]


def test_the_refusal_the_readme_shows_is_the_one_printed(tmp_path: Path) -> None:
    """The README's example refusal had drifted from what gpuflow says."""
    readme = (Path(__file__).parents[3] / "README.md").read_text()
    shown = readme.split("with the file, field, value and what is allowed:\n\n```\n")[1]
    shown = shown.split("\n```")[0]
    job = _write(tmp_path, 'name: x\ncommands: [x]\nresources: {gpu: "4..2"}\n')
    result = CliRunner().invoke(app, ["offers", "-f", str(job)])
    assert result.exit_code == 1
    assert " ".join(result.output.split()) == shown.replace("job.yaml", str(job))
