"""The fleets' listing in pages: a big fleet in one answer would pass Temporal's payload limit
(about 700 bytes a host with 8 GPUs; 2 MiB at most), so the client reads HOSTS_PER_PAGE hosts
at a time and puts each fleet back together."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpuflow.client import Client
from gpuflow.client.models import FleetInfo
from gpuflow.control import api as control_api
from gpuflow.control.api import ApiActivities
from gpuflow.payloads import DATA_CONVERTER
from gpuflow.services.fleets import apply_fleet
from gpuflow.specs import FleetSpec
from gpuflow.store.db import Store
from gpuflow.workflows.api_fleets import HOSTS_PER_PAGE, FleetsPage
from tests.local_api import LocalApi

pytestmark = pytest.mark.asyncio(loop_scope="session")


def _fleet(name: str, hosts: int) -> FleetSpec:
    declared = [
        {"name": f"{name}-{i:04d}", "gpus": [{"name": "A100", "memory": "80GB", "count": 8}]}
        for i in range(hosts)
    ]
    return FleetSpec.model_validate(
        {"type": "fleet", "name": name, "kind": "sim", "hosts": declared}
    )


class CountingApi(LocalApi):
    """LocalApi, keeping the size of each answer of one update: the hosts of `fleets` unless
    told otherwise (`jobs`: the jobs)."""

    def __init__(self, activities: ApiActivities, update: str = "fleets") -> None:
        super().__init__(activities)
        self.counted = update
        self.pages: list[int] = []

    async def call(self, update: str, arg: Any, result_type: Any, **kw: Any) -> Any:
        found = await super().call(update, arg, result_type, **kw)
        if update == self.counted:
            hosts = update == "fleets"
            self.pages.append(sum(len(r.hosts) for r in found) if hosts else len(found))
        return found


async def test_fleets_are_read_in_pages_and_put_back_together(
    sqlite_store: Store, tmp_path: Path
) -> None:
    sizes = {"a": HOSTS_PER_PAGE + 200, "b": 1, "c": HOSTS_PER_PAGE - 50}
    for name, hosts in sizes.items():
        apply_fleet(sqlite_store, _fleet(name, hosts))
    activities = ApiActivities(sqlite_store, None, home=tmp_path)  # type: ignore[arg-type]
    api = CountingApi(activities)
    client = Client(temporal=None, api=api)  # type: ignore[arg-type]

    fleets = await client.fleets()

    whole = await activities.fleets(FleetsPage())  # every host in one answer, as before pages
    assert [f.model_dump() for f in fleets] == [
        FleetInfo.from_record(r).model_dump() for r in whole
    ]
    assert {f.name: len(f.hosts) for f in fleets} == sizes
    assert [host["name"] for host in fleets[0].hosts] == [f"a-{i:04d}" for i in range(sizes["a"])]
    assert api.pages == [HOSTS_PER_PAGE, HOSTS_PER_PAGE, sum(sizes.values()) - 2 * HOSTS_PER_PAGE]


async def test_a_page_holds_the_fleets_its_hosts_belong_to(
    sqlite_store: Store, tmp_path: Path
) -> None:
    for name, hosts in (("a", 3), ("b", 2), ("c", 4)):
        apply_fleet(sqlite_store, _fleet(name, hosts))
    activities = ApiActivities(sqlite_store, None, home=tmp_path)  # type: ignore[arg-type]

    async def page(**kw: Any) -> list[tuple[str, list[str]]]:
        found = await activities.fleets(FleetsPage(**kw))
        return [(r.name, [h["name"] for h in r.hosts]) for r in found]

    assert await page(after=2, most=3) == [("a", ["a-0002"]), ("b", ["b-0000", "b-0001"])]
    assert await page(after=5, most=3) == [("c", ["c-0000", "c-0001", "c-0002"])]
    assert await page(after=8, most=3) == [("c", ["c-0003"])]
    assert await page(after=9, most=3) == []
    assert await page(fleet="c", after=1, most=2) == [("c", ["c-0001", "c-0002"])]


async def test_applying_a_big_fleet_answers_every_host(
    sqlite_store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The apply answers the fleet's first page; the client reads the rest."""

    async def no_health_checks(temporal: Any, fleet: str) -> None:
        return None

    monkeypatch.setattr(control_api, "watch_fleet", no_health_checks)
    apply_fleet(sqlite_store, _fleet("before", 2))  # another fleet, listed first: not in it
    activities = ApiActivities(sqlite_store, None, home=tmp_path)  # type: ignore[arg-type]
    api = CountingApi(activities)
    client = Client(temporal=None, api=api)  # type: ignore[arg-type]

    applied = await client.apply_fleet(_fleet("big", 2 * HOSTS_PER_PAGE + 10))

    assert applied.name == "big"
    assert [h["name"] for h in applied.hosts] == [
        f"big-{i:04d}" for i in range(2 * HOSTS_PER_PAGE + 10)
    ]
    assert api.pages == [HOSTS_PER_PAGE, 10]  # after the apply's own first page


