"""LogReaderWorkflow: reads a job's log from its host for one `gpuflow logs` (or `logs -f`), so
log bytes never pass through the job's own workflow history and the CLI needs nothing but
Temporal to read them.

The client starts one reader per command and asks for each chunk with the `read` update; when
the command ends, the client deletes the reader from Temporal, so the chunks (already masked by
the agent) stay in Temporal no longer than the command runs. A reader that nobody asks for
IDLE_END ends on its own, and one whose history has grown asks the client for a fresh reader
(`LogRead.reader_done`) instead of continuing as new, so that the client knows every run it
must delete.
"""

from __future__ import annotations

import contextlib
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

from gpuflow.workflows import contract

with workflow.unsafe.imports_passed_through():
    from pydantic import BaseModel

    from gpuflow.workflows.models import LogChunk, LogsInput

IDLE_END = timedelta(minutes=2)
"""A reader with no read for this long (up to twice as long) ends: its client is gone."""

MAX_READS = 400
"""Reads one reader serves (about 10 history events each) before it hands over to a new one."""


class LogReaderInput(BaseModel):
    job_id: str


class LogReadRequest(BaseModel):
    task_queue: str
    """The task queue of the host agent that holds the log."""
    logs: LogsInput


class LogRead(BaseModel):
    chunk: LogChunk
    reader_done: bool = False
    """This reader takes no more reads: the client starts another for the next one."""


@workflow.defn(name="LogReaderWorkflow")
class LogReaderWorkflow:
    @workflow.init
    def __init__(self, inp: LogReaderInput) -> None:
        self._reads = 0

    @workflow.run
    async def run(self, inp: LogReaderInput) -> None:
        # One timer per idle period, not one per read (a read would cancel and restart it):
        # the reader ends after a whole period without a read.
        seen = -1
        while not self._done() and self._reads != seen:
            seen = self._reads
            with contextlib.suppress(TimeoutError):
                await workflow.wait_condition(self._done, timeout=IDLE_END)
        await workflow.wait_condition(workflow.all_handlers_finished)

    @workflow.update
    async def read(self, request: LogReadRequest) -> LogRead:
        self._reads += 1
        chunk: LogChunk = await workflow.execute_activity(
            contract.read_logs,
            request.logs,
            task_queue=request.task_queue,
            summary=f"read log of node {request.logs.rank}",
            schedule_to_close_timeout=timedelta(seconds=20),
            retry_policy=RetryPolicy(maximum_attempts=2),
        )
        return LogRead(chunk=chunk, reader_done=self._done())

    @read.validator
    def _accept(self, request: LogReadRequest) -> None:
        if self._done():
            raise ValueError("this log reader is done; start another")

    def _done(self) -> bool:
        return self._reads >= MAX_READS or workflow.info().is_continue_as_new_suggested()


__all__ = ["LogRead", "LogReadRequest", "LogReaderInput", "LogReaderWorkflow"]
