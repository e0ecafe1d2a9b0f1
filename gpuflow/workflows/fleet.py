"""FleetWorkflow: one per fleet, id `fleet-<name>`. Every interval it pings each host's agent
on the host's own task queue and records who answers, so placement only ever sees hosts whose
agent is alive, and explanations can say when a host was last heard from. The agent of an ssh
host that does not answer is started again over SSH (with a backoff) and pinged once more
before the round is recorded (workflows/revivals.py). In the same loop it reconciles: capacity
held by a job that ended, or whose workflow was closed from outside gpuflow, has its processes
stopped and is released (docs/architecture.md, invariants 3 and 8)."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

from gpuflow.workflows import contract, revivals, steps
from gpuflow.workflows.job import JobWorkflow

with workflow.unsafe.imports_passed_through():
    from gpuflow.workflows.models import (
        FleetHost,
        FleetHostsResult,
        FleetInput,
        HostHealthInput,
        HostHealthResult,
        HostPing,
        OrphansResult,
        ReleaseOrphansInput,
        ReleaseResult,
        Revival,
        ReviveInput,
        ReviveResult,
        StopProcessInput,
    )

PING_INTERVAL = timedelta(seconds=30)
PING_TIMEOUT = timedelta(seconds=10)
ROUNDS_PER_RUN = 100
PINGS_AT_ONCE = 500
"""Pings in flight at once. Temporal fails every workflow task that would leave more than
2,000 activities pending (`limit.numPendingActivities.error`), so a fleet of more hosts (a
fleet file may have 4,096) is pinged in batches, the next batch once the last has answered."""
EVENTS_PER_RUN = 10_000
"""A run continues as new once its history holds this many events (where Temporal starts to
warn), or sooner when the server suggests it. Each ping adds three events, so at 1,213 hosts a
round adds some 3,700 and 100 rounds would pass the 51,200 at which Temporal terminates a
workflow (its health checks and reconciliation would then stop for good)."""
BOUNDED_PATCH = "fleet-bounded-rounds"
"""Runs recorded before pings were batched and runs were cut by their history replay as they
were: all pings at once, 100 rounds a run."""
RECONCILE_PATCH = "reconcile-allocations"
"""Histories recorded before reconciliation existed replay without its steps."""
ORPHAN_STOP_GRACE_S = 10.0
ORPHAN_STOP_TIMEOUT = timedelta(seconds=30)
"""A host that does not answer in this time must not keep an orphan's GPUs allocated."""
STEPS_PER_ROUND = 20
"""Reconciliation steps a round takes at most (each stops and releases up to 500 orphaned
nodes: control/reconcile.py `ORPHAN_NODES_PER_STEP`); the next round goes on."""
RECONCILE_STEP_TIMEOUT = timedelta(minutes=2)
"""Retries of a reconciliation step stop here: the fleet's health loop must not wait on it."""
REVIVE_TIMEOUT = timedelta(minutes=3)
"""Restarting silent agents over SSH stops here (control/revive.py bounds each host to less):
the round records its health checks regardless."""
AGENT_START_TIMEOUT = timedelta(seconds=30)
"""How long a restarted agent has to answer its first ping in the same round."""


