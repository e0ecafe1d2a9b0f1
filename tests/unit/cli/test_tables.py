"""Tables at 80 columns: every line fits, no id or name is cut, and a waiting job says why."""

from __future__ import annotations

import functools
import io
import json
import re
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

from gpuflow.cli import common
from gpuflow.cli.render import metrics_table, schedules_table, short_duration
from gpuflow.status import JobStatus
from gpuflow.utilization import UtilizationState
from tests.unit.cli.conftest import WIDTH, Cli, column_rows, lines_fit

FLEET = """
type: fleet
name: sim
kind: sim
hosts:
  - name: sim-a100-with-a-long-name
    cpus: 32
    memory: 256GB
    blocks: 2
    gpus: [{name: A100, memory: 80GB, count: 4}]
  - name: sim-l4
    gpus: [{name: L4, memory: 24GB, count: 2}]
  - name: sim-down
    state: not_ready
    gpus: [{name: L4, memory: 24GB, count: 1}]
"""


def _rendered(renderable: object, *, width: int = WIDTH) -> str:
    out = io.StringIO()
    common.new_console(width=width, file=out).print(renderable)
    return out.getvalue()


def test_ps_fits_80_columns_and_says_why_jobs_wait(cli: Cli) -> None:
    running = cli.job(
        "manual-select-training-run",
        JobStatus.RUNNING,
        minutes_ago=30,
        hosts=["sim-a100"],
    )
    low = cli.job(
        "big-sweep-low-priority",
        JobStatus.PENDING,
        minutes_ago=20,
        message="waiting for capacity: sim-l4: has 2 GPUs, needs 4; sim-down: not ready (declared)",
    )
    high = cli.job("urgent-eval", JobStatus.PENDING, minutes_ago=5, priority=50, message="")
    agent = cli.job(
        "needs-agent",
        JobStatus.PROVISIONING,
        minutes_ago=2,
        hosts=["sim-l4"],
        message="placed on sim-l4 (fleet sim)",
    )
    out = cli("ps")
    lines = lines_fit(out)
    names = {
        job_id: job_id.removeprefix("job-").removesuffix("-a1b2c3")
        for job_id in (running, low, high, agent)
    }
    for name in names.values():
        assert name in out  # whole, on one line
    ids = [
        next(i for i, name in names.items() if line.startswith(name + " "))
        for line in lines[1:]
        if any(line.startswith(name + " ") for name in names.values())
    ]
    why = dict(zip(ids, column_rows(out, "WHERE / WHY"), strict=True))
    # The higher priority job is first in line although it came later.
    assert why[high] == "#1 of 2 waiting; waiting to be placed"
    assert why[low] == "#2 of 2 waiting; no capacity: sim-l4: has 2 GPUs, needs 4 (+1 more)"
    assert why[agent] == "waiting for the host agent on sim-l4"
    assert why[running] == "sim-a100 (A100:1)"
    assert "30m" in out  # ages, not timestamps

    data = {j["id"]: j for j in json.loads(cli("ps", "--json"))}
    assert data[high]["waiting"] == {"reason": "waiting to be placed", "position": 1, "waiting": 2}
    assert data[low]["waiting"]["position"] == 2
    assert data[low]["message"].startswith("waiting for capacity: ")  # the full reasons
    assert data[running]["waiting"] is None


def test_fleet_list_fits_and_shows_declared_state_without_heartbeat(cli: Cli) -> None:
    cli.fleet(FLEET)
    out = cli("fleet", "list")
    lines_fit(out)
    assert "sim-a100-with-a-long-name" in out
    down = out[out.index("sim-down") :].split()
    assert down[:2] == ["sim-down", "not_ready"] and "(declared)" in down  # wrapped, maybe
    assert "heartbeat" not in out
    assert "(simulated)" in out
    hosts = {h["name"]: h for h in json.loads(cli("fleet", "list", "--json"))[0]["hosts"]}
    assert hosts["sim-down"]["state_detail"] == "declared"


def test_offers_fit_80_columns(cli: Cli) -> None:
    cli.fleet(FLEET)
    job = cli.write("job.yaml", "name: x\ncommands: [echo]\nresources: {gpu: 'A100:1'}\n")
    out = cli("offers", "-f", job)
    lines_fit(out)
    assert "goes to sim-a100-with-a-long-name (fleet sim" in out


