"""What `stop`, `offers`, `apply`, `agent` and a stack that is down say to the user."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from gpuflow.cli import main
from gpuflow.status import JobStatus
from tests.unit.cli.conftest import Cli, lines_fit

A100_BOX = """
type: fleet
name: lab
kind: sim
hosts:
  - name: box
    gpus: [{name: A100, memory: 80GB, count: 2}]
"""
TWO_FLEETS = """
type: fleet
name: {name}
kind: sim
hosts:
  - name: {name}-1
    gpus: [{{name: A100, memory: 80GB, count: 4}}]
  - name: {name}-2
    gpus: [{{name: A100, memory: 80GB, count: 4}}]
"""


def test_stop_on_an_ended_job_says_so_and_sends_nothing(cli: Cli) -> None:
    cli.job("old", JobStatus.DONE, reason="done", ended_minutes_ago=3)
    assert cli("stop", "old").strip() == "job old already ended (done 3m ago)"
    cli.job(
        "idle",
        JobStatus.TERMINATED,
        suffix="d4e5f6",
        reason="gpu_underutilized",
        ended_minutes_ago=125,
    )
    out = cli("stop", "idle")
    assert out.strip() == "job idle already ended (terminated 2h ago: gpu_underutilized)"
    assert cli.temporal.signals == []


def test_stop_reaches_a_job_between_an_ended_attempt_and_its_retry(
    cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its row reads the ended attempt's status for a moment while its workflow goes on to
    retry it: the workflow still runs, so the stop is sent."""
    from tests.unit.cli.conftest import FakeHandle

    job_id = cli.job("again", JobStatus.TERMINATED, reason="preempted", ended_minutes_ago=0)

    async def running(self: FakeHandle) -> object:
        from temporalio.client import WorkflowExecutionStatus

        return SimpleNamespace(status=WorkflowExecutionStatus.RUNNING)

    monkeypatch.setattr(FakeHandle, "describe", running)
    out = cli("stop", "again")
    assert "already ended" not in out
    assert cli.temporal.signals == [(job_id, "stop")]


def test_stop_on_a_running_job_stops_it(cli: Cli) -> None:
    job_id = cli.job("spin", JobStatus.RUNNING, hosts=["box"])
    assert cli("stop", "spin").strip() == f"spin ({job_id}): stopped (stopped_by_user)"
    assert cli.temporal.signals == [(job_id, "stop")]
    other = cli.job("spin", JobStatus.RUNNING, hosts=["box"], suffix="ffffff")
    assert cli("stop", other).strip() == f"spin ({other}): stopped (stopped_by_user)"  # by id


def test_a_name_means_the_job_of_that_name_that_has_not_ended(cli: Cli) -> None:
    """Two jobs named alike: a name used to mean the newest, ended or not, so `stop NAME`
    could stop the waiting copy, then say `already ended` with the other one running."""
    running = cli.job("twin", JobStatus.RUNNING, hosts=["box"], minutes_ago=5)
    cli.job("twin", JobStatus.DONE, suffix="ffffff", minutes_ago=1, ended_minutes_ago=0.5)
    assert cli("stop", "twin").strip() == f"twin ({running}): stopped (stopped_by_user)"
    assert cli.temporal.signals == [(running, "stop")]
    # both ended now: the newest, as before
    assert json.loads(cli("describe", "twin", "--json"))["job"]["id"] == "job-twin-ffffff"
    first = cli.job("pair", JobStatus.RUNNING, hosts=["box"], minutes_ago=3)
    second = cli.job("pair", JobStatus.PENDING, suffix="eeeeee", minutes_ago=2)
    out = " ".join(cli("stop", "pair", code=1).split())
    assert (
        f"several jobs named 'pair' have not ended: {second} (pending), {first} (running); "
        "give an id"
    ) in out
    assert cli.temporal.signals == [(running, "stop")]  # nothing sent


