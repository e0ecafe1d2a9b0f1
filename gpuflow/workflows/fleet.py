"""FleetWorkflow: one per fleet, id `fleet-<name>`. Every interval it pings each host's agent
on the host's own task queue and records who answers, so placement only ever sees hosts whose
agent is alive, and explanations can say when a host was last heard from."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from gpuflow.workflows.models import (
        FleetHostsResult,
        FleetInput,
        HostHealthInput,
        HostHealthResult,
        HostPing,
    )

PING_INTERVAL = timedelta(seconds=30)
PING_TIMEOUT = timedelta(seconds=10)
ROUNDS_PER_RUN = 100


@workflow.defn(name="FleetWorkflow")
class FleetWorkflow:
    def __init__(self) -> None:
        self._refresh = False
        self._deleted = False

    @workflow.signal
    def refresh(self) -> None:
        """The fleet changed: check its hosts now."""
        self._refresh = True

    @workflow.signal
    def delete(self) -> None:
        self._deleted = True

    @workflow.run
    async def run(self, inp: FleetInput) -> None:
        for _ in range(ROUNDS_PER_RUN):
            if self._deleted:
                return
            self._refresh = False
            hosts: FleetHostsResult = await workflow.execute_activity(
                "fleet_hosts",
                inp,
                result_type=FleetHostsResult,
                summary=f"list hosts of {inp.fleet}",
                start_to_close_timeout=timedelta(seconds=30),
                retry_policy=RetryPolicy(maximum_interval=timedelta(seconds=30)),
            )
            if hosts.deleted:
                return
            answers = await asyncio.gather(
                *(
                    workflow.execute_activity(
                        "ping_host",
                        task_queue=host.task_queue,
                        result_type=str,
                        summary=f"ping {host.name}",
                        schedule_to_close_timeout=PING_TIMEOUT,
                        retry_policy=RetryPolicy(maximum_attempts=1),
                    )
                    for host in hosts.hosts
                ),
                return_exceptions=True,
            )
            pings = [
                HostPing(host_id=host.host_id, answered=not isinstance(answer, BaseException))
                for host, answer in zip(hosts.hosts, answers, strict=True)
            ]
            health: HostHealthResult = await workflow.execute_activity(
                "record_host_health",
                HostHealthInput(fleet=inp.fleet, pings=pings),
                result_type=HostHealthResult,
                summary="record host health",
                start_to_close_timeout=timedelta(seconds=30),
                retry_policy=RetryPolicy(maximum_interval=timedelta(seconds=30)),
            )
            for job_id in health.waiting_jobs:
                try:
                    await workflow.get_external_workflow_handle(job_id).signal("capacity_changed")
                except Exception:  # the job ended meanwhile: nothing to tell
                    workflow.logger.debug("job %s no longer waits", job_id)
            with contextlib.suppress(TimeoutError):
                await workflow.wait_condition(
                    lambda: self._refresh or self._deleted,
                    timeout=PING_INTERVAL,
                    timeout_summary="next health check",
                )
        await workflow.wait_condition(workflow.all_handlers_finished)
        workflow.continue_as_new(inp)
