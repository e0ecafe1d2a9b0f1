"""A job whose queue was deleted since it was named (a Temporal Schedule's later run) on the
time-skipping server: it cannot start, which is not a lack of capacity, so it ends `failed
(start_failed)` at once, and a retry on no-capacity does not try it again and again."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
from temporalio.api.history.v1 import History
from temporalio.client import WorkflowHistory
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer

from gpuflow.payloads import DATA_CONVERTER
from gpuflow.services.queues import apply_queue, delete_queue
from gpuflow.specs.queue import QueueSpec
from gpuflow.status import JobStatus, TerminationReason
from gpuflow.store.db import Store
from gpuflow.workflows import checked_workflow_runner
from gpuflow.workflows.admission import AdmissionWorkflow
from gpuflow.workflows.job import JobWorkflow
from gpuflow.workflows.outcome import job_result
from gpuflow.workflows.phases import PATCH_QUEUE_GONE
from tests.workflow.harness import ScriptedHosts, job, sim_fleet, start_job, workers

pytestmark = pytest.mark.asyncio(loop_scope="session")

HISTORIES = Path(__file__).parent / "histories"
RETRY_ON_NO_CAPACITY = {"on_events": ["no-capacity"], "duration": "10m"}


def _patches(history: History) -> list[bytes]:
    return [
        e.marker_recorded_event_attributes.details["patch-data"].payloads[0].data
        for e in history.events
        if e.HasField("marker_recorded_event_attributes")
        and e.marker_recorded_event_attributes.marker_name == "core_patch"
    ]


def _replayer() -> Replayer:
    return Replayer(
        workflows=[JobWorkflow, AdmissionWorkflow],
        data_converter=DATA_CONVERTER,
        workflow_runner=checked_workflow_runner(),
    )


async def test_a_job_whose_queue_was_deleted_fails_to_start_and_is_not_retried(
    time_env: WorkflowEnvironment, sqlite_store: Store, task_queue: str
) -> None:
    fleet = sim_fleet(sqlite_store)
    apply_queue(sqlite_store, QueueSpec(name="nightly", gpus=2))
    delete_queue(sqlite_store, "nightly")  # after the schedule named it
    hosts = ScriptedHosts()
    async with workers(time_env.client, sqlite_store, task_queue, hosts, [fleet]):
        handle = await start_job(
            time_env.client, task_queue, job("late", queue="nightly", retry=RETRY_ON_NO_CAPACITY)
        )
        result = await job_result(handle)
        history = await handle.fetch_history()
    assert (result.status, result.reason) == (JobStatus.FAILED, TerminationReason.START_FAILED)
    assert result.message == (
        'queue "nightly" is gone (deleted since the job was scheduled or submitted, or never '
        "applied); known: default"
    )
    assert result.attempts == 1  # start_failed is no retry event
    assert hosts.started == []
    assert _patches(history) == [
        b'{"id":"job-patches-2026-12","deprecated":false}',
        f'{{"id":"{PATCH_QUEUE_GONE}","deprecated":false}}'.encode(),
    ]
    await _replayer().replay_workflow(history)


async def test_a_run_that_ended_no_capacity_before_replays() -> None:
    """A run that ended `no_capacity` on a deleted queue (retried on no-capacity until its
    retry duration ran out) before PATCH_QUEUE_GONE replays as it ran: its recorded verdicts
    do not say the queue is unknown, so the patch is never asked."""
    data = gzip.decompress((HISTORIES / "queue-gone-no-capacity.json.gz").read_bytes()).decode()
    history = WorkflowHistory.from_json("job-late", data)
    assert PATCH_QUEUE_GONE.encode() not in b"".join(_patches(history))
    await _replayer().replay_workflow(history)
