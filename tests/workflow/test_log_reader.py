"""LogReaderWorkflow on the time-skipping server: each `read` update is one read on the host's
task queue, a refused read fails that update only, and a reader nobody asks ends on its own."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
import pytest_asyncio
from temporalio import activity
from temporalio.client import WorkflowUpdateFailedError
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from gpuflow.workflows import checked_workflow_runner
from gpuflow.workflows.logs import (
    IDLE_END,
    LogReaderInput,
    LogReaderWorkflow,
    LogReadRequest,
)
from gpuflow.workflows.models import LogChunk, LogsInput

pytestmark = pytest.mark.asyncio(loop_scope="session")

LOG = b"line one\nline two\n"


@activity.defn(name="read_logs")
async def scripted_read_logs(inp: LogsInput) -> LogChunk:
    if inp.job_id == "job-refused":
        raise ApplicationError("cannot mask the job's secrets in its log", non_retryable=True)
    data = LOG[inp.offset : inp.offset + inp.limit]
    return LogChunk(
        data=data.decode(),
        next_offset=inp.offset + len(data),
        eof=inp.offset + len(data) >= len(LOG),
    )


@pytest_asyncio.fixture(loop_scope="session")
async def queues(time_env: WorkflowEnvironment) -> AsyncIterator[tuple[str, str]]:
    control, host = f"control-{uuid.uuid4()}", f"host-{uuid.uuid4()}"
    async with (
        Worker(
            time_env.client,
            task_queue=control,
            workflows=[LogReaderWorkflow],
            workflow_runner=checked_workflow_runner(),
        ),
        Worker(time_env.client, task_queue=host, activities=[scripted_read_logs]),
    ):
        yield control, host


async def test_each_read_is_one_chunk_from_the_host(
    time_env: WorkflowEnvironment, queues: tuple[str, str]
) -> None:
    control, host = queues
    handle = await time_env.client.start_workflow(
        LogReaderWorkflow.run,
        LogReaderInput(job_id="job-a"),
        id=f"logs-{uuid.uuid4()}",
        task_queue=control,
    )
    chunks, offset = [], 0
    while True:
        read = await handle.execute_update(
            LogReaderWorkflow.read,
            LogReadRequest(task_queue=host, logs=LogsInput(job_id="job-a", offset=offset, limit=9)),
        )
        chunks.append(read.chunk.data)
        offset = read.chunk.next_offset
        assert not read.reader_done
        if read.chunk.eof:
            break
    assert chunks == ["line one\n", "line two\n"]
    await handle.terminate()


async def test_a_refused_read_fails_that_read_only(
    time_env: WorkflowEnvironment, queues: tuple[str, str]
) -> None:
    control, host = queues
    handle = await time_env.client.start_workflow(
        LogReaderWorkflow.run,
        LogReaderInput(job_id="job-refused"),
        id=f"logs-{uuid.uuid4()}",
        task_queue=control,
    )
    with pytest.raises(WorkflowUpdateFailedError) as failed:
        await handle.execute_update(
            LogReaderWorkflow.read,
            LogReadRequest(task_queue=host, logs=LogsInput(job_id="job-refused")),
        )
    assert isinstance(failed.value.cause, ActivityError)
    assert "cannot mask" in str(failed.value.cause.cause)
    read = await handle.execute_update(
        LogReaderWorkflow.read, LogReadRequest(task_queue=host, logs=LogsInput(job_id="job-a"))
    )
    assert read.chunk.data == LOG.decode()
    await handle.terminate()


async def test_a_reader_nobody_asks_ends_on_its_own(
    time_env: WorkflowEnvironment, queues: tuple[str, str]
) -> None:
    control, host = queues
    handle = await time_env.client.start_workflow(
        LogReaderWorkflow.run,
        LogReaderInput(job_id="job-a"),
        id=f"logs-{uuid.uuid4()}",
        task_queue=control,
    )
    await handle.execute_update(
        LogReaderWorkflow.read, LogReadRequest(task_queue=host, logs=LogsInput(job_id="job-a"))
    )
    started = await time_env.get_current_time()  # a moment after the reader's idle timer began
    await handle.result()  # time skips to the idle end
    assert await time_env.get_current_time() - started >= IDLE_END - timedelta(seconds=1)
