"""`gpuflow ps --queue Q`: the jobs of one queue (the queue each names), with `--json` and
`--all`; a queue nobody knows is an error, not an empty list. `apply --queue/--priority`
override the file's. `gpuflow set-priority` changes a job's priority: its workflow is told,
its row and queue entry changed, and a pass asked for."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from gpuflow.services.queue_entries import enqueue_in
from gpuflow.services.queues import apply_queue
from gpuflow.specs import JobSpec, QueueSpec
from gpuflow.status import JobStatus
from gpuflow.store.tables import QueueEntryRow
from gpuflow.workflows.queue_models import EnqueueInput
from tests.unit.cli.conftest import Cli, lines_fit

NOW = datetime.now(UTC)


def test_ps_lists_the_jobs_of_one_queue(cli: Cli) -> None:
    apply_queue(cli.store, QueueSpec(name="research", gpus={"A100": 8}))
    cli.job("mine", JobStatus.RUNNING, suffix="000001", hosts=["b"], queue="research")
    cli.job("done", JobStatus.DONE, suffix="000002", queue="research", ended_minutes_ago=1)
    cli.job("named", JobStatus.RUNNING, suffix="000003", hosts=["b"], queue="default")
    cli.job("older", JobStatus.RUNNING, suffix="000004", hosts=["b"])  # its spec names none

    out = cli("ps", "--queue", "research")
    lines_fit(out)
    assert "mine" in out and "named" not in out and "older" not in out and "done" not in out
    listed = json.loads(cli("ps", "-a", "-q", "research", "--json"))
    assert sorted(job["name"] for job in listed) == ["done", "mine"]
    assert {job["queue"] for job in listed} == {"research"}
    assert sorted(j["name"] for j in json.loads(cli("ps", "-q", "default", "--json"))) == [
        "named",
        "older",
    ]
    assert len(json.loads(cli("ps", "--json"))) == 3  # every queue's running jobs

    apply_queue(cli.store, QueueSpec(name="idle", gpus={"A100": 1}))
    assert cli("ps", "-q", "idle").strip() == (
        "no jobs running in queue idle (gpuflow ps -a shows all)"
    )
    out = cli("ps", "-q", "nope", code=1)
    assert 'queue "nope" does not exist; known: default, idle, research' in out
    assert "must start with a letter" in cli("ps", "-q", "Bad_Name", code=1)


def test_apply_queue_and_priority_flags_override_the_file(cli: Cli) -> None:
    cli.fleet(
        "type: fleet\nname: lab\nkind: sim\nhosts:\n"
        "  - name: box\n    gpus: [{name: A100, memory: 80GB, count: 2}]\n"
    )
    apply_queue(cli.store, QueueSpec(name="research", gpus={"A100": 8}))
    path = cli.write("a.yaml", "name: a\ncommands: [x]\nresources: {gpu: A100:1}\nqueue: nope\n")
    cli("apply", "-y", "-d", "-f", path, "--queue", "research", "--priority", "70")
    (job_id,) = cli.temporal.started
    spec = cli.temporal.row(job_id).spec
    assert (spec["queue"], spec["priority"]) == ("research", 70)
    assert "--priority: 101 is not a priority; use 0..100" in cli(
        "apply", "-y", "-d", "-f", path, "--priority", "101", code=1
    )
    assert "--queue: queue name 'Bad'" in cli("apply", "-y", "-d", "-f", path, "-q", "Bad", code=1)
    assert 'queue "nope" does not exist' in cli("apply", "-y", "-d", "-f", path, code=1)
    assert len(cli.temporal.started) == 1


def test_set_priority_tells_the_workflow_and_reorders_the_entry(cli: Cli) -> None:
    cli.fleet(
        "type: fleet\nname: lab\nkind: sim\nhosts:\n"
        "  - name: box\n    gpus: [{name: A100, memory: 80GB, count: 1}]\n"
    )
    path = cli.write("a.yaml", "name: a\ncommands: [x]\nresources: {gpu: A100:1}\n")
    cli("apply", "-y", "-d", "-f", path)
    (job_id,) = cli.temporal.started
    spec = JobSpec.model_validate(cli.temporal.row(job_id).spec)
    with cli.store.placement_transaction() as session:  # what its workflow's first step does
        ask = EnqueueInput(job_id=job_id, attempt=1, spec=spec, submitted_at=NOW, may_wait=False)
        enqueue_in(session, ask)
    wakes = cli.temporal.admission_wakes

    out = cli("set-priority", "a", "70")
    assert out.strip() == f"a ({job_id}): priority 0 -> 70 in queue default"
    assert (job_id, "set_priority:70") in cli.temporal.signals
    assert cli.temporal.admission_wakes == wakes + 1
    with cli.store.read() as session:
        entry = session.get(QueueEntryRow, job_id)
        assert entry is not None and entry.priority == 70
    (listed,) = json.loads(cli("ps", "--json"))
    assert listed["priority"] == 70
    assert json.loads(cli("set-priority", job_id, "70", "--json"))["priority"] == 70

    assert "0..100" in cli("set-priority", "a", "101", code=1)
    assert "-5 is not a priority; use 0..100" in cli("set-priority", "a", "-5", code=1)
    assert "no job named 'nope'" in cli("set-priority", "nope", "1", code=1)
    cli.job("old", JobStatus.DONE, suffix="000009", ended_minutes_ago=1)
    assert "job old already ended (done): nothing to reorder" in cli(
        "set-priority", "old", "1", code=1
    )


def test_ps_says_when_admission_is_held(cli: Cli) -> None:
    """Held, no pass runs: the reasons ps shows are the last pass's, and nothing starts."""
    cli.job("w", JobStatus.PENDING, message="waiting for capacity: box: 0 of 8 GPUs free")
    out, err = cli.streams("ps")
    assert "w" in out and "admission is held" not in err
    cli.temporal.held = True
    out, err = cli.streams("ps", "--json")
    assert json.loads(out)[0]["name"] == "w"  # stdout stays one document
    assert " ".join(err.split()).startswith(
        "admission is held (gpuflow down, or Client.hold_admission): no waiting job starts"
    )
