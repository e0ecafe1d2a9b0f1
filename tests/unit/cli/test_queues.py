"""`gpuflow queue apply | list | delete`, a job naming its queue, and what `ps` says of a job an
admission pass left waiting: at 80 columns, with one-line errors."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from gpuflow.cli import common
from gpuflow.client import AppliedQueue, QueueInfo
from gpuflow.errors import GpuflowError, SpecError
from gpuflow.scheduler.model import NodePlacement
from gpuflow.specs import FleetSpec, JobSpec, QueueSpec
from gpuflow.status import JobStatus
from gpuflow.store.tables import AllocationRow, JobRow, QueueEntryRow
from tests.unit.cli.conftest import Cli, column_rows, lines_fit

RESEARCH = "type: queue\nname: research\ngpus: {A100: 2}\ncohort: lab\nborrowing_limit: 4\n"
PROD = "type: queue\nname: prod\ngpus: {A100: 4}\ncohort: lab\n"
BOX = """
type: fleet
name: lab
kind: sim
hosts:
  - name: box
    gpus: [{name: A100, memory: 80GB, count: 8}]
"""


def _error(output: str) -> str:
    lines = [line for line in output.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), output
    return lines[0].removeprefix("error: ")


def _entry(
    cli: Cli,
    job_id: str,
    queue: str,
    state: str,
    *,
    gpus: int = 0,
    position: int | None = None,
    reason: str | None = None,
) -> None:
    """A queue entry as admission writes it; an admitted one holds `gpus` A100s on box."""
    with cli.store.session() as session:
        session.add(
            QueueEntryRow(
                job_id=job_id,
                attempt=1,
                name=job_id,
                queue=queue,
                state=state,
                position=position,
                reason=reason,
            )
        )
        if gpus:
            node = NodePlacement(
                rank=0,
                host_id="lab/box",
                host_name="box",
                fleet="lab",
                task_queue="host-box",
                gpu_indices=list(range(gpus)),
                gpu_names=["A100"] * gpus,
            )
            session.add(
                AllocationRow(
                    job_id=job_id,
                    attempt=1,
                    rank=0,
                    fleet="lab",
                    host_id=node.host_id,
                    node=node.model_dump(mode="json"),
                )
            )
        session.commit()


def test_apply_says_created_then_updated_and_asks_for_an_admission_pass(cli: Cli) -> None:
    path = cli.write("research.yaml", RESEARCH)
    out = cli("queue", "apply", "-f", path)
    lines = lines_fit(out)
    assert lines[0] == "queue research created"
    # no fleet has A100s yet: a typo, or a fleet to come; said, not refused
    assert " ".join(lines[1:3]) == (
        "warning: queue research: no fleet has GPU model A100 (fleets have: no GPUs yet); "
        "its quota for it is used only once one does"
    )
    del lines[1:3]
    assert lines[1].split() == [
        "NAME",
        "COHORT",
        "QUOTA",
        "USED",
        "BORROWED",
        "LENT",
        "WAITING",
        "RUNNING",
    ]
    assert lines[2].split() == ["research", "lab", "A100:2", "0", "0", "0", "0", "0"]
    assert cli.temporal.admission_wakes == 1

    cli.fleet(BOX)
    path = cli.write("research.yaml", RESEARCH.replace("A100: 2", "A100: 3, T4: 1"))
    applied = json.loads(cli("queue", "apply", "-f", path, "--json"))
    assert (applied["created"], applied["changed"]) == (False, True)
    assert applied["warnings"] == [
        "queue research: no fleet has GPU model T4 (fleets have: A100); its quota for it is "
        "used only once one does"
    ]
    assert applied["queue"]["quota"] == {"A100": 3, "T4": 1}
    assert cli.temporal.admission_wakes == 2
    # the same file again: nothing to write, and no pass to ask for
    assert lines_fit(cli("queue", "apply", "-f", path))[0] == "queue research unchanged"
    assert cli.temporal.admission_wakes == 2


def test_list_shows_quota_use_borrowing_lending_and_jobs(cli: Cli) -> None:
    cli("queue", "apply", "-f", cli.write("research.yaml", RESEARCH))
    cli("queue", "apply", "-f", cli.write("prod.yaml", PROD))
    _entry(cli, "job-r1", "research", "admitted", gpus=3)
    _entry(cli, "job-r2", "research", "waiting", position=0, reason="quota")
    _entry(cli, "job-p1", "prod", "admitted", gpus=1)
    _entry(cli, "job-d1", "default", "waiting", position=1, reason="no_capacity")
    out = cli("queue", "list")
    rows = {line.split()[0]: line.split()[1:] for line in lines_fit(out)[1:]}
    # research runs 3 of its quota of 2: 1 borrowed, lent by prod, which has 3 idle.
    assert rows == {
        "default": ["-", "no", "limit", "0", "0", "0", "1", "0"],
        "prod": ["lab", "A100:4", "A100:1", "0", "A100:1", "0", "1"],
        "research": ["lab", "A100:2", "A100:3", "A100:1", "0", "1", "1"],
    }
    data = {q["name"]: q for q in json.loads(cli("queue", "list", "--json"))}
    assert data["research"] == {
        "name": "research",
        "cohort": "lab",
        "quota": {"A100": 2},
        "borrowing_limit": 4,
        "lending_limit": None,
        "built_in": False,
        "used": {"A100": 3.0},
        "borrowed": {"A100": 1.0},
        "lent": {},
        "over_quota": {},
        "waiting": 1,
        "admitted": 1,  # its first name, kept
        "between_attempts": 0,
        "running": 1,
    }
    # no limit, as the table says it: not the most a quota may be
    assert data["default"]["built_in"] is True and data["default"]["quota"] is None
    # prod's quota lowered under its running job: nothing lends research its 1 beyond quota
    # now, and prod's own job is beyond prod's new quota of 0
    cli("queue", "apply", "-f", cli.write("prod.yaml", PROD.replace("A100: 4", "A100: 0")))
    rows = {line.split()[0]: line.split()[1:] for line in lines_fit(cli("queue", "list"))[1:]}
    # `A100:3 (A100:1 over)` wrapped onto two lines at 80 columns
    assert rows["prod"] == ["lab", "0", "A100:1", "(+1", "over)", "0", "0", "0", "1"]
    assert rows["research"] == ["lab", "A100:2", "A100:3", "(+1", "over)", "0", "0", "1", "1"]


def test_list_fits_80_columns_with_long_names_and_many_models(cli: Cli) -> None:
    name, cohort = (
        "a-rather-long-queue-name-for-the-lab-team",
        "a-cohort-whose-name-is-long-as-well-too",
    )
    models = "{A100: 8, H100: 8, L4: 16, T4: 4, 'A[/]': 2}"
    path = cli.write("long.yaml", f"type: queue\nname: {name}\ngpus: {models}\ncohort: {cohort}\n")
    out = cli("queue", "apply", "-f", path)
    lines_fit(out)
    assert name in out  # whole, on one line
    assert "A[/]:2" in out  # a model is data, never markup
    assert "A100:8" in " ".join(column_rows(out, "QUOTA"))


def test_delete_refuses_a_queue_with_jobs_then_deletes_it(cli: Cli) -> None:
    cli("queue", "apply", "-f", cli.write("research.yaml", RESEARCH))
    _entry(cli, "job-r1", "research", "admitted", gpus=1)
    _entry(cli, "job-r2", "research", "waiting")
    out = cli("queue", "delete", "research", code=1)
    assert _error(out) == (
        "queue research still holds 2 job(s) (1 waiting, 1 running); "
        "stop them or let them finish first"
    )
    with cli.store.session() as session:
        for job_id in ("job-r1", "job-r2"):
            session.delete(session.get(QueueEntryRow, job_id))
        session.commit()
    # A job between two attempts holds no entry, and its next attempt enters the queue again.
    retrying = cli.job("r3", JobStatus.PENDING, queue="research")
    cli.job("r4", JobStatus.DONE, suffix="ffffff", queue="research")  # ended: holds nothing
    out = cli("queue", "delete", "research", code=1)
    assert _error(out) == (
        "queue research still holds 1 job(s) (0 waiting, 0 running, 1 between attempts); "
        "stop them or let them finish first"
    )
    with cli.store.session() as session:
        row = session.get(JobRow, retrying)
        assert row is not None
        row.status = JobStatus.FAILED
        session.add(row)
        session.commit()
    assert cli("queue", "delete", "research").strip() == "queue research deleted"
    assert [q["name"] for q in json.loads(cli("queue", "list", "--json"))] == ["default"]
    assert cli.temporal.admission_wakes == 2  # the apply, and the delete


def test_delete_of_an_unknown_queue_or_the_built_in_default_is_one_line(cli: Cli) -> None:
    out = cli("queue", "delete", "nope", code=1)
    assert _error(out) == 'queue "nope" does not exist; known: default'
    out = cli("queue", "delete", "default", code=1)
    assert _error(out).startswith("queue default is built in and cannot be deleted")
    applied = cli(
        "queue", "apply", "-f", cli.write("d.yaml", "type: queue\nname: default\ngpus: 4\n")
    )
    assert "queue default updated" in applied  # it said `created`: default always exists
    out = cli("queue", "delete", "default")
    assert out.strip() == "queue default deleted; the built-in default queue (no limit) is back"


def test_bad_queue_files_are_one_line_naming_the_file(cli: Cli) -> None:
    cases = {
        "type: fleet\nname: x\nkind: sim\n": "type: must be 'queue' for a queue file",
        "type: queue\nname: x\n": "gpus: required field is missing",
        "type: queue\nname: x\ngpus: 4\ncohort: lab\nlending_limit: 9\n": (
            "lending_limit 9 is more than its quota of 4 GPUs"
        ),
        "type: queue\nname: x\ngpus: 4\nweight: 2\n": "weight: unknown field",
        "type: queue\nname: x\ngpus: 4\ncohrt: lab\n": "cohrt: unknown field; did you mean cohort?",
        "type: queue\nname: Research\ngpus: 4\n": "queue name 'Research' must start",
    }
    for text, expected in cases.items():
        path = cli.write("bad.yaml", text)
        line = _error(cli("queue", "apply", "-f", path, code=1))
        assert "bad.yaml" in line and expected in line, line
    assert cli.temporal.admission_wakes == 0


def test_apply_points_a_queue_file_to_queue_apply(cli: Cli) -> None:
    path = cli.write("research.yaml", RESEARCH)
    line = _error(cli("apply", "-y", "-f", path, code=1))
    assert line.endswith("type: 'queue' is not a job; use `gpuflow queue apply` for a queue file")


def test_a_job_naming_an_unknown_queue_is_refused_at_submit(cli: Cli) -> None:
    cli.fleet(BOX)
    cli("queue", "apply", "-f", cli.write("research.yaml", RESEARCH))
    job = cli.write(
        "job.yaml", "name: a\ncommands: [x]\nresources: {gpu: A100:1}\nqueue: reserch\n"
    )
    # Refused by the plan already: no plan is shown for a job that cannot be submitted.
    out = cli("apply", "-y", "-d", "-f", job, code=1)
    assert _error(out) == (
        f'{job}: queue "reserch" does not exist (did you mean research?); known: default, research'
    )
    assert cli.temporal.started == []
    job = cli.write(
        "job.yaml", "name: a\ncommands: [x]\nresources: {gpu: A100:1}\nqueue: research\n"
    )
    cli("apply", "-y", "-d", "-f", job)
    assert len(cli.temporal.started) == 1
    (info,) = json.loads(cli("ps", "--json"))
    assert info["queue"] == "research"


def test_ps_shows_a_waiting_jobs_queue_position_and_reason(cli: Cli) -> None:
    cli("queue", "apply", "-f", cli.write("research.yaml", RESEARCH))
    jobs = {
        "quota": cli.job("over-quota", JobStatus.PENDING, suffix="000001", minutes_ago=9),
        "no_capacity": cli.job(
            "no-room",
            JobStatus.PENDING,
            suffix="000002",
            minutes_ago=8,
            message="waiting for capacity: box: has 8 GPUs free 1, needs 2; other: not ready",
        ),
        "reserved_for:job-big-abcdef": cli.job(
            "behind-big", JobStatus.PENDING, suffix="000003", minutes_ago=7
        ),
        "preempting:job-low-111111,job-low-222222": cli.job(
            "taking-back", JobStatus.PENDING, suffix="000004", minutes_ago=6
        ),
    }
    for position, (reason, job_id) in enumerate(jobs.items()):
        _entry(cli, job_id, "research", "waiting", position=position, reason=reason)
    holder = cli.job("holder", JobStatus.PENDING, suffix="000006", minutes_ago=5)
    _entry(cli, holder, "research", "waiting", position=4, reason="no_capacity")
    with cli.store.session() as session:  # the pass reserved box for it, its start unknown
        entry = session.get(QueueEntryRow, holder)
        assert entry is not None
        entry.reserved_hosts = "lab/box"
        session.add(entry)
        session.commit()
    unordered = cli.job("just-in", JobStatus.PENDING, suffix="000005", minutes_ago=1)
    out = cli("ps")
    lines = lines_fit(out)
    ids = [*jobs.values(), holder, unordered]
    order = [next(j for j in ids if j in line) for line in lines[1:] if any(j in line for j in ids)]
    why = dict(zip(order, column_rows(out, "WHERE / WHY"), strict=True))
    assert why == {
        jobs["quota"]: "research/#1 over quota",
        jobs["no_capacity"]: "research/#2 no capacity: box: has 8 GPUs free 1, needs 2 (+1 more)",
        jobs["reserved_for:job-big-abcdef"]: "research/#3 reserved for job-big-abcdef",
        jobs["preempting:job-low-111111,job-low-222222"]: (
            "research/#4 preempting job-low-111111, job-low-222222"
        ),
        holder: "research/#5 no capacity; reserves box (start unknown)",
        # No admission pass has looked at it yet: ps orders it among such jobs.
        unordered: "#1 of 1 waiting; waiting to be placed",
    }
    described = cli("describe", holder)
    assert "reserved   reserves box (start unknown)" in described.splitlines()[3]
    data = {j["id"]: j for j in json.loads(cli("ps", "--json"))}
    over = data[jobs["quota"]]
    assert (over["queue"], over["queue_position"], over["queue_reason"]) == ("research", 1, "quota")
    assert over["waiting"] == {"reason": "over quota", "position": 1, "waiting": None}
    assert data[unordered]["queue_position"] is None
    assert data[unordered]["waiting"] == {
        "reason": "waiting to be placed",
        "position": 1,
        "waiting": 1,
    }


def test_the_python_client_applies_lists_and_deletes_queues(cli: Cli) -> None:
    async def session() -> None:
        client = await common.open_client()
        applied = await client.apply_queue(Path(cli.write("research.yaml", RESEARCH)))
        assert isinstance(applied, AppliedQueue) and applied.created
        again = await client.apply_queue(QueueSpec(name="research", gpus=6, cohort="lab"))
        assert not again.created and again.queue.quota == {"*": 6}
        queues = await client.list_queues()
        assert [(q.name, q.built_in) for q in queues] == [("default", True), ("research", False)]
        assert isinstance(queues[0], QueueInfo)
        # Submit itself refuses an unknown queue (not only the plan before it).
        job = JobSpec(name="a", commands=["x"], queue="nope")
        with pytest.raises(
            SpecError, match=r'^queue "nope" does not exist; known: default, research$'
        ):
            await client.submit(job)
        with pytest.raises(SpecError, match=r"bad\.yaml: type: must be 'queue'"):
            await client.apply_queue(cli.write("bad.yaml", "type: fleet\n"))
        await client.delete_queue("research")
        assert [q.name for q in await client.list_queues()] == ["default"]

    asyncio.run(session())
    assert cli.temporal.started == []


def test_ps_says_in_full_why_a_queue_can_never_admit_a_job(cli: Cli) -> None:
    cli("queue", "apply", "-f", cli.write("research.yaml", RESEARCH))
    never = (
        "queue research can never admit it: it asks 1 GPU(s) of L4, more than its quota "
        "(A100:8) allows; it waits until a queue's quota changes (gpuflow queue apply)"
    )
    job_id = cli.job("l4", JobStatus.PENDING, message="waiting for capacity: " + never)
    _entry(cli, job_id, "research", "waiting", position=0, reason="quota")
    data = {j["id"]: j for j in json.loads(cli("ps", "--json"))}
    assert data[job_id]["waiting"]["reason"] == "over quota: " + never
    text = " ".join(" ".join(column_rows(cli("ps"), "WHERE / WHY")).split())
    assert text == "research/#1 over quota: " + never


def test_a_schedule_of_an_unknown_queue_or_fleet_is_refused(cli: Cli) -> None:
    """As a submit is: each run would fail on its own otherwise."""
    job = cli.write("n.yaml", "name: n\ncommands: [x]\nqueue: nosuch\n")
    out = " ".join(cli("schedule", "create", "-f", job, "--every", "1h", code=1).split())
    assert f'{job}: queue "nosuch" does not exist; known: default' in out  # names the file
    # apply's overrides: -q puts each run in a queue that exists
    out = cli("schedule", "create", "-f", job, "--every", "1h", "-q", "default", "--priority", "7")
    assert "schedule schedule-n created" in out
    action = cli.temporal.schedules["schedule-n"].action
    assert (action.args[0].spec.queue, action.args[0].spec.priority) == ("default", 7)
    job = cli.write("f.yaml", "name: f\ncommands: [x]\nfleets: [gone]\n")
    out = cli("schedule", "create", "-f", job, "--every", "1h", code=1)
    assert "fleets: gone not found" in out


def test_apply_plan_says_when_its_queue_could_never_admit_the_job(cli: Cli) -> None:
    cli.fleet(BOX)
    cli("queue", "apply", "-f", cli.write("research.yaml", RESEARCH))
    waits = "retry: {on_events: [no-capacity], duration: 2h}\n"
    big = cli.write(
        "big.yaml", "name: big\ncommands: [x]\nqueue: research\nresources: {gpu: 8}\n" + waits
    )
    text = " ".join(cli("apply", "-y", "-d", "-f", big).split())
    # the fleet has room; the queue never will
    assert "fits on box now, but its queue could never admit it (above)" in text
    assert (
        "queue research can never admit it: it asks 8 GPU(s) of any model, more than its "
        "quota (A100:2) and cohort lab's lending allows: it waits until a queue's quota "
        "changes (gpuflow queue apply), up to 2h after its submission"
    ) in text
    once = cli.write(
        "once.yaml", "name: once\ncommands: [x]\nqueue: research\nresources: {gpu: 8}\n"
    )
    text = " ".join(cli("apply", "-y", "-d", "-f", once).split())
    assert "lending allows: it would fail at once (its retry does not cover no-capacity)" in text
    small = cli.write("s.yaml", "name: s\ncommands: [x]\nqueue: research\nresources: {gpu: 2}\n")
    assert "can never admit" not in cli("apply", "-y", "-d", "-f", small)


def test_offers_says_when_its_queue_could_never_admit_the_job(cli: Cli) -> None:
    cli.fleet(BOX)
    cli("queue", "apply", "-f", cli.write("research.yaml", RESEARCH))
    big = cli.write("big.yaml", "name: big\ncommands: [x]\nqueue: research\nresources: {gpu: 8}\n")
    text = " ".join(cli("offers", "-f", big).split())
    assert "fits on box now, but its queue could never admit it (below) queue research" in text
    never = (
        "queue research can never admit it: it asks 8 GPU(s) of any model, more than its "
        "quota (A100:2) and cohort lab's lending allows"
    )
    assert never + ": it would fail at once (its retry does not cover no-capacity)" in text
    assert json.loads(cli("offers", "-f", big, "--json"))["queue_never"] == never
    small = cli.write("s.yaml", "name: s\ncommands: [x]\nqueue: research\nresources: {gpu: 2}\n")
    assert json.loads(cli("offers", "-f", small, "--json"))["queue_never"] is None
    lost = cli.write("l.yaml", "name: l\ncommands: [x]\nqueue: nowhere\nresources: {gpu: 2}\n")
    line = _error(cli("offers", "-f", lost, code=1))
    assert line.startswith(f'{lost}: queue "nowhere" does not exist; known: ')  # names the file


def test_apply_takes_several_files_checks_them_all_first_and_refuses_a_name_twice(
    cli: Cli,
) -> None:
    cli.fleet(BOX)
    research, prod = cli.write("research.yaml", RESEARCH), cli.write("prod.yaml", PROD)
    out = cli("queue", "apply", "-f", research, "-f", prod)
    lines = lines_fit(out)
    assert lines[:2] == ["queue research created", "queue prod created"]
    assert [line.split()[0] for line in lines[3:]] == ["research", "prod"]
    applied = json.loads(cli("queue", "apply", "-f", research, "-f", prod, "--json"))
    assert [(a["queue"]["name"], a["created"]) for a in applied] == [
        ("research", False),
        ("prod", False),
    ]
    # A bad file, or a name twice, applies nothing, not even the files before it.
    bad = cli.write("bad.yaml", "type: queue\nname: broken\ngpus: -1\n")
    fresh = cli.write("fresh.yaml", PROD.replace("name: prod", "name: fresh"))
    line = _error(cli("queue", "apply", "-f", fresh, "-f", bad, code=1))
    assert line.startswith(bad + ": gpus:")
    again = cli.write("again.yaml", PROD)
    line = _error(cli("queue", "apply", "-f", fresh, "-f", prod, "-f", again, code=1))
    assert line == f"{again}: queue prod is also in {prod}"
    names = [q["name"] for q in json.loads(cli("queue", "list", "--json"))]
    assert "fresh" not in names


def test_fleet_apply_takes_several_files(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each fleet is applied through the client, in order (the control plane's side, which
    reads hosts and starts health checks, is stood in for by the store's apply)."""
    from gpuflow.client.control_plane import ControlPlaneCalls as ControlPlane
    from gpuflow.services.fleets import apply_fleet

    async def apply(self: ControlPlane, spec: FleetSpec) -> object:
        if spec.name == "down":
            raise GpuflowError("host down/box (127.0.0.2:22): unreachable: connection refused")
        apply_fleet(cli.store, spec, {})
        return next(fleet for fleet in await self.fleets() if fleet.name == spec.name)

    monkeypatch.setattr(ControlPlane, "apply_fleet", apply)
    other = BOX.replace("name: lab", "name: lab2").replace("name: box", "name: box2")
    first, second = cli.write("lab.yaml", BOX), cli.write("lab2.yaml", other)
    out = cli("fleet", "apply", "-f", first, "-f", second)
    assert lines_fit(out)[:2] == ["fleet lab applied", "fleet lab2 applied"]
    listed = {f["name"] for f in json.loads(cli("fleet", "list", "--json"))}
    assert {"lab", "lab2"} <= listed
    applied = json.loads(cli("fleet", "apply", "-f", first, "-f", second, "--json"))
    assert [f["name"] for f in applied] == ["lab", "lab2"]
    line = _error(cli("fleet", "apply", "-f", first, "-f", first, code=1))
    assert line == f"{first}: fleet lab is also in {first}"
    # A later file failing where the control plane checks it: what changed before it is said.
    down = cli.write("down.yaml", BOX.replace("name: lab", "name: down"))
    from gpuflow.cli import main

    result = cli.runner.invoke(main.app, ["fleet", "apply", "-f", second, "-f", down])
    assert result.exit_code == 1
    said = " ".join(result.stderr.split())
    assert "applied before the error: fleet lab2" in said and "unreachable" in said


