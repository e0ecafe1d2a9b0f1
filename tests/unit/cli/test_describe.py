"""`gpuflow describe`: one job in full, every reason it waits and the statuses it recorded, at
80 columns, and `--json`; the Python client's `events`."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta

import pytest

from gpuflow.services.jobs import record_status_in
from gpuflow.status import JobStatus
from tests.unit.cli.conftest import Cli, column_rows, lines_fit

T0 = datetime.now(UTC) - timedelta(minutes=5)


def _record(cli: Cli, job_id: str, k: int, status: JobStatus, message: str, **kw: object) -> None:
    with cli.store.session() as session:
        record_status_in(
            session,
            job_id=job_id,
            name=job_id.split("-")[1],
            spec={"name": job_id.split("-")[1], "commands": ["true"]},
            status=status,
            event_key=f"e{k}",
            message=message,
            at=T0 + timedelta(seconds=k),
            **kw,  # type: ignore[arg-type]
        )
        session.commit()


def _statuses(out: str) -> list[str]:
    """The STATUS column of the statuses table (rows start with a time)."""
    table = out.split("TIME", 1)[1].splitlines()[1:]
    return [line.split()[1] for line in table if line[:2].isdigit()]


def test_describe_shows_every_reason_a_job_waits_for(cli: Cli) -> None:
    job_id = cli.job("train", JobStatus.PENDING)
    reasons = [
        "sim-a100: 2 of 4 GPUs free, job needs 4",
        "vm: has no GPUs, job needs 4 GPUs",
        "sim-l4: has L4 GPUs, job needs A100",
    ]
    _record(cli, job_id, 1, JobStatus.PENDING, "waiting for capacity: " + "; ".join(reasons))
    out = cli("describe", "train")
    lines = lines_fit(out)
    assert lines[0].split() == ["job", "train", f"({job_id})"]
    text = "\n".join(lines)
    why = text.split("statuses")[0]
    for reason in reasons:  # ps shows the first and "(+2 more)"; describe shows them all
        assert reason in why
    # ... and its statuses keep to one line each
    assert column_rows(out, "MESSAGE") == [f"waiting for capacity: {reasons[0]} (+2 more)"]


def test_describe_lists_a_retried_jobs_statuses_newest_last(cli: Cli) -> None:
    job_id = cli.job("flaky", JobStatus.PENDING)
    steps = [
        (JobStatus.RUNNING, "running on 1 node(s)"),
        (JobStatus.FAILED, "node 0 exited with code 3"),
        (JobStatus.PENDING, "attempt 2: retrying after process_failed in 10 s"),
        (JobStatus.RUNNING, "running on 1 node(s)"),
        (JobStatus.FAILED, "node 0 exited with code 3"),
        (JobStatus.PENDING, "attempt 3: retrying after process_failed in 20 s"),
    ]
    for k, (status, message) in enumerate(steps, 1):
        _record(cli, job_id, k, status, message, attempt=1 + (k - 1) // 3)
    out = cli("describe", "flaky")
    lines_fit(out)
    assert _statuses(out) == [status.value for status, _ in steps]
    assert column_rows(out, "MESSAGE") == [message for _, message in steps]
    assert "first started" in out  # the row keeps attempt 1's start
    shown = json.loads(cli("describe", "flaky", "--json"))
    assert shown["job"]["id"] == job_id and shown["events_total"] == len(steps)
    assert [e["message"] for e in shown["events"]] == [message for _, message in steps]
    # The newest N, and how many there are.
    out = cli("describe", "flaky", "--events", "2")
    assert f"statuses (the newest 2 of {len(steps)})" in out
    assert _statuses(out) == ["failed", "pending"]
    assert json.loads(cli("describe", job_id, "--json", "--events", "1"))["events_total"] == 6


def test_describe_of_an_unknown_job_is_one_line(cli: Cli) -> None:
    out = cli("describe", "nothing", code=1)
    assert out.strip() == "error: no job named 'nothing' (see `gpuflow ps -a`)"


def test_the_python_client_reads_a_jobs_events(cli: Cli) -> None:
    from gpuflow.cli import common

    job_id = cli.job("train", JobStatus.RUNNING, hosts=["box"])
    _record(cli, job_id, 1, JobStatus.RUNNING, "running on 1 node(s)")

    async def read() -> tuple[int, list[str]]:
        client = await common.open_client()
        try:
            events = await client.events("train", most=5)
        finally:
            await client.close()
        return events.total, [event.message for event in events.events]

    assert asyncio.run(read()) == (1, ["running on 1 node(s)"])


def test_the_python_clients_describe_is_the_clis(cli: Cli) -> None:
    """`Client.describe` gives what `gpuflow describe --json` prints, less the `waiting` summary
    that the CLI adds as `ps --json` does (it gave the workflow's Temporal status, which
    `Client.workflow_status` gives now)."""
    from gpuflow.cli import common
    from gpuflow.client import JobDescription

    job_id = cli.job("train", JobStatus.RUNNING, hosts=["box"])
    _record(cli, job_id, 1, JobStatus.RUNNING, "running on 1 node(s)")
    _record(cli, job_id, 2, JobStatus.DONE, "all processes exited with code 0")

    async def read() -> tuple[JobDescription, str]:
        client = await common.open_client()
        try:
            return await client.describe("train", events=1), await client.workflow_status(job_id)
        finally:
            await client.close()

    described, temporal_status = asyncio.run(read())
    assert described.job.id == job_id and described.job.status == JobStatus.DONE
    assert [event.message for event in described.events] == ["all processes exited with code 0"]
    assert described.events_total == 2
    printed = json.loads(cli("describe", "train", "--json", "--events", "1"))
    assert printed["job"].pop("waiting") is None  # what `ps --json` adds, the CLI adds too
    assert described.model_dump(mode="json") == printed
    assert temporal_status == "completed"


def test_describe_of_a_job_not_recorded_yet_shows_no_statuses(
    cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its workflow is open (the control plane answers `get` from it) but its first record is
    still to come: describe shows the job, and no statuses, instead of failing."""
    from gpuflow.client import Client, JobInfo

    async def get(self: Client, job: str) -> JobInfo:
        return JobInfo(
            id="job-early-a1b2c3",
            name="early",
            status=JobStatus.PENDING,
            submitted_at=datetime.now(UTC),
        )

    monkeypatch.setattr(Client, "get", get)
    out = cli("describe", "early")
    assert "early (job-early-a1b2c3)" in out and "statuses" in out
    assert json.loads(cli("describe", "early", "--json"))["events_total"] == 0


