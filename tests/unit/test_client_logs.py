"""A log read cut short: by the caller's cancellation (Ctrl-C, SIGTERM: `gpuflow logs -f`
ended with a 60-line traceback and exit 1 when no output was coming), or by a host that does
not answer."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from temporalio.client import WorkflowUpdateRPCTimeoutOrCancelledError

from gpuflow.client.logs import _read_log
from gpuflow.errors import GpuflowError
from gpuflow.workflows.models import LogsInput

pytestmark = pytest.mark.asyncio(loop_scope="session")


class _Reader:
    """Waits as a read of a quiet log does; cancelled, it raises what temporalio raises."""

    def __init__(self, wait_s: float) -> None:
        self.wait_s = wait_s

    async def read(self, task_queue: str, logs: LogsInput) -> Any:
        try:
            await asyncio.sleep(self.wait_s)
        except asyncio.CancelledError:
            raise WorkflowUpdateRPCTimeoutOrCancelledError() from None
        raise WorkflowUpdateRPCTimeoutOrCancelledError()  # the RPC's own timeout


async def test_a_read_cancelled_by_its_caller_is_a_cancellation() -> None:
    reading = asyncio.ensure_future(_read_log(_Reader(30), "quiet", "q", LogsInput(job_id="j")))  # type: ignore[arg-type]
    await asyncio.sleep(0.05)
    reading.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reading


async def test_a_read_that_timed_out_is_one_line() -> None:
    with pytest.raises(GpuflowError, match="the log of node 0 did not come back in time"):
        await _read_log(_Reader(0), "quiet", "q", LogsInput(job_id="j"))  # type: ignore[arg-type]