def test_metrics_and_schedules_fit_80_columns() -> None:
    now = datetime.now(UTC)
    state = UtilizationState.model_validate(
        {
            "gpus": {
                f"0:{g}": {
                    "node": 0,
                    "gpu": g,
                    "utilization": 55.0,
                    "memory_used_mib": 40000,
                    "memory_total_mib": 81920,
                    "simulated": True,
                    "recent": [[now.timestamp() - i, 50.0 + i, 40000] for i in range(40)],
                }
                for g in range(2)
            }
        }
    )
    placement = SimpleNamespace(nodes=[SimpleNamespace(rank=0, host_name="sim-a100-long-host")])
    out = _rendered(metrics_table(state, placement, width=WIDTH))
    lines_fit(out)
    assert "sim-a100-long-host" in out and "simulated" in out

    schedule = {
        "id": "schedule-nightly",
        "job": "nightly",
        "when": "cron 0 3 * * *",
        "next": [(now + timedelta(hours=h, seconds=30)).isoformat() for h in (3, 27)],
        "recent": ["job-nightly-2026-11-22T03:00:00Z", "job-nightly-2026-11-23T03:00:00Z"],
    }
    out = _rendered(schedules_table([schedule], width=WIDTH, now=now))
    lines_fit(out)
    header, first, second = out.splitlines()[:3]
    assert header.split()[:4] == ["SCHEDULE", "JOB", "WHEN", "NEXT"]
    assert first.split()[:4] == ["schedule-nightly", "nightly", "cron", "0"]  # what, when
    assert "in 3h" in first and "in 1d" in second  # the next runs, one a line
    assert "job-nightly-2026-11-22T03:00:00Z" in out and "job-nightly-2026-11-23T03:00:00Z" in out
    # Ids too long to leave room for the next runs: those go, the ids stay whole.
    long = {**schedule, "id": "schedule-nightly-training-run"}
    long["recent"] = ["job-nightly-training-run-2026-11-23T03:00:00Z"]
    out = _rendered(schedules_table([long], width=WIDTH, now=now))
    lines_fit(out)
    assert "schedule-nightly-training-run" in out
    assert "job-nightly-training-run-2026-11-23T03:00:00Z" in out
    assert "in 3h" not in out
    assert "nightly  cron" not in out  # nor the job and when: the ids stay whole


def test_short_duration_is_one_unit() -> None:
    assert [short_duration(s) for s in (0, 45, 180, 7300, 90000)] == ["0s", "45s", "3m", "2h", "1d"]


def test_secret_list_fits_and_never_shows_values(cli: Cli) -> None:
    for name in ("HF_TOKEN", "WANDB_API_KEY", "A_RATHER_LONG_SECRET_NAME_FOR_THE_REGISTRY"):
        cli("secret", "set", name, stdin="value-of-" + name)
    out = cli("secret", "list")
    assert lines_fit(out) == sorted(
        ["HF_TOKEN", "WANDB_API_KEY", "A_RATHER_LONG_SECRET_NAME_FOR_THE_REGISTRY"]
    )
    assert "value-of" not in out and "value-of" not in cli("secret", "list", "--json")


def test_brackets_a_user_wrote_print_as_text_never_as_markup(cli: Cli) -> None:
    """Names, GPU models, reasons and messages are data: `[/]` in one is printed as written
    (Rich read it as markup and raised MarkupError: a traceback in `fleet list`, `offers`,
    `apply` and `ps`)."""
    cli.fleet(
        "type: fleet\nname: odd\nkind: sim\nhosts:\n"
        "  - name: h1\n    gpus: [{name: 'A[/]', memory: 80GB, count: 1}]\n"
    )
    assert "A[/]" in cli("fleet", "list")
    job = cli.write("odd.yaml", "name: odd\ncommands: [echo]\nresources: {gpu: 'A[/]:1'}\n")
    out = cli("offers", "-f", job)
    assert "goes to h1 (fleet odd" in out
    other = cli.write("other.yaml", "name: other\ncommands: [echo]\nresources: {gpu: 'B:1'}\n")
    assert "h1: has A[/] GPUs, job needs B" in cli("offers", "-f", other)
    assert "GPU A[/]:1" in cli("apply", "-f", job, stdin="n\n", code=1)
    cli.job("odd", JobStatus.FAILED, message="exit [/] code 1", ended_minutes_ago=1)
    assert "exit [/] code 1" in " ".join(cli("ps", "-a").split())


