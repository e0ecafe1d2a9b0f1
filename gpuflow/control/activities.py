"""Control activities: placement, release and bookkeeping against the database, and making sure
a host's agent is up. They run on the control task queue and are idempotent."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlmodel import select
from temporalio import activity
from temporalio.client import Client
from temporalio.exceptions import ApplicationError

from gpuflow.control import reconcile, revive
from gpuflow.control.admission import AdmissionActivities
from gpuflow.control.admission_tell import AdmissionTell
from gpuflow.control.admission_wake import wake_admission
from gpuflow.control.records import record_in
from gpuflow.control.releases import ReleaseGroups
from gpuflow.metrics import store as metrics
from gpuflow.scheduler.model import Placement, Unschedulable
from gpuflow.services.capacity import HeldKey, take_allocation_in
from gpuflow.services.changes import bump_hosts
from gpuflow.services.fleets import get_host, mark_unreachable, sweep_drained
from gpuflow.services.jobs import jobs_waiting_for_capacity_in
from gpuflow.services.verdicts import no_fit_lines
from gpuflow.status import HostState
from gpuflow.store.db import Store
from gpuflow.store.tables import FleetRow, HostRow
from gpuflow.workflows.models import (
    FleetHost,
    FleetHostsResult,
    FleetInput,
    HostHealthInput,
    HostHealthResult,
    JobStatusInput,
    OrphansResult,
    PlaceInput,
    PlaceResult,
    ProvisionInput,
    ProvisionResult,
    ReleaseInput,
    ReleaseOrphansInput,
    ReleaseResult,
    ReviveInput,
    ReviveResult,
    placed_message,
)

# Makes sure the agent of a host is up; returns an error message or None. Set by the worker:
# sim hosts get an in-process agent, ssh hosts an asyncssh-started one.
AgentStarter = revive.AgentStarter


class ControlActivities:
    def __init__(
        self,
        store: Store,
        *,
        ensure_agent: AgentStarter | None = None,
        temporal: Client | None = None,
        warm: bool = True,
        task_queue: str | None = None,
    ) -> None:
        self.store = store
        self.task_queue = task_queue
        """The control task queue whose admission loop releases and health changes wake
        (None: the queue of the activity that wakes it)."""
        self.warm = warm
        """Place on the warm fleet state (services/warm.py); False reads the whole fleet every
        time, as before it (benchmarks/fleet_scale.py compares the two)."""
        self.ensure_agent = ensure_agent
        self.temporal = temporal
        """Asks Temporal whether jobs' workflows are still open (reconciliation), and asks the
        admission loop for passes; without it, only allocations of jobs whose row has ended are
        reconciled, and the loop passes on its own schedule."""
        self.admission = AdmissionActivities(
            store, temporal=temporal, warm=warm, task_queue=task_queue
        )
        self.tell = AdmissionTell(temporal)
        self.releases = ReleaseGroups(store)
        """Releases that arrive together share a placement transaction (releases.py)."""
        self._orphans_after: dict[str, HeldKey | None] = {}
        """Per fleet, where reconciliation's next look at its allocations starts."""

    @activity.defn(name="place_job")
    async def place_job(self, inp: PlaceInput) -> PlaceResult:
        def place() -> Placement | Unschedulable:
            with self.store.placement_transaction() as session:
                if inp.before is not None:
                    record_in(session, inp.before)
                result = take_allocation_in(
                    session,
                    job_id=inp.job_id,
                    attempt=inp.attempt,
                    job=inp.spec,
                    fleets=inp.fleets,
                    warm=self.warm,
                )
                if inp.placed is not None and not isinstance(result, Unschedulable):
                    message = placed_message(result)
                    placed = inp.placed.model_copy(
                        update={
                            "message": message,
                            "placement": result,
                            "event_key": inp.placed.event_key + message[:80],
                        }
                    )
                    record_in(session, placed)
                    metrics.observe_wait(session, placed)
                return result

        started = time.perf_counter()
        result = await asyncio.to_thread(place)
        metrics.observe_placement(time.perf_counter() - started, result)
        if isinstance(result, Unschedulable):
            return PlaceResult(reasons=no_fit_lines([(inp.spec, result)]))
        return PlaceResult(placement=result)

    @activity.defn(name="release_job")
    async def release_job(self, inp: ReleaseInput) -> ReleaseResult:
        released = await self.releases.release(inp)
        if released.wake:
            await wake_admission(self.temporal, self.task_queue)
        return ReleaseResult(released_nodes=released.nodes, waiting_jobs=released.waiting)

    @activity.defn(name="record_job_status")
    async def record_job_status(self, inp: JobStatusInput) -> None:
        def write() -> None:
            with self.store.session() as session:
                record_in(session, inp)
                try:
                    session.commit()
                except IntegrityError:  # a concurrent duplicate of this very call won
                    session.rollback()

        await asyncio.to_thread(write)

    @activity.defn(name="provision_host")
    async def provision_host(self, inp: ProvisionInput) -> ProvisionResult:
        host = await asyncio.to_thread(get_host, self.store, inp.host_id)
        if host is None:
            raise ApplicationError(
                f"host {inp.host_id} is no longer in any fleet", non_retryable=True
            )
        if self.ensure_agent is None:
            return ProvisionResult(host_id=inp.host_id, ready=True)
        error = await self.ensure_agent(host)
        if error is not None:
            await asyncio.to_thread(mark_unreachable, self.store, inp.host_id, error)
            return ProvisionResult(host_id=inp.host_id, ready=False, message=error)
        return ProvisionResult(host_id=inp.host_id, ready=True)

    @activity.defn(name="fleet_hosts")
    async def fleet_hosts(self, inp: FleetInput) -> FleetHostsResult:
        """The fleet's hosts to ping, once the hosts its spec dropped and no job holds any
        more are gone (`sweep_drained`)."""
        gone = await asyncio.to_thread(sweep_drained, self.store, inp.fleet)
        if gone:
            activity.logger.info("fleet %s: drained hosts removed: %s", inp.fleet, gone)

        def read() -> FleetHostsResult:
            with self.store.read() as session:
                fleet = session.get(FleetRow, inp.fleet)
                if fleet is None:
                    return FleetHostsResult(deleted=True)
                declared = (
                    {h["name"]: h.get("state", "ready") for h in fleet.spec.get("hosts", [])}
                    if fleet.kind == "sim"
                    else {}
                )
                rows = session.exec(select(HostRow).where(HostRow.fleet == inp.fleet)).all()
                return FleetHostsResult(
                    hosts=[
                        FleetHost(
                            host_id=h.id,
                            name=h.name,
                            task_queue=h.task_queue,
                            simulated=h.simulated,
                            ssh=bool(h.ssh) and not h.simulated,
                        )
                        for h in rows
                        if h.state != HostState.MAINTENANCE
                        and declared.get(h.name, "ready") == "ready"
                    ]
                )

        result = await asyncio.to_thread(read)
        if self.ensure_agent is not None:
            # Simulated hosts are served inside control workers: make sure one serves them
            # before they are pinged (a fleet applied after this worker started).
            for host in result.hosts:
                if host.simulated:
                    row = await asyncio.to_thread(get_host, self.store, host.host_id)
                    if row is not None:
                        await self.ensure_agent(row)
        return result

    @activity.defn(name="revive_hosts")
    async def revive_hosts(self, inp: ReviveInput) -> ReviveResult:
        """Start again the agents of these ssh hosts (the health round's silent ones), as
        provisioning does; a host that cannot be reached is marked unreachable, with why."""
        return await revive.revive_hosts(self.store, self.ensure_agent, inp)

    @activity.defn(name="record_host_health")
    async def record_host_health(self, inp: HostHealthInput) -> HostHealthResult:
        def write() -> HostHealthResult:
            now = datetime.now(UTC)
            became_ready = []
            with self.store.session() as session:
                changed: list[str] = []
                for ping in inp.pings:
                    host = session.get(HostRow, ping.host_id)
                    if host is None or host.state == HostState.MAINTENANCE:
                        continue
                    before = (host.state, host.state_detail)
                    if ping.answered:
                        if host.state != HostState.READY:
                            became_ready.append(host.id)
                        host.state, host.state_detail = HostState.READY, None
                        host.last_heartbeat = now
                    elif host.state == HostState.READY:
                        host.state = HostState.NOT_READY
                        host.state_detail = "agent not answering"
                    if (host.state, host.state_detail) != before:
                        changed.append(host.id)
                    session.add(host)
                if changed:  # what placement reads changed: warm states catch up
                    bump_hosts(session, "states", changed)
                waiting = jobs_waiting_for_capacity_in(session) if became_ready else []
                session.commit()
            return HostHealthResult(became_ready=became_ready, waiting_jobs=waiting)

        result = await asyncio.to_thread(write)
        if result.became_ready:
            await wake_admission(self.temporal, self.task_queue)
        return result

    @activity.defn(name="find_orphans")
    async def find_orphans(self, inp: FleetInput) -> OrphansResult:
        """Allocations in the fleet whose job ended or whose workflow is closed, a page of
        the fleet's allocations at a time (where the last look ended is kept here)."""
        after = self._orphans_after.get(inp.fleet)
        found, self._orphans_after[inp.fleet] = await reconcile.find_orphans(
            self.store, self.temporal, fleet=inp.fleet, after=after
        )
        return found

    @activity.defn(name="release_orphans")
    async def release_orphans(self, inp: ReleaseOrphansInput) -> ReleaseResult:
        """Release what `find_orphans` found (their processes already stopped) and record it."""
        result = await asyncio.to_thread(reconcile.release_orphans, self.store, inp)
        if result.released_nodes:
            await wake_admission(self.temporal, self.task_queue)
        return result

    def activities(self) -> list[Any]:
        """What the control worker registers: the control half of workflows.contract."""
        return [
            self.find_orphans,
            self.release_orphans,
            self.place_job,
            self.release_job,
            self.record_job_status,
            self.provision_host,
            self.fleet_hosts,
            self.revive_hosts,
            self.record_host_health,
            *self.admission.activities(),
            self.tell.tell_jobs,
        ]
