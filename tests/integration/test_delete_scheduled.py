"""Against a real dev server: the client refuses to delete a queue or a secret that a gpuflow
schedule's job still names (each of its later runs would fail), naming the schedule; `force`
deletes it anyway; one no schedule names is deleted as before. The client reads the schedules
from Temporal alone; no control worker runs here (the control plane's answers are faked)."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta
from typing import Any

import pytest
from temporalio.client import Client as TemporalClient
from temporalio.client import (
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleIntervalSpec,
    ScheduleSpec,
)
from temporalio.testing import WorkflowEnvironment

from gpuflow.client import Client
from gpuflow.errors import InUseError
from gpuflow.specs import JobSpec
from gpuflow.workflows.api import SecretDeleted

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]


class ControlPlane:
    """Answers the client's updates as a control plane that has every queue and secret."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, str]] = []

    async def call(self, update: str, arg: Any, result_type: Any, **_: Any) -> Any:
        self.asked.append((update, getattr(arg, "name", "")))
        if update == "delete_secret":
            return SecretDeleted(deleted=True)
        return [] if update == "plan" else None


async def _listed(temporal: TemporalClient, schedule_ids: set[str]) -> None:
    """Temporal's listing of schedules is eventually consistent: wait until it has these."""
    for _ in range(100):
        if schedule_ids <= {s.id async for s in await temporal.list_schedules()}:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"schedules {schedule_ids} never listed")


async def test_a_queue_or_secret_a_schedule_names_is_deleted_only_with_force(
    dev_env: WorkflowEnvironment,
) -> None:
    tag = uuid.uuid4().hex[:8]
    queue, secret, schedule_id = f"q{tag}", f"token_{tag}", f"nightly-{tag}"
    control = ControlPlane()
    client = Client(temporal=dev_env.client, api=control)  # type: ignore[arg-type]
    spec = JobSpec(
        name="nightly",
        commands=["python train.py"],
        queue=queue,
        env={"HF_TOKEN": f"${{{{ secrets.{secret} }}}}"},
    )
    # Not gpuflow's to count: another team's schedule, and a JobWorkflow one made outside
    # gpuflow whose input is not a job's.
    others = [
        (f"theirs-{tag}", "TheirWorkflow", [queue, secret]),
        (f"odd-{tag}", "JobWorkflow", [f"queue {queue} secret {secret}"]),
    ]
    for other_id, workflow, args in others:
        await dev_env.client.create_schedule(
            other_id,
            Schedule(
                action=ScheduleActionStartWorkflow(
                    workflow, args=args, id=other_id, task_queue="elsewhere"
                ),
                spec=ScheduleSpec(intervals=[ScheduleIntervalSpec(every=timedelta(days=1))]),
            ),
        )
    await client.schedule(spec, cron="0 3 * * *", schedule_id=schedule_id)
    try:
        await _listed(dev_env.client, {schedule_id, *(other_id for other_id, _, _ in others)})
        assert await client.schedules_needing(queue=queue) == [schedule_id]
        assert await client.schedules_needing(secret=secret) == [schedule_id]
        assert await client.schedules_needing(queue="default") == []

        with pytest.raises(InUseError) as refused:
            await client.delete_queue(queue)
        assert str(refused.value) == (
            f"queue {queue} is used by schedule(s) {schedule_id}; delete them first, or pass "
            "--force"
        )
        assert refused.value.schedules == [schedule_id]
        with pytest.raises(InUseError, match=rf"^secret {secret} is used by schedule\(s\) "):
            await client.delete_secret(secret)
        assert [update for update, _ in control.asked] == ["plan"]  # nothing deleted

        await client.delete_queue(queue, force=True)
        assert await client.delete_secret(secret, force=True)
        # Unused ones are deleted as before, without force.
        await client.delete_queue(f"spare{tag}")
        assert await client.delete_secret(f"spare_{tag}")
        assert control.asked[1:] == [
            ("delete_queue", queue),
            ("delete_secret", secret),
            ("delete_queue", f"spare{tag}"),
            ("delete_secret", f"spare_{tag}"),
        ]
    finally:
        await client.delete_schedule(schedule_id)
        for other_id, _, _ in others:
            await dev_env.client.get_schedule_handle(other_id).delete()