def test_apply_plan_says_which_running_jobs_admission_would_preempt(cli: Cli) -> None:
    cli.fleet(BOX)
    from datetime import UTC, datetime

    from gpuflow.services.queue_entries import enter_at_submit_in

    low_id = "job-low-a1b2c3"  # running, admitted as a submit is when nothing waits
    low = JobSpec(name="low", commands=["x"], resources={"gpu": 8}, preemptible=True)
    with cli.store.placement_transaction() as session:
        verdict = enter_at_submit_in(
            session, job_id=low_id, run_id="r1", spec=low, at=datetime.now(UTC)
        )
    assert verdict.placement is not None
    high = "name: high\ncommands: [x]\npriority: 100\nresources: {gpu: 4}\n"
    text = " ".join(cli("apply", "-y", "-d", "-f", cli.write("high.yaml", high)).split())
    assert f"nothing fits now; admission would preempt {low_id} (preemptible) to start it" in text
    # The dry run says the same (it said `goes to` a host, and nothing of the preemption).
    text = " ".join(cli("offers", "-f", cli.tmp_path / "high.yaml").split())
    assert f"admission would preempt {low_id} (preemptible) to start it on box" in text
    assert text.startswith("nothing fits now ") and "does not fit now" in text  # not "nothing"
    offered = json.loads(cli("offers", "-f", cli.tmp_path / "high.yaml", "--json"))
    assert offered["preempts"] == [low_id] and offered["starts"]["nodes"][0]["host_name"] == "box"
    # A job of the same priority preempts nothing: the plan says it waits.
    same = "name: same\ncommands: [x]\nresources: {gpu: 4}\n"
    text = " ".join(cli("apply", "-y", "-d", "-f", cli.write("same.yaml", same)).split())
    assert "would preempt" not in text
    assert "nothing fits now; it would fail at once (its retry does not cover no-capacity)" in text
    waits = same + "retry: {on_events: [no-capacity]}\n"
    text = " ".join(cli("apply", "-y", "-d", "-f", cli.write("w.yaml", waits)).split())
    assert "nothing fits now (#1 in line in queue default); it waits for capacity, up to 1h" in text


