"""ReadLogsWorkflow: fetches one chunk of a job's log from its host, so log bytes never pass
through the job's own workflow history and the CLI needs nothing but Temporal to read them."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from pydantic import BaseModel

    from gpuflow.workflows.models import LogChunk, LogsInput


class ReadLogsInput(BaseModel):
    task_queue: str
    logs: LogsInput


@workflow.defn(name="ReadLogsWorkflow")
class ReadLogsWorkflow:
    @workflow.run
    async def run(self, inp: ReadLogsInput) -> LogChunk:
        chunk: LogChunk = await workflow.execute_activity(
            "read_logs",
            inp.logs,
            result_type=LogChunk,
            task_queue=inp.task_queue,
            summary="read logs",
            schedule_to_close_timeout=timedelta(seconds=20),
            retry_policy=RetryPolicy(maximum_attempts=2),
        )
        return chunk
