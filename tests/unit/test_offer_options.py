"""The dry run of a job with resource alternatives: which option a job submitted now takes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpuflow.client import Client, taken_option
from gpuflow.control.api import ApiActivities
from gpuflow.services.fleets import apply_fleet
from gpuflow.specs import FleetSpec, JobSpec
from gpuflow.store.db import Store
from tests.local_api import LocalApi

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_a_gang_takes_the_first_option_that_places_not_the_first_that_fits(
    sqlite_store: Store, tmp_path: Path
) -> None:
    """Two nodes of 8 GPUs: h1 fits on its own, but a gang needs two such hosts, so the job
    runs with its 4-GPU alternative on h1 and h2; the plan must say so too."""
    hosts: list[dict[str, Any]] = [
        {"name": "h1", "gpus": [{"name": "A100", "memory": "80GB", "count": 8}]},
        {"name": "h2", "gpus": [{"name": "A100", "memory": "80GB", "count": 4}]},
    ]
    apply_fleet(
        sqlite_store,
        FleetSpec.model_validate({"type": "fleet", "name": "f", "kind": "sim", "hosts": hosts}),
    )
    spec = JobSpec(
        name="gang",
        commands=["x"],
        nodes=2,
        resources={"gpu": "A100:8"},
        alternatives=[{"gpu": "A100:4"}],
    )
    api = LocalApi(ApiActivities(sqlite_store, None, home=tmp_path))  # type: ignore[arg-type]
    client = Client(temporal=None, api=api)  # type: ignore[arg-type]
    per_option = await client.offers_per_option(spec)
    assert [o.gpu for o in per_option] == ["A100:8", "A100:4"]
    assert [f.host for f in per_option[0].offers.fits] == ["h1"]
    assert per_option[0].offers.placement is None
    taken = taken_option(per_option)
    assert taken is not None and taken.option == 2
    assert taken.offers.placement is not None
    assert sorted(n.host_name for n in taken.offers.placement.nodes) == ["h1", "h2"]
    assert (await client.offers(spec)) == taken.offers

    nothing = JobSpec(name="none", commands=["x"], nodes=3, resources={"gpu": "A100:4"})
    assert taken_option(await client.offers_per_option(nothing)) is None
