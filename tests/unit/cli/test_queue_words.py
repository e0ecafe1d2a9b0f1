"""Queues as QA found them said: a cohort mixing a total and per-model quotas, jobs between
attempts that `queue list` did not count, which limit of a quota holds a job, and the client's
and the CLI's refusals of one mistake in one way and one line."""

from __future__ import annotations

import asyncio
import json

import pytest

from gpuflow.cli import common
from gpuflow.errors import ConflictError, GpuflowError, NotFoundError, SpecError
from gpuflow.status import JobStatus
from gpuflow.store.tables import QueueEntryRow
from tests.unit.cli.conftest import Cli, column_rows, lines_fit

PER_MODEL = "type: queue\nname: {}\ngpus: {{A100: 4}}\ncohort: lab\n"
TOTAL = "type: queue\nname: mix\ngpus: 4\ncohort: lab\n"


def _error(output: str) -> str:
    lines = [line for line in output.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), output
    return lines[0].removeprefix("error: ")


def test_a_cohort_of_a_total_and_per_model_quotas_is_refused_in_either_order(cli: Cli) -> None:
    """Accepted before, and the total's idle quota was never lent (`queue research has no
    quota left for it` while mix had 4 unused)."""
    research = cli.write("research.yaml", PER_MODEL.format("research"))
    mix = cli.write("mix.yaml", TOTAL)
    cli("queue", "apply", "-f", research)
    line = _error(cli("queue", "apply", "-f", mix, code=1))
    assert line.startswith(
        "queue mix: the other queues of cohort lab (research) have a quota per GPU model, "
        "and a total quota shares nothing with them"
    )
    assert line.endswith("write mix's per model (gpus: {A100: 4}), or use another cohort")
    cli("queue", "delete", "research")
    cli("queue", "apply", "-f", mix)
    line = _error(cli("queue", "apply", "-f", research, code=1))
    assert line.startswith("queue research: the other queues of cohort lab (mix) have a total")
    names = [q["name"] for q in json.loads(cli("queue", "list", "--json"))]
    assert names == ["default", "mix"]
    # several files: checked together before any is applied, naming the file
    prod = cli.write("prod.yaml", PER_MODEL.format("prod").replace("lab", "pool"))
    solo = cli.write("solo.yaml", TOTAL.replace("mix", "solo").replace("lab", "pool"))
    line = _error(cli("queue", "apply", "-f", prod, "-f", solo, code=1))
    assert line.startswith(f"{solo}: queue solo: the other queues of cohort pool (prod)")
    assert "prod" not in [q["name"] for q in json.loads(cli("queue", "list", "--json"))]


def test_list_counts_jobs_between_attempts_as_delete_does(cli: Cli) -> None:
    """`WAITING 0 RUNNING 0` for a queue whose job was retrying, which delete refused as
    holding 1 job."""
    cli("queue", "apply", "-f", cli.write("research.yaml", PER_MODEL.format("research")))
    cli.job("r1", JobStatus.PENDING, queue="research")  # between attempts: no entry
    out = cli("queue", "list")
    lines = lines_fit(out)
    assert lines[2].split() == ["research", "lab", "A100:4", "0", "0", "0", "0", "0"]
    assert " ".join(" ".join(lines[3:]).split()) == (
        "research: 1 job(s) between attempts (retrying), neither waiting nor running now"
    )
    (_, research) = json.loads(cli("queue", "list", "--json"))
    assert (research["waiting"], research["running"], research["between_attempts"]) == (0, 0, 1)
    line = _error(cli("queue", "delete", "research", code=1))
    assert "(0 waiting, 0 running, 1 between attempts)" in line

    async def listed() -> None:
        client = await common.open_client()
        (_, info) = await client.list_queues()
        assert (info.between_attempts, info.running, info.admitted) == (1, 0, 0)

    asyncio.run(listed())