def test_plan_and_offers_say_when_admission_would_hold_a_job_a_host_fits(cli: Cli) -> None:
    """Seen from the CLI: the plan said `goes to sim-a100` for a job whose queue's quota was
    spent, and the job then waited `over quota`. The dry runs now answer on admission's terms:
    a pass run now, with the jobs waiting and running (services/preview.py)."""
    cli.fleet(BOX)
    cli("queue", "apply", "-f", cli.write("tiny.yaml", "type: queue\nname: tiny\ngpus: 2\n"))
    job = "name: {}\ncommands: [x]\nqueue: tiny\nresources: {{gpu: 2}}\n"
    job += "retry: {{on_events: [no-capacity]}}\n"
    first = " ".join(cli("apply", "-y", "-d", "-f", cli.write("t1.yaml", job.format("t1"))).split())
    assert "goes to box" in first
    from datetime import UTC, datetime

    from gpuflow.services.queue_entries import enter_at_submit_in

    with cli.store.placement_transaction() as session:  # t1 runs, as its submit admits it
        spec = JobSpec.model_validate(
            {"name": "t1", "commands": ["x"], "queue": "tiny", "resources": {"gpu": 2}}
        )
        admitted = enter_at_submit_in(
            session, job_id="job-t1-a1b2c3", run_id="r1", spec=spec, at=datetime.now(UTC)
        )
    assert admitted.placement is not None
    second = cli.write("t2.yaml", job.format("t2"))
    held = (
        "fits on box now, but waits, #1 in line in queue tiny: the queue has no quota left "
        "for it (gpuflow queue list)"
    )
    text = " ".join(cli("apply", "-y", "-d", "-f", second).split())
    assert held in text and "goes to" not in text
    text = " ".join(cli("offers", "-f", second).split())
    assert held in text and "goes to" not in text
    answer = json.loads(cli("offers", "-f", second, "--json"))
    assert (answer["waits"], answer["ahead"], answer["first"]) == ("quota", 0, 0)
    once = cli.write("once.yaml", "name: once\ncommands: [x]\nqueue: tiny\nresources: {gpu: 2}\n")
    text = " ".join(cli("offers", "-f", once).split())
    assert (
        "fits on box now, but would fail at once: the queue has no quota left for it (gpuflow "
        "queue list), and its retry does not cover no-capacity"
    ) in text
    other = cli.write("d.yaml", "name: d\ncommands: [x]\nresources: {gpu: 2}\n")
    assert json.loads(cli("offers", "-f", other, "--json"))["waits"] is None