@workflow.defn(name="FleetWorkflow")
class FleetWorkflow:
    @workflow.init
    def __init__(self, inp: FleetInput) -> None:
        self._refresh = False
        self._deleted = False
        self._revivals: dict[str, Revival] = dict(inp.revivals)
        """Silent ssh hosts whose agent was started in vain, and when to try again."""

    @workflow.signal
    def refresh(self) -> None:
        """The fleet changed: check its hosts now, and try every silent agent again."""
        self._refresh = True
        self._revivals.clear()

    @workflow.signal
    def delete(self) -> None:
        self._deleted = True

    @workflow.run
    async def run(self, inp: FleetInput) -> None:
        revive = workflow.patched(revivals.REVIVE_PATCH)
        inp = inp.model_copy(update={"revivals": {}})  # the state is self._revivals
        for _ in range(ROUNDS_PER_RUN):
            if self._deleted:
                return
            self._refresh = False
            hosts: FleetHostsResult = await workflow.execute_activity(
                contract.fleet_hosts,
                inp,
                summary=f"list hosts of {inp.fleet}",
                start_to_close_timeout=timedelta(seconds=30),
                retry_policy=RetryPolicy(maximum_interval=timedelta(seconds=30)),
            )
            if hosts.deleted:
                return
            pings = await _ping(hosts.hosts, workflow.patched(BOUNDED_PATCH))
            if revive:
                pings = await self._revive(inp, hosts.hosts, pings)
            health: HostHealthResult = await workflow.execute_activity(
                contract.record_host_health,
                HostHealthInput(fleet=inp.fleet, pings=pings),
                summary="record host health",
                start_to_close_timeout=timedelta(seconds=30),
                retry_policy=RetryPolicy(maximum_interval=timedelta(seconds=30)),
            )
            waiting = list(health.waiting_jobs)
            if workflow.patched(RECONCILE_PATCH):
                waiting += [j for j in await self._reconcile(inp) if j not in waiting]
            for job_id in waiting:
                try:
                    await workflow.get_external_workflow_handle_for(JobWorkflow.run, job_id).signal(
                        JobWorkflow.capacity_changed
                    )
                except Exception:  # the job ended meanwhile: nothing to tell
                    workflow.logger.debug("job %s no longer waits", job_id)
            with contextlib.suppress(TimeoutError):
                await workflow.wait_condition(
                    lambda: self._refresh or self._deleted,
                    timeout=_interval(inp),
                    timeout_summary="next health check",
                )
            if workflow.patched(BOUNDED_PATCH) and _history_full():
                break
        await workflow.wait_condition(workflow.all_handlers_finished)
        workflow.continue_as_new(
            inp.model_copy(update={"revivals": self._revivals}) if revive else inp
        )

    async def _revive(
        self, inp: FleetInput, hosts: list[FleetHost], pings: list[HostPing]
    ) -> list[HostPing]:
        """Start the agents of the silent ssh hosts that are due again, and ping those that
        run now: the pings to record. A host that still does not answer waits longer."""
        now = workflow.now()
        due = revivals.due(hosts, pings, self._revivals, now)
        if due:
            pings = await self._restart_and_ping(inp, due, pings)
        self._revivals = revivals.after_round(
            self._revivals,
            hosts=hosts,
            pings=pings,
            tried=[host.host_id for host in due],
            now=now,
            interval=_interval(inp),
        )
        return pings

    async def _restart_and_ping(
        self, inp: FleetInput, due: list[FleetHost], pings: list[HostPing]
    ) -> list[HostPing]:
        names = ", ".join(host.name for host in due[:3]) + (", ..." if len(due) > 3 else "")
        try:
            result: ReviveResult = await workflow.execute_activity(
                contract.revive_hosts,
                ReviveInput(fleet=inp.fleet, host_ids=[host.host_id for host in due]),
                summary=f"start the agent of {names}",
                schedule_to_close_timeout=REVIVE_TIMEOUT,
                heartbeat_timeout=timedelta(seconds=30),
                retry_policy=RetryPolicy(maximum_attempts=1),  # the next round tries again
            )
        except ActivityError as error:
            workflow.logger.warning("fleet %s: starting agents failed: %s", inp.fleet, error)
            return pings
        running = set(result.revived)
        again = {
            ping.host_id: ping
            for ping in await _ping(
                [host for host in due if host.host_id in running],
                batched=True,
                timeout=AGENT_START_TIMEOUT,
            )
        }
        return [again.get(ping.host_id, ping) for ping in pings]

    async def _reconcile(self, inp: FleetInput) -> list[str]:
        """Stop the processes of every orphaned (job, attempt, rank), then release them; the
        jobs that wait for capacity (to wake when something was released). A reconciliation
        that keeps failing is given up for this round: the health checks go on regardless."""
        try:
            return await self._reconcile_once(inp)
        except ActivityError as error:
            workflow.logger.warning("fleet %s: reconciliation failed: %s", inp.fleet, error)
            return []

    async def _reconcile_once(self, inp: FleetInput) -> list[str]:
        """Steps of at most a few hundred orphaned nodes each, while the step says it left
        some out (`OrphansResult.more`), up to STEPS_PER_ROUND or until the run's history is
        full (the next round, or run, goes on)."""
        waiting: list[str] = []
        for _ in range(STEPS_PER_ROUND):
            found: OrphansResult = await workflow.execute_activity(
                contract.find_orphans,
                inp,
                summary=f"reconcile allocations of {inp.fleet}",
                start_to_close_timeout=timedelta(seconds=60),
                schedule_to_close_timeout=RECONCILE_STEP_TIMEOUT,
                retry_policy=steps.CONTROL_RETRY,
            )
            if found.orphans:
                released = await self._stop_and_release(inp, found)
                waiting += [j for j in released if j not in waiting]
            if not found.more or _history_full():
                break
        return waiting

    async def _stop_and_release(self, inp: FleetInput, found: OrphansResult) -> list[str]:
        # Errors are kept, not raised: a lost host must not keep the orphan's GPUs allocated.
        await steps.on_nodes(
            contract.stop_process,
            (
                (
                    StopProcessInput(
                        job_id=orphan.job_id,
                        attempt=orphan.attempt,
                        rank=node.rank,
                        grace_s=ORPHAN_STOP_GRACE_S,
                    ),
                    f"stop {orphan.job_id} on {node.host_name}",
                    node.task_queue,
                )
                for orphan in found.orphans
                for node in orphan.nodes
            ),
            schedule_to_close_timeout=ORPHAN_STOP_TIMEOUT,
            heartbeat_timeout=timedelta(seconds=15),
            retry_policy=RetryPolicy(maximum_attempts=2),
        )
        released: ReleaseResult = await workflow.execute_activity(
            contract.release_orphans,
            ReleaseOrphansInput(fleet=inp.fleet, orphans=found.orphans),
            summary=f"release {len(found.orphans)} orphaned allocation(s)",
            start_to_close_timeout=timedelta(seconds=60),
            schedule_to_close_timeout=RECONCILE_STEP_TIMEOUT,
            retry_policy=steps.CONTROL_RETRY,
        )
        return released.waiting_jobs