def test_ps_says_which_limit_of_a_quota_holds_a_job(cli: Cli) -> None:
    """It said `no capacity: queue research's quota is used too (A100:4 of A100:4)`, or only
    `over quota`."""
    words = "quota: research uses A100:6 = its 4 + borrowing_limit 2 and needs 2 more"
    message = f"waiting for capacity: {words}; box: 0 of 8 GPUs free, needs 2; vm: not ready"
    jobs = {
        reason: cli.job(f"j{k}", JobStatus.PENDING, suffix=f"00000{k}", message=message)
        for k, reason in enumerate(("no_capacity", "quota"))
    }
    with cli.store.session() as session:
        for position, (reason, job_id) in enumerate(jobs.items()):
            session.add(
                QueueEntryRow(
                    job_id=job_id,
                    attempt=1,
                    name=job_id,
                    queue="research",
                    state="waiting",
                    position=position,
                    reason=reason,
                )
            )
        session.commit()
    data = {j["id"]: j["waiting"]["reason"] for j in json.loads(cli("ps", "--json"))}
    assert data == dict.fromkeys(jobs.values(), words + " (+2 more)")
    shown = [" ".join(row.split()) for row in column_rows(cli("ps"), "WHERE / WHY")]
    assert sorted(shown) == [f"research/#{k} {words} (+2 more)" for k in (1, 2)]


def test_a_queue_given_as_its_fields_is_refused_without_a_repeated_prefix(cli: Cli) -> None:
    async def session() -> None:
        client = await common.open_client()
        # it said `queue: queue cq: ...`
        with pytest.raises(SpecError) as refused:
            await client.apply_queue({"name": "cq", "gpus": 2, "lending_limit": 1})
        assert str(refused.value) == "queue cq: lending_limit needs a `cohort` to share with"
        with pytest.raises(SpecError) as refused:
            await client.apply_queue({"name": "cq", "gpus": -1})
        assert str(refused.value) == "queue cq: gpus: must be 0..1000000 GPUs, not -1"
        # a mapping may leave out `type`, as apply_fleet's and QueueSpec do (a file says it)
        assert (await client.apply_queue({"name": "cq", "gpus": 2})).created

    asyncio.run(session())


def test_a_malformed_queue_name_is_refused_with_the_naming_rule_everywhere(cli: Cli) -> None:
    """delete_queue said NotFoundError, jobs(queue=...) SpecError quoting the rule."""

    async def session() -> None:
        client = await common.open_client()
        for call in (client.delete_queue("Bad_Name"), client.jobs(queue="Bad_Name")):
            with pytest.raises(SpecError, match=r"^queue name 'Bad_Name' must start with"):
                await call
        with pytest.raises(NotFoundError, match=r'^queue "nope" does not exist'):
            await client.delete_queue("nope")

    asyncio.run(session())
    line = _error(cli("queue", "delete", "Bad_Name", code=1))
    assert line.startswith("queue name 'Bad_Name' must start with a letter")


def test_reordering_an_ended_job_is_a_conflict_not_a_spec_error(cli: Cli) -> None:
    ended = cli.job("old", JobStatus.DONE, ended_minutes_ago=1)

    async def session() -> None:
        client = await common.open_client()
        with pytest.raises(GpuflowError) as refused:
            await client.set_priority(ended, 5)
        assert isinstance(refused.value, ConflictError)
        assert not isinstance(refused.value, SpecError)
        assert str(refused.value) == "job old already ended (done): nothing to reorder"

    asyncio.run(session())


def test_set_priority_refuses_a_word_in_one_line(cli: Cli) -> None:
    """Typer refused `abc` with a box of several lines."""
    cli.job("a", JobStatus.PENDING)
    line = _error(cli("set-priority", "a", "abc", code=1))
    assert line == "priority: 'abc' is not a priority; use a whole number, 0..100"
    assert _error(cli("set-priority", "a", "1.5", code=1)).startswith("priority: '1.5' is not")
    assert "-5 is not a priority; use 0..100" in _error(cli("set-priority", "a", "-5", code=1))
    assert "A whole number, 0..100" in " ".join(cli("set-priority", "--help").split())


def test_a_quota_out_of_bounds_names_its_field_once(cli: Cli) -> None:
    path = cli.write("bad.yaml", "type: queue\nname: x\ngpus: -1\n")
    line = _error(cli("queue", "apply", "-f", path, code=1))
    assert line == f"{path}: gpus: must be 0..1000000 GPUs, not -1"
