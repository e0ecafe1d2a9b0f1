"""The client's API call under the server's limit of updates in flight per workflow, spread
over the API's lanes."""

from __future__ import annotations

import asyncio
import gc
from collections import Counter
from typing import Any

import pytest
from pydantic import BaseModel
from temporalio.client import WorkflowUpdateRPCTimeoutOrCancelledError
from temporalio.service import RPCError, RPCStatusCode

from gpuflow.client.api import IN_FLIGHT, LANES, TemporalApi


class Arg(BaseModel):
    value: int = 0


class _Temporal:
    """Refuses the first `refusals` updates as the server does at its limit; counts how many
    are in flight at once."""

    def __init__(
        self,
        refusals: int,
        status: RPCStatusCode,
        message: str = "limit on number of concurrent in-flight updates",
    ) -> None:
        self.refusals, self.status, self.message = refusals, status, message
        self.calls = self.in_flight = self.most = 0
        self.lanes: Counter[str] = Counter()  # in flight per API workflow
        self.most_per_lane: Counter[str] = Counter()

    async def execute_update_with_start_workflow(
        self, update: str, arg: Arg, *, start_workflow_operation: Any, **_: Any
    ) -> int:
        lane = start_workflow_operation._start_workflow_input.id  # the API workflow it goes to
        self.calls += 1
        self.in_flight += 1
        self.lanes[lane] += 1
        self.most = max(self.most, self.in_flight)
        self.most_per_lane[lane] = max(self.most_per_lane[lane], self.lanes[lane])
        try:
            await asyncio.sleep(0.01)
            if self.refusals > 0:
                self.refusals -= 1
                raise RPCError(self.message, self.status, b"")
            return arg.value
        finally:
            self.in_flight -= 1
            self.lanes[lane] -= 1


async def test_a_refusal_at_the_servers_limit_is_sent_again() -> None:
    temporal = _Temporal(refusals=3, status=RPCStatusCode.RESOURCE_EXHAUSTED)
    api = TemporalApi(temporal)  # type: ignore[arg-type]
    assert await api.call("job", Arg(value=7), int, timeout_s=10) == 7
    assert temporal.calls == 4


async def test_an_update_refused_for_a_failed_workflow_task_is_sent_again() -> None:
    """The API workflow's task failed or timed out (a control worker restarting, or too busy):
    the server refused the update before recording it, and the next task takes it."""
    refused = "Unable to perform workflow execution update due to Workflow Task in failed state."
    temporal = _Temporal(refusals=2, status=RPCStatusCode.FAILED_PRECONDITION, message=refused)
    api = TemporalApi(temporal)  # type: ignore[arg-type]
    assert await api.call("job", Arg(value=5), int, timeout_s=10) == 5
    assert temporal.calls == 3
    other = _Temporal(refusals=1, status=RPCStatusCode.FAILED_PRECONDITION, message="other")
    with pytest.raises(RPCError):
        await TemporalApi(other).call("job", Arg(), int, timeout_s=10)  # type: ignore[arg-type]
    assert other.calls == 1


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
    # Every lane is used, none beyond the server's limit of updates in flight per workflow.
    assert len(temporal.most_per_lane) == LANES > 1
    assert max(temporal.most_per_lane.values()) == IN_FLIGHT
    assert temporal.most == IN_FLIGHT * LANES


async def test_one_request_at_a_time_uses_the_first_lane_only() -> None:
    temporal = _Temporal(refusals=0, status=RPCStatusCode.OK)
    api = TemporalApi(temporal, workflow_id="gpuflow-api")  # type: ignore[arg-type]
    for k in range(5):
        assert await api.call("job", Arg(value=k), int) == k
    assert set(temporal.most_per_lane) == {"gpuflow-api"}


class _Slow:
    """An update that has not answered when its caller gives up; cancelled, it fails as
    the SDK's does (and so does the start that came with it)."""

    async def execute_update_with_start_workflow(
        self, update: str, arg: Arg, *, start_workflow_operation: Any, **_: Any
    ) -> int:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            failure = WorkflowUpdateRPCTimeoutOrCancelledError()
            start_workflow_operation._workflow_handle.set_exception(failure)
            raise failure from None
        return 0


async def test_a_call_its_caller_gives_up_on_leaves_no_exception_unretrieved() -> None:
    loop = asyncio.get_running_loop()
    told: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _, context: told.append(context))
    api = TemporalApi(_Slow())  # type: ignore[arg-type]
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(api.call("job", Arg(), int, timeout_s=10), 0.05)
    await asyncio.sleep(0.05)
    gc.collect()  # an exception nobody read is reported when its future is collected
    await asyncio.sleep(0)
    assert [context["message"] for context in told] == []


class _TimedOut:
    """The update's RPC timed out and the SDK set the start that came with it cancelled
    (seen in CI): the call must still end in ConnectionFailed, not in that cancellation."""

    def __init__(self, start_cancelled: bool) -> None:
        self.start_cancelled = start_cancelled

    async def execute_update_with_start_workflow(
        self, update: str, arg: Arg, *, start_workflow_operation: Any, **_: Any
    ) -> int:
        handle = start_workflow_operation._workflow_handle
        if self.start_cancelled:
            handle.cancel()
        else:
            handle.set_exception(WorkflowUpdateRPCTimeoutOrCancelledError())
        raise WorkflowUpdateRPCTimeoutOrCancelledError()


@pytest.mark.parametrize("start_cancelled", [True, False])
async def test_a_timed_out_call_is_connection_failed_whatever_became_of_its_start(
    start_cancelled: bool,
) -> None:
    from gpuflow.errors import ConnectionFailed

    loop = asyncio.get_running_loop()
    told: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _, context: told.append(context))
    api = TemporalApi(_TimedOut(start_cancelled))  # type: ignore[arg-type]
    with pytest.raises(ConnectionFailed, match="did not answer within 2s"):
        await api.call("job", Arg(), int, timeout_s=2)
    await asyncio.sleep(0.05)
    gc.collect()
    await asyncio.sleep(0)
    assert [context["message"] for context in told] == []