def test_offers_shows_a_gang_as_a_gang(cli: Cli) -> None:
    # Fleet `one` has one idle host that fits a node; `two` has two: the gang goes to `two`.
    cli.fleet(TWO_FLEETS.format(name="two"))
    gang = cli.write("gang.yaml", "name: g\ncommands: [x]\nnodes: 2\nresources: {gpu: A100:4}\n")
    out = cli("offers", "-f", gang)
    lines_fit(out)
    verdict = json.loads(cli("offers", "-f", gang, "--json"))["placement"]
    hosts = [node["host_name"] for node in verdict["nodes"]]
    assert hosts == ["two-1", "two-2"]
    assert "gang of 2 in fleet two" in out
    assert f"goes to a gang of 2 on {', '.join(hosts)} (fleet two" in out

    # A fleet of two where one host is not ready: the other fits a node, but there is no gang.
    cli.fleet(
        TWO_FLEETS.format(name="two").replace(
            "count: 4}]\n", "count: 4}]\n    state: not_ready\n", 1
        )
    )
    out = cli("offers", "-f", gang)
    lines_fit(out)
    assert json.loads(cli("offers", "-f", gang, "--json"))["placement"] is None
    assert "no gang of 2 whole idle hosts in one fleet" in out
    assert "goes to" not in out and "fits\n" not in out
    assert "fleet two: 1 idle host fits, and a 2-node job needs 2 in one fleet" in out


def test_a_cpu_only_job_plans_as_asking_no_gpu(cli: Cli) -> None:
    cli.fleet(A100_BOX)
    cpu = cli.write("c.yaml", "name: c\ncommands: [x]\n")  # it read "GPU no GPU"
    text = " ".join(cli("apply", "-y", "-d", "-f", cpu).split())
    assert "c: 1 node(s), no GPU, fleets any" in text


def test_apply_plans_several_files_together(cli: Cli) -> None:
    cli.fleet(A100_BOX)
    first = cli.write("a.yaml", "name: a\ncommands: [x]\nresources: {gpu: A100:2}\n")
    second = cli.write("b.yaml", "name: b\ncommands: [x]\nresources: {gpu: A100:1}\n")
    out = cli("apply", "-y", "-d", "-f", first, "-f", second)
    lines_fit(out)
    text = " ".join(out.split())
    assert "plan for 2 jobs, in submission order" in text
    assert "a: 1 node(s), GPU A100:2, fleets any goes to box (fleet lab, GPUs 0,1)" in text
    # Alone, b would fit on box; after a takes both GPUs nothing is left for it.
    assert "b: 1 node(s), GPU A100:1, fleets any nothing left for it once a is placed" in text
    assert "(alone it would go to box)" in text
    assert "box: " in text.split("nothing left for it")[1]  # the reason, as the scheduler words it
    assert len(cli.temporal.started) == 2


def test_apply_plan_says_when_no_room_could_ever_come(cli: Cli) -> None:
    cli.fleet(A100_BOX)
    later = cli.write("a.yaml", "name: a\ncommands: [x]\nresources: {gpu: A100:2}\n")
    never = cli.write("b.yaml", "name: b\ncommands: [x]\nresources: {gpu: A100:2}\nnodes: 2\n")
    text = " ".join(cli("apply", "-y", "-d", "-f", later, "-f", later, "-f", never).split())
    assert "nothing left for it once a is placed" in text
    assert text.count("nothing fits, even with every host of its fleets idle and ready") == 1
    assert "b: 2 node(s), GPU A100:2, fleets any nothing fits, even with every host" in text
    assert "only a change of the fleets (gpuflow fleet apply) makes room" in text