def test_schedules_of_one_job_start_runs_of_their_own_and_say_what_never_fits(cli: Cli) -> None:
    """Temporal names a run `<action id>-<time>`: two schedules of one job firing in the same
    minute must not ask for one id (the second would be lost, silently)."""
    cli.fleet(BOX)
    job = cli.write("n.yaml", "name: nightly\ncommands: [x]\nresources: {gpu: A100:1}\n")
    out = cli("schedule", "create", "-f", job, "--every", "1h")
    assert "schedule schedule-nightly created" in out
    cli("schedule", "create", "-f", job, "--cron", "0 3 * * *", "--id", "weekly")
    ids = {key: s.action.id for key, s in cli.temporal.schedules.items()}
    assert ids["schedule-nightly"] == "job-nightly"  # the job's own schedule: as before
    assert ids["weekly"].startswith("job-nightly-") and len(ids["weekly"]) == len("job-nightly") + 7
    out = cli("schedule", "create", "-f", job, "--every", "1h", "--id", "Bad Id!", code=1)
    assert "--id 'Bad Id!' must start with a letter" in out
    huge = cli.write("h.yaml", "name: huge\ncommands: [x]\nresources: {gpu: A100:64}\n")
    out, err = cli.streams("schedule", "create", "-f", huge, "--every", "1h")
    assert "schedule schedule-huge created" in out
    warned = " ".join(err.split())
    assert "warning: nothing fits it, even with every host of its fleets idle" in warned


