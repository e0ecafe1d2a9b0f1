"""A request too big for Temporal is refused by the client at once, in words: sent, it would
leave the API workflow's task failing and the caller waiting for an RPC error that names
neither the file nor the limit."""

from __future__ import annotations

from typing import Any

import pytest

from gpuflow.client.api import MAX_REQUEST_BYTES, TemporalApi
from gpuflow.errors import SpecError
from gpuflow.specs import FleetSpec
from gpuflow.specs.fleet import MAX_HOSTS


class _Temporal:
    def __init__(self) -> None:
        self.calls = 0

    async def execute_update_with_start_workflow(self, update: str, arg: Any, **_: Any) -> str:
        self.calls += 1
        return "applied"


def _fleet(hosts: int, labels: int) -> FleetSpec:
    return FleetSpec.model_validate(
        {
            "type": "fleet",
            "name": "big",
            "kind": "sim",
            "hosts": [
                {
                    "name": f"training-cluster-east-gpu-node-{i:05d}",
                    "gpus": [{"name": "A100", "memory": "80GB", "count": 8}],
                    "cpus": 96,
                    "memory": "1024GB",
                    "labels": {f"label-{k}": f"value-{k}-{i // 32:04d}" for k in range(labels)},
                }
                for i in range(hosts)
            ],
        }
    )


async def test_a_fleet_too_big_for_one_request_is_refused_before_it_is_sent() -> None:
    spec = _fleet(MAX_HOSTS, labels=4)  # valid: within every limit of a fleet file
    temporal = _Temporal()
    api = TemporalApi(temporal)  # type: ignore[arg-type]
    with pytest.raises(SpecError, match=r"apply fleet: the request is 2\.\d MB, more than the "):
        await api.call("apply_fleet", spec, str, timeout_s=5)
    assert temporal.calls == 0


async def test_a_big_fleet_that_fits_is_sent() -> None:
    spec = _fleet(MAX_HOSTS, labels=0)
    assert len(spec.model_dump_json()) <= MAX_REQUEST_BYTES
    temporal = _Temporal()
    api = TemporalApi(temporal)  # type: ignore[arg-type]
    assert await api.call("apply_fleet", spec, str, timeout_s=5) == "applied"
    assert temporal.calls == 1