def test_help_reads_a_wrapped_docstring_as_one_paragraph(cli: Cli) -> None:
    """A command's docstring is wrapped at 100 columns in the source; help rewraps it to the
    terminal instead of keeping the source's line breaks mid-sentence."""
    out = cli("--help")
    lines_fit(out, help_text=True)
    assert any("are stopped first (asked, or -y)" in line for line in out.splitlines())
    assert any("job processes on this host" in line for line in out.splitlines())


def test_ps_puts_a_job_waiting_to_retry_in_no_line(cli: Cli) -> None:
    """Between attempts (job.py's retry wait) a job is in no queue: no `#k of n waiting`."""
    flaky = cli.job(
        "flaky", JobStatus.PENDING, message="attempt 3: retrying after process_failed in 20 s"
    )
    fresh = cli.job("fresh", JobStatus.PENDING, suffix="b2c3d4", message="")
    data = {j["id"]: j["waiting"] for j in json.loads(cli("ps", "--json"))}
    assert data[flaky] == {
        "reason": "attempt 3: retrying after process_failed in 20 s",
        "position": None,
        "waiting": None,
    }
    assert data[fresh] == {"reason": "waiting to be placed", "position": 1, "waiting": 1}


def test_a_wrapped_column_keeps_its_longest_word_whole_when_the_table_fits() -> None:
    """Rich narrowed STATUS below `(max_duration_exceeded)` and put its `)` on a line of its
    own, though the table fits 80 columns with the word whole."""
    from gpuflow.cli.render import Column, fitted_table

    columns = [
        Column("STATUS", wrap=True),
        Column("AGE", justify="right"),
        Column("ID"),
        Column("ATTEMPT", justify="right"),
        Column("WHERE / WHY", wrap=True, readable=20),
    ]
    why = "ran longer than max_duration 20s and then some more words here to wrap around"
    row = ["terminated (max_duration_exceeded)", "27s", "job-maxdur-cbe35e", "1", why]
    text = _rendered(fitted_table(columns, [row], width=WIDTH))
    lines = text.splitlines()
    assert all(len(line) <= WIDTH for line in lines)
    assert "(max_duration_exceeded)" in text
    assert " ".join(" ".join(lines).split()).count("max_duration") == 2  # no word cut


def test_ps_loses_no_character_of_why_a_job_waits_at_80_columns() -> None:
    """Rich, left to share out the width, made WHERE / WHY narrower than the width the cells
    were wrapped at and cropped each line: `h1: 0 of 4 GPUs free, job needs 2` read `h1: 0 of
    GPUs free, job nee 2`. Every word of every cell is still there, whole and in order."""
    from gpuflow import JobInfo
    from gpuflow.cli.render import jobs_table

    now = datetime.now(UTC)
    why = (
        "no capacity: queue qb's quota is used too (A100:4 of A100:4); h1: 0 of 4 GPUs free, "
        "job needs 2; h2: 0 of 4 GPUs free, job needs 2; vm: has no GPUs, job needs 2 GPUs"
    )

    def job(name: str, status: JobStatus, **fields: object) -> JobInfo:
        at = now - timedelta(seconds=6)
        return JobInfo(  # type: ignore[arg-type]
            id=f"job-{name}-bde3b7", name=name, status=status, priority=0, submitted_at=at, **fields
        )

    jobs = [
        job("qb3", JobStatus.FAILED, reason="no_capacity", message=why),
        job("pa4", JobStatus.RUNNING, hosts=["h2"], gpus="2xA100", fleet="simq", attempt=2),
        job("done1", JobStatus.DONE, message="all processes exited with code 0"),
    ]
    lines = _rendered(jobs_table(jobs, width=WIDTH, now=now)).splitlines()
    assert all(len(line) <= WIDTH for line in lines)
    where = lines[0].index("WHERE / WHY")
    column = " ".join(line[where:].strip() for line in lines[1:] if line[where:].strip())
    assert column.startswith(why + " h2 (2xA100) all processes exited with code 0")


def _info(name: str, status: JobStatus, *, minutes: float, now: datetime, **fields: object) -> Any:
    from gpuflow import JobInfo

    at = now - timedelta(minutes=minutes)
    return JobInfo(  # type: ignore[arg-type]
        id=f"job-{name}-9f8e7d", name=name, status=status, priority=0, submitted_at=at, **fields
    )


