"""The client's log reads: a node's output of a job's current attempt, followed while it runs,
or of an earlier attempt; each call through one log reader workflow (gpuflow/log_reader.py).
`Client` has them."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from temporalio.client import Client as TemporalClient
from temporalio.client import (
    WorkflowExecutionStatus,
    WorkflowUpdateFailedError,
    WorkflowUpdateRPCTimeoutOrCancelledError,
)
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError

from gpuflow.client.api import Api
from gpuflow.client.models import JobInfo, Progress
from gpuflow.errors import GpuflowError, NotFoundError
from gpuflow.log_reader import LogReader
from gpuflow.workflows.api import HostQueueRequest, HostQueueResult
from gpuflow.workflows.models import LogChunk, LogsInput

RETRY_GRACE_S = 30.0
"""How long `logs --follow` waits for a job whose attempt ended, while its workflow runs on,
to record another attempt (`gpuflow apply` follows jobs as long: cli/follow.py)."""
LOG_WAIT_S = 5.0
"""How long a followed log read waits on the host for new output before answering empty."""


async def workflow_running(handle: Any) -> bool:
    """Whether the workflow still runs: a job's row reads final from the moment an attempt
    ended, also when the workflow goes on to retry it (`retry`)."""
    try:
        described = await handle.describe()
    except RPCError:
        return False
    return bool(described.status == WorkflowExecutionStatus.RUNNING)


async def _read_log(reader: LogReader, name: str, queue: str, request: LogsInput) -> LogChunk:
    """One read of a node's log through the call's log reader; a failure said as gpuflow's."""
    try:
        return await reader.read(queue, request)
    except (WorkflowUpdateFailedError, RPCError) as exc:
        raise _log_error(name, request.rank, exc) from None
    except WorkflowUpdateRPCTimeoutOrCancelledError:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            # The caller was cancelled (Ctrl-C, SIGTERM) while the read waited on the host:
            # the SDK says so with its own error, which must not read as a failure.
            raise asyncio.CancelledError from None
        raise GpuflowError(
            f"job {name}: the log of node {request.rank} did not come back in time; is the "
            "host's agent running?"
        ) from None


def _log_error(job: str, rank: int, exc: Exception) -> GpuflowError:
    """One line for a failed log read: the agent's refusal as it said it, anything else as a
    host that did not answer."""
    cause: BaseException = getattr(exc, "cause", None) or exc
    cause = getattr(cause, "cause", None) or cause
    if isinstance(cause, ApplicationError) and cause.non_retryable:
        return GpuflowError(f"job {job}: cannot read the log of node {rank}: {cause}")
    return GpuflowError(
        f"job {job}: cannot read the log of node {rank} from its host ({cause}); "
        "is the host's agent running?"
    )


class LogCalls:
    _api: Api
    temporal: TemporalClient

    if TYPE_CHECKING:  # Client's own

        async def get(self, job: str) -> JobInfo: ...

        async def progress(self, job: str) -> Progress: ...

    async def logs(
        self,
        job: str,
        *,
        rank: int = 0,
        follow: bool = False,
        poll_s: float = 1.0,
        attempt: int | None = None,
    ) -> AsyncIterator[str]:
        """The job's output on one node, from the start; with `follow`, until the job ends.
        `attempt`: that attempt's output (a job that retried keeps each attempt's); None, or
        the current attempt's number: the current attempt's. One log reader workflow serves
        the whole call and is deleted from Temporal at its end (close the iterator, e.g. with
        `contextlib.aclosing`, when leaving it early)."""
        info = await self.get(job)
        if attempt is not None and attempt != info.attempt:
            async for data in self._earlier_logs(info, rank, attempt):
                yield data
            return
        offset, reading = 0, None  # reading: the attempt whose log `offset` is in
        ended_at: float | None = None  # since when the job's row reads final
        async with LogReader(self.temporal, job_id=info.id) as reader:
            while True:
                info = await self.get(info.id)
                if reading is not None and reading < info.attempt:
                    # The attempt followed so far ended and another began (a retry, a
                    # preemption): the rest of its output from its own host, then the new
                    # one's from its start.
                    with contextlib.suppress(NotFoundError):
                        async for data in self._earlier_logs(info, rank, reading, offset=offset):
                            yield data
                    offset, reading = 0, None
                    continue
                try:
                    placement = (await self.progress(info.id)).placement
                except GpuflowError:
                    placement = None
                if placement is None and not info.status.is_final:
                    if not follow:
                        return
                    await asyncio.sleep(poll_s)
                    continue
                queue = await self._log_queue(info, placement, rank)
                if queue is None:
                    return
                asked = asyncio.get_running_loop().time()
                reading = reading or info.attempt
                request = LogsInput(
                    job_id=info.id,
                    attempt=reading,
                    rank=rank,
                    offset=offset,
                    wait_s=LOG_WAIT_S if follow else 0,
                )
                chunk = await _read_log(reader, info.name, queue, request)
                if chunk.data:
                    yield chunk.data
                offset = chunk.next_offset
                if chunk.eof:
                    if not follow:
                        return
                    if info.status.is_final:
                        ended_at = ended_at or asyncio.get_running_loop().time()
                        if not await self._retried(info.id, ended_at):
                            return
                    else:
                        ended_at = None
                    # Let output gather between reads, unless the agent has waited already.
                    waited = asyncio.get_running_loop().time() - asked
                    await asyncio.sleep(max(0.0, poll_s - waited))

    async def _retried(self, job_id: str, ended_at: float) -> bool:
        """Whether a job whose row reads final may still go on to another attempt: its
        workflow runs on (a retry is recorded moments after the attempt's ending), for at
        most RETRY_GRACE_S (a workflow whose control worker is gone is not waited for)."""
        if asyncio.get_running_loop().time() - ended_at > RETRY_GRACE_S:
            return False
        return await workflow_running(self.temporal.get_workflow_handle(job_id))

    async def _earlier_logs(
        self, info: JobInfo, rank: int, attempt: int, *, offset: int = 0
    ) -> AsyncIterator[str]:
        """An earlier attempt's output on one node from `offset` (its whole output: 0): it
        ended, so there is no following."""
        if not 1 <= attempt < info.attempt:
            had = f"{info.attempt} attempt{'' if info.attempt == 1 else 's'}"
            raise NotFoundError(f"job {info.name} has no attempt {attempt}: it has had {had}")
        where = HostQueueRequest(job_id=info.id, rank=rank, attempt=attempt)
        found = await self._api.call("host_queue", where, HostQueueResult)
        if found.task_queue is None:
            raise NotFoundError(
                f"job {info.name}: no host is recorded for node {rank} of attempt {attempt} (it "
                "was not placed, has no such node, or ran under a gpuflow that kept no record "
                "of earlier attempts' hosts)"
            )
        async with LogReader(self.temporal, job_id=info.id) as reader:
            while True:
                request = LogsInput(job_id=info.id, attempt=attempt, rank=rank, offset=offset)
                chunk = await _read_log(reader, info.name, found.task_queue, request)
                if chunk.data:
                    yield chunk.data
                offset = chunk.next_offset
                if chunk.eof:
                    return

    async def _log_queue(self, info: JobInfo, placement: Any, rank: int) -> str | None:
        if placement is not None:
            for node in placement.nodes:
                if node.rank == rank:
                    return str(node.task_queue)
            raise NotFoundError(f"job {info.name} has no node {rank}")
        found = await self._api.call(
            "host_queue", HostQueueRequest(job_id=info.id, rank=rank), HostQueueResult
        )
        return found.task_queue