async def _ping(
    hosts: list[FleetHost], batched: bool, timeout: timedelta = PING_TIMEOUT
) -> list[HostPing]:
    """Ping each host's agent on its own task queue: who answered, in the hosts' order."""
    at_once = PINGS_AT_ONCE if batched else max(len(hosts), 1)
    pings: list[HostPing] = []
    for start in range(0, len(hosts), at_once):
        batch = hosts[start : start + at_once]
        answers = await asyncio.gather(
            *(
                workflow.execute_activity(
                    contract.ping_host,
                    task_queue=host.task_queue,
                    summary=f"ping {host.name}",
                    schedule_to_close_timeout=timeout,
                    retry_policy=RetryPolicy(maximum_attempts=1),
                )
                for host in batch
            ),
            return_exceptions=True,
        )
        pings += [
            HostPing(host_id=host.host_id, answered=not isinstance(answer, BaseException))
            for host, answer in zip(batch, answers, strict=True)
        ]
    return pings


def _history_full() -> bool:
    info = workflow.info()
    return info.is_continue_as_new_suggested() or (
        info.get_current_history_length() >= EVENTS_PER_RUN
    )


def _interval(inp: FleetInput) -> timedelta:
    if inp.health_interval_s is None:
        return PING_INTERVAL
    return timedelta(seconds=inp.health_interval_s)
