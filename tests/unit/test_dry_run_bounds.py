"""A dry run's answer (`offers`, `plan`) on a big fleet: at most ANSWER_LINES hosts over all its
options in each list, rejections grouped by reason past that, the totals saying what was left
out, and the verdict the same as the whole answer's. Without the bound, six options on 4,096
hosts answered 4.6 MB and a plan of three such jobs 11.3 MB: past Temporal's 2 MiB payload
limit, so `gpuflow offers` and `gpuflow apply` failed on such a fleet."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpuflow.client import Client
from gpuflow.control.api import ApiActivities
from gpuflow.errors import SpecError
from gpuflow.payloads import DATA_CONVERTER
from gpuflow.scheduler import explain
from gpuflow.scheduler.model import Rejection
from gpuflow.scheduler.offers import NAMED, by_reason
from gpuflow.scheduler.together import plan_together
from gpuflow.services.capacity import read_snapshot
from gpuflow.services.fleets import apply_fleet
from gpuflow.specs import FleetSpec, JobSpec
from gpuflow.store.db import Store
from gpuflow.workflows import api_dry_runs
from gpuflow.workflows.api_dry_runs import (
    LEAST_LINES,
    OffersRequest,
    PlanRequest,
    answer_lines,
)
from tests.unit.test_fleet_pages import CountingApi

HOSTS = 160
SMALL = 6  # hosts of the fleet with L4s: they never fit an A100 job
LINES = 120
"""ANSWER_LINES here (1,000 in the product): the bound bites on a fleet small enough to apply
fast, as it does at 1,000 on thousands of hosts."""


def _fleets(store: Store) -> None:
    big: list[dict[str, Any]] = [
        {"name": f"node-{i:04d}", "gpus": [{"name": "A100", "memory": "80GB", "count": 8}]}
        for i in range(HOSTS)
    ]
    for k in range(0, HOSTS, 7):  # some hosts smaller, for a second reason and other scores
        big[k]["gpus"] = [{"name": "A100", "memory": "80GB", "count": 2}]
    apply_fleet(store, FleetSpec.model_validate({"name": "big", "kind": "sim", "hosts": big}))
    small = [
        {"name": f"l4-{i}", "gpus": [{"name": "L4", "memory": "24GB", "count": 1}]}
        for i in range(SMALL)
    ]
    apply_fleet(store, FleetSpec.model_validate({"name": "small", "kind": "sim", "hosts": small}))


def _size(value: Any) -> int:
    payload = DATA_CONVERTER.payload_converter.to_payloads([value])[0]
    return len(payload.SerializeToString())


SIX = JobSpec(
    name="six",
    commands=["x"],
    resources={"gpu": "A100:1"},
    alternatives=[{"gpu": f"A100:{k}"} for k in (4, 8, 9, 3, 16)],
)


@pytest.fixture
def api(sqlite_store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ApiActivities:
    monkeypatch.setattr(api_dry_runs, "ANSWER_LINES", LINES)
    _fleets(sqlite_store)
    return ApiActivities(sqlite_store, None, home=tmp_path)  # type: ignore[arg-type]


async def test_offers_name_at_most_the_answer_s_lines_and_count_the_rest(
    api: ApiActivities, sqlite_store: Store
) -> None:
    with sqlite_store.read() as session:
        snapshot = read_snapshot(session)
    whole = [explain(option, snapshot) for option in SIX.resource_options()]
    found = await api.offers(OffersRequest(spec=SIX))

    most = answer_lines(6)
    assert most == LINES // 6
    for option, full in zip(found, whole, strict=True):
        offers = option.offers
        assert offers.placement == full.placement  # the verdict is the whole answer's
        assert len(offers.fits) <= most and len(offers.rejections) <= most
        if len(full.fits) > most:
            assert offers.fits == full.fits[:most]  # the best, in the whole answer's order
            assert offers.fits_total == len(full.fits)
        else:
            assert offers.fits == full.fits and offers.fits_total is None
        if len(full.rejections) > most:
            assert offers.rejections_total == len(full.rejections)
            assert sum(r.hosts for r in offers.rejections) == len(full.rejections)
            assert len({r.reason for r in offers.rejections}) == len(offers.rejections)
        else:
            assert offers.rejections == full.rejections and offers.rejections_total is None
    # A100:1 fits every big host; A100:9 and A100:16 fit none (two reasons, and the L4 fleet)
    first, nine = found[0].offers, found[3].offers
    assert first.fits_total == HOSTS and len(first.fits) == most
    assert nine.fits == [] and nine.placement is None
    assert nine.rejections_total == HOSTS + SMALL
    lines = [str(r) for r in nine.rejections]
    assert any(line.startswith(f"{HOSTS - len(range(0, HOSTS, 7)):,} hosts (") for line in lines)
    # the whole answer is several times the bounded one, which no fleet size can grow
    assert _size(found) * 3 < _size(whole)


async def test_offers_answer_the_fits_asked_for(api: ApiActivities) -> None:
    found = await api.offers(OffersRequest(spec=SIX, most=5))
    assert [len(o.offers.fits) for o in found] == [5, 5, 5, 0, 5, 0]
    assert found[0].offers.fits_total == HOSTS
    # asked for more than an answer may carry: the answer's bound holds
    found = await api.offers(OffersRequest(spec=SIX, most=10 * LINES))
    assert len(found[0].offers.fits) == answer_lines(6)


async def test_a_plan_is_bounded_over_all_its_jobs_options(
    api: ApiActivities, sqlite_store: Store
) -> None:
    jobs = [SIX.model_copy(update={"name": f"j{k}"}) for k in range(4)]
    with sqlite_store.read() as session:
        whole = plan_together(jobs, read_snapshot(session))
    found = await api.plan(PlanRequest(specs=jobs))

    most = answer_lines(24)
    assert most == max(LEAST_LINES, LINES // 24) == LEAST_LINES
    for plan, full in zip(found, whole, strict=True):
        assert plan.taken == full.taken and plan.alone == full.alone
        assert [o.placement for o in plan.options] == [o.placement for o in full.options]
        for offers in plan.options:
            assert len(offers.fits) <= most and len(offers.rejections) <= most
    assert found[0].options[0].fits_total == HOSTS


async def test_the_client_asks_for_the_fits_it_wants(api: ApiActivities) -> None:
    counting = CountingApi(api)
    client = Client(temporal=None, api=counting)  # type: ignore[arg-type]
    offers = await client.offers(SIX, most=3)
    assert len(offers.fits) == 3 and offers.fits_total == HOSTS
    with pytest.raises(SpecError, match="at least 1"):
        await client.offers_per_option(SIX, most=0)


def _rejection(host: str, reason: str) -> Rejection:
    return Rejection(host=host, filter="resources", reason=reason)


def test_by_reason_names_the_first_hosts_and_counts_the_rest() -> None:
    rejections = [_rejection(f"h{i}", f"reason {i % 3}") for i in range(10)]
    rejections.append(_rejection("alone", "its own reason"))
    lines = by_reason(rejections)
    assert [str(line) for line in lines] == [
        "4 hosts (h0, h3, h6, ...): reason 0",
        "3 hosts (h1, h4, h7): reason 1",
        "3 hosts (h2, h5, h8): reason 2",
        "alone: its own reason",
    ]
    assert NAMED == 3
    assert by_reason(lines) == lines  # grouped again: the same lines


def test_by_reason_past_most_lines_counts_the_other_reasons() -> None:
    rejections = [_rejection(f"h{i}", f"reason {i}") for i in range(50)]
    lines = by_reason(rejections, 10)
    assert len(lines) == 10
    assert lines[:9] == rejections[:9]
    assert str(lines[-1]) == "41 hosts: 41 other reasons"
    assert sum(line.hosts for line in lines) == 50