def test_ps_always_shows_the_name_at_80_columns() -> None:
    """`ps -a` at 80 columns dropped NAME first (the id holds the name): a user read ids.
    The name stays, whole, on its row's first line; the id and the less read columns go."""
    from gpuflow.cli.render import jobs_table

    now = datetime.now(UTC)
    job = functools.partial(_info, now=now)
    nodes = ["gpu-node-01", "gpu-node-02", "gpu-node-03", "gpu-node-04"]
    jobs = [
        job(
            "llama-70b-finetune-lora-run",
            JobStatus.RUNNING,
            minutes=300,
            hosts=nodes,
            gpus="8xH100",
            fleet="on-prem",
            attempt=2,
        ),
        job(
            "eval-harness-mmlu",
            JobStatus.PENDING,
            minutes=20,
            message="waiting for capacity: gpu-node-05: has 2 GPUs, needs 4; gpu-node-06: not "
            "ready (declared)",
        ),
        job(
            "sweep-lr-3e-4",
            JobStatus.PROVISIONING,
            minutes=2,
            hosts=["gpu-node-07"],
            fleet="on-prem",
            message="placed on gpu-node-07 (fleet on-prem)",
        ),
        job(
            "tokenize-dataset",
            JobStatus.DONE,
            minutes=3000,
            fleet="cpu-pool",
            message="all processes exited with code 0",
        ),
        job(
            "bert-pretrain-wikipedia-full",
            JobStatus.FAILED,
            minutes=90,
            reason="error",
            fleet="on-prem",
            message="command exited with code 137 on node 1 (gpu-node-02)",
        ),
        job(
            "idle-notebook-with-a-name-this-long-xyz",  # 39 characters of the 41 allowed
            JobStatus.TERMINATED,
            minutes=60,
            reason="gpu_underutilized",
            fleet="on-prem",
            message="GPU 0 below 10% for 30m",
        ),
    ]
    for width in (WIDTH, 60):
        text = _rendered(jobs_table(jobs, width=width, now=now), width=width)
        lines = text.splitlines()
        assert all(len(line) <= width for line in lines), text
        starts = [line.split()[0] for line in lines if line[:1].strip()]
        assert starts[: len(jobs) + 1] == ["NAME", *(info.name for info in jobs)], text
    text = _rendered(jobs_table(jobs, width=WIDTH, now=now))
    assert "ID, ATTEMPT, FLEET left out to fit" in text.splitlines()[-1]
    wide = _rendered(jobs_table(jobs, width=200, now=now), width=200)
    assert all(info.id in wide and info.name in wide for info in jobs)  # with room: both


def test_a_table_says_which_columns_it_left_out_to_fit() -> None:
    """ps and fleet list dropped columns at 80 columns without a word."""
    from gpuflow.cli.render import Column, fitted_table

    columns = [Column("NAME"), Column("MEMORY", drop=2), Column("PLATFORM", drop=1)]
    row = ["x" * 40, "0MB/256GB", "linux/x86_64 cuda " + "y" * 20]
    text = _rendered(fitted_table(columns, [row], width=WIDTH))
    assert text.splitlines()[-1].strip() == "(MEMORY left out to fit; --json has every field)"
    assert "left out" not in _rendered(fitted_table(columns, [row], width=200))


def test_no_line_ends_in_spaces_on_a_terminal_either(monkeypatch: Any) -> None:
    """Rich padded each line of a table and its caption to the table's width, and left the
    space a long line was wrapped at: every line copied or piped ended in spaces. Styled
    output (a terminal) ends its lines with style codes after the padding."""
    from gpuflow.cli.render import Column, fitted_table

    monkeypatch.setenv("FORCE_COLOR", "1")
    columns = [Column("NAME"), Column("WHY", wrap=True), Column("PLATFORM", drop=1)]
    rows = [["a" * 30, "short", "x" * 30], ["b", "word " * 20, "y"]]
    out = io.StringIO()
    console = common.new_console(width=WIDTH, file=out)
    console.print(fitted_table(columns, rows, width=WIDTH))
    console.print("a long line of words that wraps at the console's width " * 3)
    text = out.getvalue()
    assert "\x1b[" in text and "left out to fit" in text
    plain = [re.sub(r"\x1b\[[0-9;]*m", "", line) for line in text.splitlines()]
    assert len(plain) > 5
    assert [line for line in plain if line != line.rstrip()] == []
