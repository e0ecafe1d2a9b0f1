"""How the client calls the control plane's API workflow (gpuflow/workflows/api.py).

Each call is an update-with-start of one of the API's lanes: `gpuflow-api`, and `gpuflow-api-1`
.. `gpuflow-api-3` for requests a client has in flight beside it. The first client to call a
lane starts its workflow (USE_EXISTING), every later one finds it. A request the control plane
refuses (a validator's refusal, an unknown fleet, no such job) comes back as the gpuflow error
it raised, one line.
"""

from __future__ import annotations

import asyncio
import random
import time
from datetime import timedelta
from typing import Any, Protocol, TypeVar

from pydantic import BaseModel
from temporalio.client import Client as TemporalClient
from temporalio.client import (
    WithStartWorkflowOperation,
    WorkflowUpdateFailedError,
    WorkflowUpdateRPCTimeoutOrCancelledError,
)
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from gpuflow import errors
from gpuflow.naming import CONTROL_TASK_QUEUE
from gpuflow.workflows.api import API_WORKFLOW_ID
from gpuflow.workflows.api_expiry import EXPIRY_MARGIN_S, call_id

R = TypeVar("R")

API_TIMEOUT_S = 60.0
"""How long a request waits for a control worker to answer: an update waits for a worker
without limit, and a user waiting for one that is down deserves a line saying so."""


class Api(Protocol):
    """The seam between the client and the control plane (a test may answer it in-process)."""

    async def call(
        self, update: str, arg: BaseModel, result_type: type[R], *, timeout_s: float = ...
    ) -> R: ...


def _as_gpuflow_error(exc: WorkflowUpdateFailedError) -> errors.GpuflowError:
    cause: BaseException | None = exc.cause
    while cause is not None and not isinstance(cause, ApplicationError):
        cause = cause.__cause__ or getattr(cause, "cause", None)
    if cause is None:
        return errors.GpuflowError(f"the control plane could not answer: {exc.cause}")
    return error_from(cause)


def error_from(cause: ApplicationError) -> errors.GpuflowError:
    """The gpuflow error the control plane raised (its type travels as the failure's type)."""
    kind = getattr(errors, cause.type or "", None)
    if isinstance(kind, type) and issubclass(kind, errors.GpuflowError):
        if kind is errors.UnschedulableError:
            return errors.UnschedulableError(cause.message, [])
        return kind(cause.message)
    return errors.GpuflowError(cause.message)


MAX_REQUEST_BYTES = 2 * 1024 * 1024 - 64 * 1024
"""The largest request sent: Temporal refuses a payload over 2 MiB (the request travels as one,
to the API workflow and on to its activity), and leaves a workflow task failing over it. A
bigger one is refused here, at once and in words."""
_SPLIT_HINT = {"apply_fleet": "; split its hosts over several fleet files"}

BACKSTOP_S = 5.0
"""After the RPC timeout, how long more the whole call may take before it is cut off."""
IN_FLIGHT = 8
"""Requests one client has in flight at once on one lane: under the server's default limit of
10 updates in flight per workflow, which refuses the rest (many `wait`s at once, say)."""
LANES = 4
"""API workflows a client spreads its requests over: a lane's updates are one workflow's, run
one workflow task at a time and at most 10 at once, so one lane caps a burst of submits. A
client with one request at a time only ever uses the first lane, `gpuflow-api`."""


def _check_size(update: str, arg: BaseModel) -> None:
    """Refuse a request that Temporal would refuse (see MAX_REQUEST_BYTES)."""
    size = len(arg.__pydantic_serializer__.to_json(arg))  # what the data converter sends
    if size > MAX_REQUEST_BYTES:
        raise errors.SpecError(
            f"{update.replace('_', ' ')}: the request is {size / 1e6:.1f} MB, more than the "
            f"{MAX_REQUEST_BYTES / 1e6:.1f} MB Temporal takes in one payload"
            + _SPLIT_HINT.get(update, "")
        )


class _Lane:
    """One API workflow and this client's requests to it."""

    def __init__(self, workflow_id: str) -> None:
        self.workflow_id = workflow_id
        self.in_flight = asyncio.Semaphore(IN_FLIGHT)
        self.asked = 0
        """Requests in flight or waiting for room on this lane."""