def test_offers_says_when_no_room_could_ever_come(cli: Cli) -> None:
    cli.fleet(A100_BOX)
    never = cli.write("n.yaml", "name: n\ncommands: [x]\nresources: {gpu: A100:4}\n")
    text = " ".join(cli("offers", "-f", never).split())
    assert "nothing fits nor would it with every host of its fleets idle and ready" in text
    assert json.loads(cli("offers", "-f", never, "--json"))["fits_idle"] is False
    fits = cli.write("f.yaml", "name: f\ncommands: [x]\nresources: {gpu: A100:1}\n")
    assert "nor would it" not in cli("offers", "-f", fits)
    assert json.loads(cli("offers", "-f", fits, "--json"))["fits_idle"] is None


def test_apply_plan_moves_a_job_to_the_host_left_free(cli: Cli) -> None:
    cli.fleet(TWO_FLEETS.format(name="lab"))
    first = cli.write("a.yaml", "name: a\ncommands: [x]\nresources: {gpu: A100:4}\n")
    second = cli.write("b.yaml", "name: b\ncommands: [x]\nresources: {gpu: A100:4}\n")
    text = " ".join(cli("apply", "-y", "-d", "-f", first, "-f", second).split())
    assert "a: 1 node(s), GPU A100:4, fleets any goes to lab-1 (fleet lab, GPUs 0,1,2,3)" in text
    assert "goes to lab-2 (fleet lab, GPUs 0,1,2,3) (alone it would go to lab-1; a takes it" in text