def test_describe_shows_the_first_reasons_of_a_big_fleet_and_counts_the_rest(cli: Cli) -> None:
    job_id = cli.job("wide", JobStatus.PENDING)
    reasons = [f"host-{k:04}: 0 of 8 GPUs free, job needs 8" for k in range(1213)]
    _record(cli, job_id, 1, JobStatus.PENDING, "waiting for capacity: " + "; ".join(reasons))
    lines = lines_fit(cli("describe", "wide"))
    text = "\n".join(lines)
    assert "host-0000: 0 of 8" in text and "host-0028: 0 of 8" in text
    assert "host-0029" not in text
    assert "... and 1,184 more (--json has all)" in text
    assert len(lines) < 60
    shown = json.loads(cli("describe", "wide", "--json"))
    assert shown["job"]["message"].count("; ") == 1212


def test_metrics_of_a_job_that_ended_before_its_first_sample_says_so(
    cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpuflow.client import Client, Progress
    from gpuflow.utilization import UtilizationState

    async def metrics(self: Client, job: str) -> UtilizationState:
        return UtilizationState()

    def progress_of(status: JobStatus) -> object:
        async def progress(self: Client, job: str) -> Progress:
            return Progress(job_id="job-quick-a1b2c3", name="quick", status=status, attempt=1)

        return progress

    monkeypatch.setattr(Client, "metrics", metrics)
    from datetime import UTC, datetime

    from gpuflow.store.tables import JobRow

    monkeypatch.setattr(Client, "progress", progress_of(JobStatus.DONE))
    for name, gpus in (("quick", "1xA100"), ("cpu", "-")):  # `-`: it ran on no GPU (ps)
        job_id = cli.job(name, JobStatus.DONE, suffix="000000", hosts=["box"])
        with cli.store.session() as session:
            row = session.get(JobRow, job_id)
            assert row is not None
            row.gpus, row.started_at = gpus, datetime.now(UTC)
            session.add(row)
            session.commit()
    out = " ".join(cli("metrics", "quick").split())
    assert "no GPU samples: the job ended before its first sample (samples come every 2m" in out
    raw = cli("metrics", "-w", "quick")
    assert raw.endswith("quick ended done\n")  # why it stopped moving, on a line of its own
    watched = " ".join(raw.split())  # it showed a bare header
    assert "no GPU samples: the job ended before its first sample" in watched
    assert "UTIL" not in watched
    assert cli("metrics", "cpu").strip() == "no GPU samples: the job asks for no GPUs"
    cli.job("quick", JobStatus.RUNNING)
    monkeypatch.setattr(Client, "progress", progress_of(JobStatus.RUNNING))
    out = cli("metrics", "quick")
    assert "no GPU samples yet" in out and "UTIL" not in out  # no empty table
    assert "every 2m without a utilization policy" in " ".join(out.split())  # as the monitor
    # A job that waits has no samples because it has not started: it says why, on stderr.
    cli.job("later", JobStatus.PENDING, message="waiting for capacity: box: 0 of 8 GPUs free")
    monkeypatch.setattr(Client, "progress", progress_of(JobStatus.PENDING))
    out, err = cli.streams("metrics", "later")
    assert out == ""
    assert " ".join(err.split()) == (
        "later (job-later-a1b2c3) has not started: no capacity: box: 0 of 8 GPUs free"
    )


def test_describe_lists_a_refused_jobs_reasons_one_per_line(cli: Cli) -> None:
    job_id = cli.job("nofit", JobStatus.FAILED, reason="no_capacity")
    reasons = ["box: 0 of 8 GPUs free, job needs 8", "vm: has no GPUs, job needs 8 GPUs"]
    _record(cli, job_id, 1, JobStatus.FAILED, "no capacity: " + "; ".join(reasons))
    why = cli("describe", "nofit").split("statuses")[0]
    lines = [line.strip() for line in why.splitlines()]
    assert any(line.endswith(reasons[0]) and line.startswith("why") for line in lines)
    assert reasons[1] in lines


def test_describe_and_json_say_whether_a_job_is_preemptible(cli: Cli) -> None:
    from gpuflow.store.tables import JobRow

    job_id = cli.job("spot", JobStatus.RUNNING, hosts=["box"], priority=10)
    cli.job("keep", JobStatus.RUNNING, hosts=["box"], suffix="ffffff")
    with cli.store.session() as session:
        row = session.get(JobRow, job_id)
        assert row is not None
        row.spec = {**row.spec, "preemptible": True}
        session.add(row)
        session.commit()
    lines = [line.split() for line in cli("describe", "spot").splitlines()]
    assert ["priority", "10,", "preemptible"] in lines
    assert ["priority", "0"] in [line.split() for line in cli("describe", "keep").splitlines()]
    listed = {j["name"]: j["preemptible"] for j in json.loads(cli("ps", "--json"))}
    assert listed == {"spot": True, "keep": False}


SIM_PAIR = """
type: fleet
name: sim
kind: sim
hosts:
  - name: h1
    gpus: [{name: A100, memory: 80GB, count: 4}]
  - name: h2
    gpus: [{name: A100, memory: 80GB, count: 4}]
"""


def test_a_running_job_on_a_host_not_answering_says_so(cli: Cli) -> None:
    """The health round marked a running job's host not ready: the job runs on (its own probes
    decide when it is lost), but `describe` and `ps --json` say which host and why."""
    from sqlmodel import select

    from gpuflow.services.fleets import set_host_state
    from gpuflow.status import HostState
    from gpuflow.store.tables import HostRow

    cli.fleet(SIM_PAIR)
    cli.job("train", JobStatus.RUNNING, hosts=["h1", "h2"])
    cli.job("other", JobStatus.RUNNING, hosts=["h2"], suffix="d4e5f6")
    cli.job("old", JobStatus.DONE, hosts=["h1"], suffix="a7b8c9", ended_minutes_ago=0.5)
    assert "warning" not in cli("describe", "train")
    with cli.store.read() as session:
        h1 = session.exec(select(HostRow).where(HostRow.name == "h1")).one()
    set_host_state(cli.store, h1.id, HostState.NOT_READY, "agent not answering")
    text = " ".join(cli("describe", "train").split())
    assert "warning host h1 is not_ready (agent not answering)" in text
    assert "h2 is" not in text
    assert "warning" not in cli("describe", "other")
    assert "warning" not in cli("describe", "old")  # an ended job holds no host
    out, err = cli.streams("ps")
    assert "train" in out
    assert " ".join(err.split()) == "warning: train: host h1 is not_ready (agent not answering)"
    listed = {job["name"]: job for job in json.loads(cli("ps", "-a", "--json"))}
    assert listed["train"]["hosts_not_ready"] == {"h1": "not_ready (agent not answering)"}
    assert listed["other"]["hosts_not_ready"] == {}
    assert listed["old"]["hosts_not_ready"] == {}


def test_describe_json_says_why_a_job_waits_as_ps_json_does(cli: Cli) -> None:
    """The same `waiting` summary (reason, place in line, how many wait) for each job."""
    first = cli.job("first", JobStatus.PENDING, suffix="000001", minutes_ago=3)
    second = cli.job("second", JobStatus.PENDING, suffix="000002", minutes_ago=2)
    _record(cli, second, 1, JobStatus.PENDING, "waiting for capacity: box: 0 of 8 GPUs free")
    running = cli.job("busy", JobStatus.RUNNING, hosts=["box"])
    listed = {job["id"]: job["waiting"] for job in json.loads(cli("ps", "--json"))}
    for job_id in (first, second, running):
        shown = json.loads(cli("describe", job_id, "--json"))["job"]["waiting"]
        assert shown == listed[job_id], job_id
    assert listed[second] == {
        "reason": "no capacity: box: 0 of 8 GPUs free",
        "position": 2,
        "waiting": 2,
    }
    assert listed[running] is None


def test_metrics_watched_through_a_pipe_prints_each_new_reading(
    cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`metrics -w | tee log`: a display redrawn in place printed nothing until the job ended,
    and its last line ran into the `ended` line. Each new reading is a table of its own."""
    from gpuflow.cli import jobs as jobs_cli
    from gpuflow.client import Client, Progress
    from gpuflow.store.tables import JobRow
    from gpuflow.utilization import GpuSample, UtilizationState, update

    real_sleep = asyncio.sleep
    monkeypatch.setattr(jobs_cli.asyncio, "sleep", lambda _s: real_sleep(0))
    job_id = cli.job("busy", JobStatus.RUNNING, hosts=["box"])
    readings = [37.0, 37.0, 81.0]  # the second refresh brings nothing new
    state = UtilizationState()
    asked = 0

    async def metrics(self: Client, job: str) -> UtilizationState:
        nonlocal asked
        if asked < len(readings):
            sample = GpuSample(
                gpu=0,
                ts=1000.0 + 15 * len({*readings[: asked + 1]}),
                utilization=readings[asked],
                memory_used_mib=1024,
                memory_total_mib=81920,
            )
            update(state, 0, [sample], policy=None)
        asked += 1
        if asked == len(readings):  # the job ends after its third reading
            with cli.store.session() as session:
                row = session.get(JobRow, job_id)
                assert row is not None
                row.status, row.termination_reason = JobStatus.DONE, "done"
                session.add(row)
                session.commit()
        return state.model_copy(deep=True)

    async def progress(self: Client, job: str) -> Progress:
        return Progress(job_id=job_id, name="busy", status=JobStatus.RUNNING, attempt=1)

    monkeypatch.setattr(Client, "metrics", metrics)
    monkeypatch.setattr(Client, "progress", progress)
    raw = cli("metrics", "-w", "busy")
    assert raw.count("NODE  HOST") == 2  # 37%, then 81%: the unchanged reading not again
    assert raw.index(" 37% ") < raw.index(" 81% ")
    assert raw.endswith("\nbusy ended done (done)\n")
