"""The client's API call under the server's limit of updates in flight per workflow."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic import BaseModel
from temporalio.service import RPCError, RPCStatusCode

from gpuflow.client.api import IN_FLIGHT, TemporalApi


class Arg(BaseModel):
    value: int = 0


class _Temporal:
    """Refuses the first `refusals` updates as the server does at its limit; counts how many
    are in flight at once."""

    def __init__(self, refusals: int, status: RPCStatusCode) -> None:
        self.refusals, self.status = refusals, status
        self.calls = self.in_flight = self.most = 0

    async def execute_update_with_start_workflow(self, update: str, arg: Arg, **_: Any) -> int:
        self.calls += 1
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        try:
            await asyncio.sleep(0.01)
            if self.refusals > 0:
                self.refusals -= 1
                raise RPCError("limit on number of concurrent in-flight updates", self.status, b"")
            return arg.value
        finally:
            self.in_flight -= 1


async def test_a_refusal_at_the_servers_limit_is_sent_again() -> None:
    temporal = _Temporal(refusals=3, status=RPCStatusCode.RESOURCE_EXHAUSTED)
    api = TemporalApi(temporal)  # type: ignore[arg-type]
    assert await api.call("job", Arg(value=7), int, timeout_s=10) == 7
    assert temporal.calls == 4


async def test_other_errors_are_not_retried() -> None:
    temporal = _Temporal(refusals=1, status=RPCStatusCode.PERMISSION_DENIED)
    api = TemporalApi(temporal)  # type: ignore[arg-type]
    with pytest.raises(RPCError):
        await api.call("job", Arg(), int, timeout_s=10)
    assert temporal.calls == 1


async def test_one_client_keeps_its_requests_under_the_limit() -> None:
    temporal = _Temporal(refusals=0, status=RPCStatusCode.OK)
    api = TemporalApi(temporal)  # type: ignore[arg-type]
    results = await asyncio.gather(*(api.call("job", Arg(value=k), int) for k in range(40)))
    assert results == list(range(40))
    assert temporal.most == IN_FLIGHT