def test_agent_help_lists_its_options_and_forwards_them(
    cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = cli("agent", "--help")
    for option in (
        "--host-id",
        "--temporal-address",
        "--state-dir",
        "--task-queue",
        "--namespace",
        "--secrets-file",
        "--tls",
        "--tls-ca",
        "--tls-cert",
        "--tls-key",
        "--tls-server-name",
        "--api-key-file",
        "--facts",
    ):
        assert option in out
    assert "--api-key " not in out  # refused, and not offered

    seen: list[list[str]] = []
    monkeypatch.setattr("gpuflow.agent.main.main", lambda argv: seen.append(argv) or 0)
    cli(
        "agent",
        "--host-id",
        "lab/box",
        "--temporal-address",
        "10.0.0.1:7233",
        "--state-dir",
        "/tmp/agent",
        "--tls-ca",
        "/etc/ca.pem",
        "--tls",
    )
    assert seen == [
        [
            "--host-id",
            "lab/box",
            "--temporal-address",
            "10.0.0.1:7233",
            "--state-dir",
            "/tmp/agent",
            "--namespace",
            "default",
            "--tls-ca",
            "/etc/ca.pem",
            "--tls",
        ]
    ]
    out = cli("agent", "--host-id", "lab/box", code=2)
    assert "error: --host-id, --temporal-address and --state-dir are required" in out
    out = cli("agent", "--api-key", "sekrit-value", code=2)
    assert "--api-key-file" in out and "sekrit-value" not in out
    assert len(seen) == 1


def test_stack_down_is_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("GPUFLOW_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("GPUFLOW_TEMPORAL_ADDRESS", raising=False)
    monkeypatch.delenv("GPUFLOW_DATABASE_URL", raising=False)
    monkeypatch.setenv("GPUFLOW_TEMPORAL_PORT", "1")  # the embedded stack's port: nothing there
    result = CliRunner().invoke(main.app, ["ps"])
    assert result.exit_code == 1
    assert result.output.strip() == (
        "error: cannot reach Temporal at 127.0.0.1:1 — is the stack up? (gpuflow up -d)"
    )


def test_stack_that_goes_down_mid_command_is_one_line(
    cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    from temporalio.service import RPCError, RPCStatusCode

    async def unavailable(*_: object, **__: object) -> None:
        raise RPCError(
            "Service unavailable: tcp connect error\nmore transport text",
            RPCStatusCode.UNAVAILABLE,
            b"",
        )

    cli.fleet(A100_BOX)
    monkeypatch.setattr(cli.temporal, "start_workflow", unavailable)
    monkeypatch.setenv("GPUFLOW_TEMPORAL_PORT", "7233")
    job = cli.write("a.yaml", "name: a\ncommands: [x]\nresources: {gpu: A100:1}\n")
    out = cli("apply", "-y", "-d", "-f", job, code=1)
    assert out.strip().splitlines()[-1] == (
        "error: cannot reach Temporal at 127.0.0.1:7233 — is the stack up? (gpuflow up -d)"
    )
    assert "transport" not in out


def test_logs_of_a_job_that_has_not_started_says_why_on_stderr(
    cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`gpuflow logs` of a waiting job printed nothing and exited 0: nothing said why. (The
    log reader is a Temporal workflow the fake does not run: its output is stood in for.)"""
    from gpuflow.client import Client

    asked: list[int | None] = []  # the attempt each `logs` asked the client for

    async def logs(
        self: Client, job: str, attempt: int | None = None, **_: object
    ) -> AsyncIterator[str]:
        asked.append(attempt)
        info = await self.get(job)
        if info.status == JobStatus.RUNNING or attempt == 1:
            yield "step 1\n"

    monkeypatch.setattr(Client, "logs", logs)
    cli.job("w", JobStatus.PENDING, message="waiting for capacity: box: 0 of 8 GPUs free")
    out, err = cli.streams("logs", "w")
    assert out == ""  # the output stays the job's own
    said = " ".join(err.split())
    assert said == "w (job-w-a1b2c3) has not started: no capacity: box: 0 of 8 GPUs free"
    # Requeued after a preemption: its first attempt ran; this one has not started yet.
    requeued = cli.job("q", JobStatus.PENDING, suffix="c1c2c3", message="waiting in queue")
    with cli.store.session() as session:
        from gpuflow.store.tables import JobRow

        row = session.get(JobRow, requeued)
        assert row is not None
        row.attempt = 2
        session.add(row)
        session.commit()
    said = " ".join(cli.streams("logs", "q")[1].split())
    assert said.startswith("q (job-q-c1c2c3)'s attempt 2 has not started: ")
    assert said.endswith("(earlier attempts' output: gpuflow logs job-q-c1c2c3 --attempt 1)")
    # Its first attempt's output is read with --attempt, and nothing is said of this one.
    asked.clear()
    out, err = cli.streams("logs", "q", "--attempt", "1")
    assert (out, err, asked) == ("step 1\n", "", [1])
    cli.job("r", JobStatus.RUNNING, suffix="d4e5f6")
    out, err = cli.streams("logs", "r")
    assert (out, err, asked) == ("step 1\n", "", [1, None])
    cli.job("n", JobStatus.FAILED, suffix="f7f8f9", reason="no_capacity", ended_minutes_ago=0)
    out, err = cli.streams("logs", "n")  # it printed nothing at all
    said = " ".join(err.split())
    assert (out, said) == (
        "",
        "n (job-n-f7f8f9) ended failed (no_capacity) before it started: no output",
    )


def test_apply_plans_each_job_as_admission_decides_it_on_entering(cli: Cli) -> None:
    """Submitted in order, the first two take the two GPUs; the third, of a higher priority,
    would preempt the lowest of them (both preemptible), not wait."""
    cli.fleet(A100_BOX)
    job = "name: r{k}\ncommands: [x]\nresources: {{gpu: A100:1}}\npriority: {p}\n"
    job += "preemptible: true\n"
    files = [cli.write(f"r{k}.yaml", job.format(k=k, p=10 * k)) for k in (1, 2, 3)]
    out = cli("apply", "-y", "-d", *[arg for f in files for arg in ("-f", f)])
    lines_fit(out)
    text = " ".join(out.split())
    assert "r1: 1 node(s), GPU A100:1, fleets any goes to box (fleet lab, GPUs 0)" in text
    assert "r2: 1 node(s), GPU A100:1, fleets any goes to box (fleet lab, GPUs 1)" in text
    assert (
        "r3: 1 node(s), GPU A100:1, fleets any nothing fits now; admission would preempt "
        "planned r1 "
        "(preemptible) to start it on box:"
    ) in text
    assert "nothing left for it" not in text and "waits" not in text


def test_offers_refuses_what_the_submit_refuses(cli: Cli) -> None:
    """The dry run said `fits` for a job whose secret is not stored, and `nothing fits` for a
    fleet that does not exist; the submit refuses both before anything is created."""
    cli.fleet(A100_BOX)
    job = "name: s\ncommands: [x]\nresources: {gpu: 1}\n"
    secret = cli.write("s.yaml", job + "env: {T: '${{ secrets.nowhere }}'}\n")
    fleet = cli.write("f.yaml", "name: f\ncommands: [x]\nfleets: [nowhere]\nresources: {gpu: 1}\n")
    # pinned to a host no fleet has: it would fail at once, or wait for nothing
    pinned = cli.write("p.yaml", job + "placement: {hosts: [box], gpus: ['gone:0']}\n")
    for path, says in (
        (secret, "no secret named nowhere"),
        (fleet, "fleets: nowhere not found"),
        (pinned, "placement: no fleet has a host named gone (gpuflow fleet list)"),
    ):
        for command in ("offers", "apply"):
            out = cli(command, "-f", path, *(["-y", "-d"] if command == "apply" else []), code=1)
            assert says in " ".join(out.split()), (command, out)


def test_ctrl_c_while_apply_follows_says_the_jobs_go_on(
    cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It printed `interrupted` alone: nothing said the job still runs, or how to reach it."""
    from gpuflow.cli import follow

    async def interrupted(*args: object, **kwargs: object) -> bool:
        raise KeyboardInterrupt

    monkeypatch.setattr(follow, "follow_jobs", interrupted)
    cli.fleet(A100_BOX)
    job = cli.write("go.yaml", "name: go\ncommands: [x]\nresources: {gpu: A100:1}\n")
    result = cli.runner.invoke(main.app, ["apply", "-y", "-f", job], env={"COLUMNS": "80"})
    assert result.exit_code == 130
    said = " ".join(result.stderr.split())
    assert "left; the job(s) go on: gpuflow ps, gpuflow logs -f NAME, gpuflow stop go" in said
    assert said.endswith("interrupted")


def test_offers_takes_applys_flags(cli: Cli) -> None:
    """`apply --gpu A100:2` could not be dry-run with the same flags."""
    cli.fleet(A100_BOX)
    job = cli.write("one.yaml", "name: one\ncommands: [x]\nresources: {gpu: A100:1}\n")
    assert json.loads(cli("offers", "-f", job, "--json"))["placement"] is not None
    asked = json.loads(cli("offers", "-f", job, "--gpu", "A100:4", "--json"))  # box has 2
    assert asked["placement"] is None and "job needs 4" in str(asked["rejections"])
    out = " ".join(cli("offers", "-f", job, "--fleet", "nowhere", code=1).split())
    assert "fleets: nowhere not found" in out


def test_help_shows_no_value_after_a_flag(cli: Cli) -> None:
    """A flag takes no value: its help must not read `--json <bool>`."""
    out = " ".join(cli("ps", "--help").split())
    assert "--json Print JSON" in out and "<bool>" not in out
    assert "--limit <int range>" in out  # an option that takes a value still says what


def test_every_option_and_argument_of_every_command_says_what_it_is() -> None:
    """`gpuflow offers --help` listed `--profile` with no words, and `fleet delete`, `schedule
    delete`, `secret set` and `secret delete` their argument."""
    import typer

    from gpuflow.cli.main import app

    def bare(command: object, path: list[str]) -> list[str]:
        subs = getattr(command, "commands", None)
        if subs:
            return [found for name, sub in subs.items() for found in bare(sub, [*path, name])]
        return [
            f"{' '.join(path)} {param.name}"
            for param in getattr(command, "params", [])
            if not getattr(param, "help", None) and not getattr(param, "hidden", False)
        ]

    assert bare(typer.main.get_command(app), []) == []
