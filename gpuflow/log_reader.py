"""The client's side of LogReaderWorkflow: one reader at a time for one `logs` command, each
chunk an update, and every reader it started deleted from Temporal when the command ends."""

from __future__ import annotations

import contextlib
import secrets

from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.workflowservice.v1 import DeleteWorkflowExecutionRequest
from temporalio.client import Client as TemporalClient
from temporalio.client import WorkflowHandle, WorkflowUpdateFailedError
from temporalio.exceptions import ActivityError
from temporalio.service import RPCError, RPCStatusCode

from gpuflow.naming import CONTROL_TASK_QUEUE
from gpuflow.workflows.logs import LogReaderInput, LogReaderWorkflow, LogReadRequest
from gpuflow.workflows.models import LogChunk, LogsInput


class LogReader:
    """Reads one job's log through Temporal. Use as `async with LogReader(...) as reader`."""

    def __init__(self, temporal: TemporalClient, *, job_id: str) -> None:
        self.temporal = temporal
        self.job_id = job_id
        self._handle: WorkflowHandle[LogReaderWorkflow, None] | None = None
        self.started: list[str] = []
        """Ids of the readers this one started (each deleted when done with)."""

    async def __aenter__(self) -> LogReader:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._retire()

    async def read(self, task_queue: str, logs: LogsInput) -> LogChunk:
        """The next chunk. A reader that ended meanwhile (idle, or full) is replaced once; a
        failed read raises WorkflowUpdateFailedError whose cause is the activity's error."""
        for replaced in (False, True):
            handle = self._handle or await self._start()
            try:
                result = await handle.execute_update(
                    LogReaderWorkflow.read, LogReadRequest(task_queue=task_queue, logs=logs)
                )
            except WorkflowUpdateFailedError as exc:
                if replaced or isinstance(exc.cause, ActivityError):
                    raise
                await self._retire()  # refused: this reader is done
                continue
            except RPCError as exc:
                if replaced or exc.status != RPCStatusCode.NOT_FOUND:
                    raise
                await self._retire()  # it ended on its own
                continue
            if result.reader_done:
                await self._retire()
            return result.chunk
        raise AssertionError("unreachable")

    async def _start(self) -> WorkflowHandle[LogReaderWorkflow, None]:
        reader_id = f"logs-{self.job_id}-{secrets.token_hex(4)}"
        self._handle = await self.temporal.start_workflow(
            LogReaderWorkflow.run,
            LogReaderInput(job_id=self.job_id),
            id=reader_id,
            task_queue=CONTROL_TASK_QUEUE,
            static_summary=f"read the log of {self.job_id}",
        )
        self.started.append(reader_id)
        return self._handle

    async def _retire(self) -> None:
        """Delete the current reader (running or not) with its history. Where the server
        refuses, the reader still ends on its own and its history goes at the namespace's
        retention; the chunks in it were masked by the agent."""
        handle, self._handle = self._handle, None
        if handle is None:
            return
        request = DeleteWorkflowExecutionRequest(
            namespace=self.temporal.namespace,
            workflow_execution=WorkflowExecution(workflow_id=handle.id, run_id=handle.run_id or ""),
        )
        with contextlib.suppress(RPCError):
            await self.temporal.workflow_service.delete_workflow_execution(request)