class TemporalApi:
    """The API over Temporal: the client's only path to the control plane."""

    def __init__(
        self,
        temporal: TemporalClient,
        *,
        task_queue: str = CONTROL_TASK_QUEUE,
        workflow_id: str = API_WORKFLOW_ID,
    ) -> None:
        self.temporal = temporal
        self.task_queue = task_queue
        self.workflow_id = workflow_id
        self._lanes = [_Lane(workflow_id if k == 0 else f"{workflow_id}-{k}") for k in range(LANES)]

    async def call(
        self, update: str, arg: BaseModel, result_type: type[R], *, timeout_s: float = API_TIMEOUT_S
    ) -> R:
        """One request, on the lane with most room. Requests of this client beyond IN_FLIGHT per
        lane wait their turn, and a request refused before the server accepted it (its limit
        of updates in flight reached by other clients' requests, or the API workflow's last
        task failed: `_refused_for_now`) is sent again after a short, growing pause, within the
        same time budget."""
        _check_size(update, arg)
        deadline = asyncio.get_running_loop().time() + timeout_s
        # No control worker takes the request up once this client stops counting on it
        # (workflows/api_expiry.py): a call reported as failed has had no effect.
        expires = time.time() + _taken_up_within(timeout_s)
        pause = 0.05
        lane = min(self._lanes, key=lambda lane: lane.asked)  # the first of equals
        lane.asked += 1
        try:
            async with lane.in_flight:
                while True:
                    try:
                        return await self._call(
                            lane.workflow_id,
                            update,
                            arg,
                            result_type,
                            timeout_s=timeout_s,
                            update_id=call_id(expires),
                        )
                    except RPCError as exc:
                        left = deadline - asyncio.get_running_loop().time()
                        if not _refused_for_now(exc) or left <= pause:
                            raise
                    await asyncio.sleep(pause * (0.5 + random.random()))
                    pause = min(pause * 2, 1.0)
        finally:
            lane.asked -= 1

    async def _call(
        self,
        workflow_id: str,
        update: str,
        arg: BaseModel,
        result_type: type[R],
        *,
        timeout_s: float,
        update_id: str | None = None,
    ) -> R:
        start: WithStartWorkflowOperation[Any, Any] = WithStartWorkflowOperation(
            "ControlApiWorkflow",
            id=workflow_id,
            task_queue=self.task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            static_summary="gpuflow's API: the client's requests to the control plane",
        )
        call = asyncio.ensure_future(
            self.temporal.execute_update_with_start_workflow(
                update,
                arg,
                start_workflow_operation=start,
                id=update_id,
                result_type=result_type,
                rpc_timeout=timedelta(seconds=timeout_s),
            )
        )
        try:
            # The RPC timeout bounds each call; the whole wait is bounded too, since an update
            # accepted by a worker that then died is polled until a live one answers it.
            result: Any = await asyncio.wait_for(call, timeout_s + BACKSTOP_S)
        except asyncio.CancelledError:
            # The caller gave up (its own timeout, a cancelled task): the call and the start
            # end with errors of their own, read here so that nobody is told later of an
            # exception never retrieved.
            call.add_done_callback(_read_outcome)
            # The SDK offers only `await start.workflow_handle()`, which would cancel its
            # future were the waiting task cancelled (and the SDK then set a cancelled one);
            # a callback on that future reads it whenever the SDK settles it, or never.
            start._workflow_handle.add_done_callback(_read_outcome)
            raise
        except WorkflowUpdateFailedError as exc:
            raise _as_gpuflow_error(exc) from None
        except (WorkflowUpdateRPCTimeoutOrCancelledError, TimeoutError):
            # The start's own outcome failed with the same timeout, or the SDK set it
            # cancelled: read it whenever it settles, so it is not reported later as an
            # exception nobody retrieved. Awaiting it here would raise that cancellation.
            start._workflow_handle.add_done_callback(_read_outcome)
            raise errors.ConnectionFailed(
                f"the control plane did not answer within {timeout_s:.0f}s; a request no "
                f"control worker took up in its first {_taken_up_within(timeout_s):.0f}s is "
                "never carried out later; is a control worker running? (`gpuflow up`, or "
                "`python -m gpuflow.control.main`)"
            ) from None
        return result  # type: ignore[no-any-return]


def _taken_up_within(timeout_s: float) -> float:
    """How long after it is sent a control worker may still take a request up: the client's
    wait less EXPIRY_MARGIN_S, for the answer to come back in time (half the wait at least)."""
    return max(timeout_s - EXPIRY_MARGIN_S, timeout_s / 2)


def _read_outcome(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


TASK_FAILED = "Workflow Task in failed state"
"""What the server says of an update it refused because the API workflow's last task failed
or timed out (a control worker restarting, or too busy to answer in the task's 10 s): the
next task decides, and nothing of the refused update was recorded."""


def _refused_for_now(exc: RPCError) -> bool:
    """An update the server refused before accepting it, which the same update sent again can
    get through: its limit of updates in flight, or a failed workflow task."""
    if exc.status == RPCStatusCode.RESOURCE_EXHAUSTED:
        return True
    return exc.status == RPCStatusCode.FAILED_PRECONDITION and TASK_FAILED in exc.message


def named(value: object, what: str) -> str:
    """A name or id the caller passed, as text: a SpecError in one line for anything else
    (the request's own model would raise pydantic's error)."""
    if not isinstance(value, str):
        raise errors.SpecError(f"a {what} is named by text (str), not {type(value).__name__}")
    return value
