"""A refused job's reasons on a big fleet: one line per host and option while that is short,
one line per reason past MAX_REASON_LINES, so a refusal of thousands of hosts and several options
stays far under Temporal's 2 MiB payload limit and still says why for every host."""

from __future__ import annotations

import json
from typing import Any

from gpuflow.control.activities import ControlActivities
from gpuflow.scheduler import apply_placement, place
from gpuflow.scheduler.model import Unschedulable
from gpuflow.services.capacity import read_snapshot
from gpuflow.services.fleets import apply_fleet
from gpuflow.services.verdicts import MAX_REASON_LINES, no_fit_lines
from gpuflow.specs import FleetSpec, JobSpec
from gpuflow.store.db import Store
from gpuflow.workflows.models import PlaceInput


def _fleet(hosts: int) -> FleetSpec:
    declared: list[dict[str, Any]] = [
        {"name": f"node-{i:05d}", "gpus": [{"name": "A100", "memory": "80GB", "count": 8}]}
        for i in range(hosts)
    ]
    declared[7]["gpus"] = [{"name": "L4", "memory": "24GB", "count": 2}]
    return FleetSpec.model_validate(
        {"type": "fleet", "name": "f", "kind": "sim", "hosts": declared}
    )


def _tries(store: Store, job: JobSpec, hosts: int) -> list[tuple[JobSpec, Any]]:
    apply_fleet(store, _fleet(hosts))
    with store.read() as session:
        snapshot = read_snapshot(session)
    return [(option, place(option, snapshot)) for option in job.resource_options()]


JOB = JobSpec(
    name="huge",
    commands=["x"],
    resources={"gpu": "A100:16"},
    alternatives=[{"gpu": "A100:12"}, {"gpu": "H100:1"}],
)


def test_a_small_fleet_gets_a_line_per_host_and_option(sqlite_store: Store) -> None:
    tries = _tries(sqlite_store, JOB, 8)
    assert all(isinstance(found, Unschedulable) for _, found in tries)
    lines = no_fit_lines(tries)
    assert lines == [
        f"option {k} ({o.resources.gpu_label}): {line}"
        for k, (o, found) in enumerate(tries, start=1)
        for line in found.lines
    ]
    assert len(lines) == 3 * 8


def test_a_big_fleet_gets_a_line_per_reason_naming_the_first_hosts(sqlite_store: Store) -> None:
    hosts = MAX_REASON_LINES  # three options: three times as many lines as the limit
    tries = _tries(sqlite_store, JOB, hosts)
    per_host = [line for _, found in tries for line in found.lines]
    lines = no_fit_lines(tries)
    assert len(per_host) == 3 * hosts
    assert len(lines) < 12
    assert len(json.dumps(lines)) < 4_000
    # every host is counted under its option's reasons, and every reason is there
    for k, (_, found) in enumerate(tries, start=1):
        mine = [line for line in lines if line.startswith(f"option {k} ")]
        counted = 0
        for line in mine:
            head = line.split(": ", 1)[1]
            counted += int(head.split(" hosts")[0].replace(",", "")) if " hosts (" in head else 1
        assert counted == len(found.rejections)
        assert {r.reason for r in found.rejections} == {line.rsplit(": ", 1)[1] for line in mine}
    assert any(
        f"{hosts - 1:,} hosts (node-00000, node-00001, node-00002, ...)" in line for line in lines
    )
    assert any("node-00007: " in line for line in lines)  # the only L4 host: its own reason


async def test_the_place_step_of_older_jobs_words_a_refusal_the_same_way(
    sqlite_store: Store,
) -> None:
    """`place_job` (the place step of jobs started before queues) answers the same lines as
    a submit's refusal: per reason on a big fleet."""
    apply_fleet(sqlite_store, _fleet(MAX_REASON_LINES + 1))
    job = JobSpec(name="huge", commands=["x"], resources={"gpu": "A100:16"})
    ask = PlaceInput(job_id="job-huge-1", attempt=1, spec=job)
    result = await ControlActivities(sqlite_store).place_job(ask)
    assert result.placement is None
    assert result.reasons == [
        f"{MAX_REASON_LINES:,} hosts (node-00000, node-00001, node-00002, ...): "
        "has 8 GPUs, job needs 16 GPUs",
        "node-00007: has L4 GPUs, job needs A100",
    ]


def test_the_hosts_busy_now_come_before_those_that_could_never_fit(sqlite_store: Store) -> None:
    """What a waiting job waits for leads its reasons (and `ps`, which shows the first): the
    A100 hosts whose GPUs are taken, not the L4 host listed before them."""
    apply_fleet(sqlite_store, _fleet(10))
    with sqlite_store.read() as session:
        snapshot = read_snapshot(session)
    taking = JobSpec(name="all", commands=["x"], resources={"gpu": "A100:8"}, nodes=9)
    held = place(taking, snapshot)
    assert not isinstance(held, Unschedulable)
    apply_placement(snapshot, held)
    job = JobSpec(name="one", commands=["x"], resources={"gpu": "A100:1"})
    found = place(job, snapshot)
    assert isinstance(found, Unschedulable)
    assert found.lines[7].startswith("node-00007: ")  # by host, the L4 host among them
    lines = no_fit_lines([(job, found)])
    assert sorted(lines) == sorted(found.lines)
    assert [line.split(":")[0] for line in lines][-1] == "node-00007"
    assert "0 of 8 GPUs free" in lines[0]
