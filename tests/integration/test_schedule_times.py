"""Against a real dev server: a schedule's cron times are UTC (what `schedule create --help` and
the README say: Temporal's default, not the server's local zone), and `CRON_TZ=<zone>` picks
another; what the client's cron check refuses, Temporal refuses too (the check only words it
first)."""

from __future__ import annotations

import uuid
from datetime import UTC
from pathlib import Path

import pytest
from temporalio.client import Schedule, ScheduleActionStartWorkflow, ScheduleSpec
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment

from gpuflow.client import Client
from gpuflow.client.cron import check_cron
from gpuflow.control.worker import ControlWorker
from gpuflow.errors import SpecError
from gpuflow.specs import JobSpec
from gpuflow.store.db import Store

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]


async def test_cron_times_are_utc_unless_the_cron_names_a_zone(
    dev_env: WorkflowEnvironment, sqlite_store: Store, tmp_path: Path
) -> None:
    client = Client(temporal=dev_env.client)
    job = JobSpec(name="stamp", commands=["true"])
    # 08:30 in Kolkata (UTC+5:30, no daylight saving) is 03:00 UTC
    crons = ("0 3 * * *", "CRON_TZ=Asia/Kolkata 30 8 * * *")
    async with ControlWorker(dev_env.client, sqlite_store, home=tmp_path):
        for cron in crons:
            schedule_id = f"utc-{uuid.uuid4().hex[:8]}"
            await client.schedule(job, cron=cron, schedule_id=schedule_id)
            handle = dev_env.client.get_schedule_handle(schedule_id)
            try:
                times = (await handle.describe()).info.next_action_times
            finally:
                await handle.delete()
            assert times, cron
            assert {(t.astimezone(UTC).hour, t.astimezone(UTC).minute) for t in times} == {(3, 0)}


@pytest.mark.parametrize("cron", ["61 3 * * *", "bogus", "0 3 ? * *", "0 5-3 * * *"])
async def test_what_the_check_refuses_temporal_refuses(
    dev_env: WorkflowEnvironment, cron: str
) -> None:
    with pytest.raises(SpecError):
        check_cron(cron)
    action = ScheduleActionStartWorkflow("Nothing", id="never", task_queue="none")
    with pytest.raises(RPCError):
        await dev_env.client.create_schedule(
            f"refused-{uuid.uuid4().hex[:8]}",
            Schedule(action=action, spec=ScheduleSpec(cron_expressions=[cron])),
        )