def test_jobs_no_pass_has_ordered_are_counted_in_their_own_queues_line(cli: Cli) -> None:
    """With admission held, two new jobs of two queues both read `#1 of 2 waiting`, then `#2`,
    counted together and apart from their queues' jobs a pass had ordered (`default/#1`)."""
    cli("queue", "apply", "-f", cli.write("research.yaml", RESEARCH))
    ordered = [
        cli.job(f"o{k}", JobStatus.PENDING, suffix=f"00000{k}", minutes_ago=9 - k) for k in range(2)
    ]
    for position, job_id in enumerate(ordered):
        _entry(cli, job_id, "default", "waiting", position=position, reason="no_capacity")
    urgent = cli.job("urgent", JobStatus.PENDING, suffix="000007", minutes_ago=1, priority=90)
    late = cli.job("late", JobStatus.PENDING, suffix="000008", minutes_ago=1)
    alone = cli.job("alone", JobStatus.PENDING, suffix="000009", minutes_ago=2, queue="research")
    data = {j["id"]: j for j in json.loads(cli("ps", "--json"))}
    out = cli("ps")
    ids = [*ordered, urgent, late, alone]
    lines = lines_fit(out)
    order = [next(j for j in ids if j in line) for line in lines[1:] if any(j in line for j in ids)]
    why = dict(zip(order, column_rows(out, "WHERE / WHY"), strict=True))
    assert why[urgent].startswith("#1 of 4 waiting;")  # priority 90 goes before the ordered
    assert why[late].startswith("#4 of 4 waiting;")
    assert why[alone].startswith("#1 of 1 waiting;")  # research's line, not default's
    assert data[ordered[0]]["queue_position"] == 1
