"""`gpuflow apply` in a script (`gpuflow apply -y -f job.yaml && next-step`): its exit status
says how the jobs it followed ended, and `--json` prints one JSON document on stdout."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from typer.testing import Result

from gpuflow.cli import follow, main
from gpuflow.client import Client, Progress
from gpuflow.errors import GpuflowError
from gpuflow.status import JobStatus
from gpuflow.store.tables import JobRow
from tests.unit.cli.conftest import WIDTH, Cli
from tests.unit.cli.test_commands import A100_BOX

ENDINGS = {
    "ok": (JobStatus.DONE, "done"),
    "crash": (JobStatus.FAILED, "process_failed"),
    "idle": (JobStatus.TERMINATED, "gpu_underutilized"),
    "big": (JobStatus.FAILED, "no_capacity"),
}
"""How each job (by name) ends as soon as it is submitted."""


@pytest.fixture
def ending(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> Cli:
    """Each job submitted ends at once as ENDINGS says, its workflow closed: the follow sees
    its ending at its first look. (The fake Temporal answers no progress query.)"""
    submit = Client.submit

    async def submitted(self: Client, spec: object) -> object:
        job = await submit(self, spec)  # type: ignore[arg-type]
        status, reason = ENDINGS[job.name]
        with cli.store.session() as session:
            row = session.get(JobRow, job.id)
            assert row is not None
            row.status, row.termination_reason = status, reason
            row.finished_at = datetime.now(UTC)
            session.add(row)
            session.commit()
        return job

    async def no_progress(self: Client, job: str) -> Progress:
        raise GpuflowError(f"job {job}: cannot read its progress")

    monkeypatch.setattr(Client, "submit", submitted)
    monkeypatch.setattr(Client, "progress", no_progress)
    cli.fleet(A100_BOX)
    return cli


def _apply(cli: Cli, names: list[str], *flags: str) -> Result:
    """`gpuflow apply FLAGS -f NAME.yaml...`, each job asking for one A100 (`big`: four)."""
    files = []
    for name in names:
        gpu = "A100:4" if name == "big" else "A100:1"
        text = f"name: {name}\ncommands: [x]\nresources: {{gpu: {gpu}}}\n"
        files += ["-f", cli.write(f"{name}.yaml", text)]
    result = cli.runner.invoke(main.app, ["apply", *flags, *files], env={"COLUMNS": str(WIDTH)})
    assert "Traceback" not in result.output, result.output
    return result


def test_apply_exits_0_when_every_job_ended_done(ending: Cli) -> None:
    result = _apply(ending, ["ok"], "-y")
    assert result.exit_code == 0, result.output
    assert "ok: done" in result.stdout


@pytest.mark.parametrize("name", ["crash", "idle"])
def test_apply_exits_1_when_a_job_did_not_end_done(ending: Cli, name: str) -> None:
    """After printing every job's ending: the one that ended done too."""
    result = _apply(ending, ["ok", name], "-y")
    assert result.exit_code == 1, result.output
    status, reason = ENDINGS[name]
    said = " ".join(result.stdout.split())
    assert f"{name}: {status.value} ({reason})" in said and "ok: done" in said


def test_apply_detached_exits_0_however_the_jobs_end(ending: Cli) -> None:
    assert _apply(ending, ["crash"], "-y", "-d").exit_code == 0


def test_apply_json_prints_the_final_records_as_ps_json_does(ending: Cli) -> None:
    """Only the JSON on stdout; the plan, the submit and the follow on stderr."""
    result = _apply(ending, ["ok", "crash"], "-y", "--json")
    assert result.exit_code == 1, result.output
    records = json.loads(result.stdout)
    assert [(r["name"], r["status"], r["reason"]) for r in records] == [
        ("ok", "done", "done"),
        ("crash", "failed", "process_failed"),
    ]
    listed = {job["id"]: job for job in json.loads(ending("ps", "-a", "--json"))}
    assert records == [listed[record["id"]] for record in records]
    said = " ".join(result.stderr.split())
    assert "ok: 1 node(s), GPU A100:1" in said and "submitted crash as job-crash-" in said
    assert "crash: failed (process_failed)" in said


def test_apply_json_detached_prints_the_submitted_jobs_with_their_plans(ending: Cli) -> None:
    """`big` asks for more GPUs than the box has: its plan places it nowhere."""
    result = _apply(ending, ["ok", "big"], "-y", "-d", "--json")
    assert result.exit_code == 0, result.output
    ok, big = json.loads(result.stdout)
    assert (ok["name"], ok["queue"], ok["id"]) == ("ok", "default", ok["id"])
    assert ok["id"].startswith("job-ok-") and ok["status"] == "pending"
    assert ok["plan"]["admitted"]["nodes"][0]["host_name"] == "box"
    assert ok["plan"]["option"] == 1 and ok["plan"]["preempts"] == []
    assert big["plan"]["admitted"] is None and big["plan"]["placement"] is None
    assert big["plan"]["fits_idle"] is False and big["plan"]["option"] is None
    assert set(ok) - {"plan"} == set(json.loads(ending("ps", "-a", "--json"))[0])
    assert "submitted ok as " in result.stderr


def test_apply_json_without_yes_is_refused_before_anything_is_submitted(ending: Cli) -> None:
    result = _apply(ending, ["ok"], "--json")
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr.strip() == "error: --json asks nothing: pass -y with it"
    assert ending.temporal.started == []


def test_ctrl_c_while_apply_json_follows_exits_130_with_nothing_on_stdout(
    ending: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def interrupted(*args: object, **kwargs: object) -> bool:
        raise KeyboardInterrupt

    monkeypatch.setattr(follow, "follow_jobs", interrupted)
    result = _apply(ending, ["ok"], "-y", "--json")
    assert result.exit_code == 130
    assert result.stdout == ""
    said = " ".join(result.stderr.split())
    assert "the job(s) go on" in said and said.endswith("interrupted")