class UnpagedApi(CountingApi):
    """A control worker from before pages: `fleets` answers every host, whatever it is asked."""

    async def call(self, update: str, arg: Any, result_type: Any, **kw: Any) -> Any:
        if update == "fleets":
            arg = FleetsPage()
        return await super().call(update, arg, result_type, **kw)


async def test_a_control_worker_without_pages_is_read_once(
    sqlite_store: Store, tmp_path: Path
) -> None:
    """A client newer than the control worker (an upgrade under way) must not ask forever for
    the next page of a listing that comes whole each time."""
    for name, hosts in (("a", HOSTS_PER_PAGE + 200), ("b", 3)):
        apply_fleet(sqlite_store, _fleet(name, hosts))
    api = UnpagedApi(ApiActivities(sqlite_store, None, home=tmp_path))  # type: ignore[arg-type]
    client = Client(temporal=None, api=api)  # type: ignore[arg-type]

    fleets = await client.fleets()

    assert {f.name: len(f.hosts) for f in fleets} == {"a": HOSTS_PER_PAGE + 200, "b": 3}
    assert api.pages == [HOSTS_PER_PAGE + 203]


async def test_a_page_out_of_range_is_refused() -> None:
    with pytest.raises(ValueError):
        FleetsPage(after=-1)
    with pytest.raises(ValueError):
        FleetsPage(most=0)


PAYLOAD_WARNING_BYTES = 512 * 1024
"""Temporal warns of a payload over this (and refuses one over 2 MiB)."""


def _big_host(i: int) -> dict[str, Any]:
    """A host of a real-looking big fleet: a long name, 8 GPUs with their capability, a driver,
    a few labels of its own and a taint."""
    return {
        "name": f"training-cluster-east-gpu-node-{i:05d}",
        "gpus": [{"name": "A100", "memory": "80GB", "count": 8, "compute_capability": "8.0"}],
        "driver_version": "550.54.15",
        "labels": {"rack": f"rack-{i // 32:03d}", "row": f"row-{i // 256}"},
        "taints": ["dedicated=training"],
    }


async def test_a_full_page_of_big_hosts_stays_under_temporals_warning(
    sqlite_store: Store, tmp_path: Path
) -> None:
    """Every field of a host, its labels and taints too, in a page Temporal takes quietly; the
    fleet's labels, which every host has, come once and not once a host."""
    shared = {f"example.com/team-label-{k}": "x" * 200 for k in range(20)}  # 4 KB a host
    spec = {"type": "fleet", "name": "big", "kind": "sim", "labels": shared}
    spec["hosts"] = [_big_host(i) for i in range(HOSTS_PER_PAGE)]
    apply_fleet(sqlite_store, FleetSpec.model_validate(spec))
    activities = ApiActivities(sqlite_store, None, home=tmp_path)  # type: ignore[arg-type]

    (record,) = await activities.fleets(FleetsPage(most=HOSTS_PER_PAGE))

    assert len(record.hosts) == HOSTS_PER_PAGE
    assert len(DATA_CONVERTER.payload_converter.to_payloads([[record]])[0].data) < (
        PAYLOAD_WARNING_BYTES
    )
    assert record.common_labels == shared
    host = FleetInfo.from_record(record).hosts[33]
    assert host["labels"] == {**shared, "rack": "rack-001", "row": "row-0"}
    assert host["taints"] == ["dedicated=training"]


async def test_a_hosts_own_value_of_a_fleet_label_is_its_own(
    sqlite_store: Store, tmp_path: Path
) -> None:
    spec = _fleet("f", 3).model_dump(mode="json")
    spec["labels"] = {"zone": "eu-1", "team": "ml"}
    spec["hosts"][1]["labels"] = {"zone": "eu-2"}
    apply_fleet(sqlite_store, FleetSpec.model_validate(spec))
    activities = ApiActivities(sqlite_store, None, home=tmp_path)  # type: ignore[arg-type]
    client = Client(temporal=None, api=LocalApi(activities))  # type: ignore[arg-type]

    (fleet,) = await client.fleets()

    assert [h["labels"] for h in fleet.hosts] == [
        {"zone": "eu-1", "team": "ml"},
        {"zone": "eu-2", "team": "ml"},
        {"zone": "eu-1", "team": "ml"},
    ]
