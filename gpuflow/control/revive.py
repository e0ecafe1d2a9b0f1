"""Starting again the agents of ssh hosts that stopped answering (the fleet health round's
`revive_hosts`): the same start that provisioning does, so an agent that runs is left alone,
and a host whose SSH login fails is marked unreachable with the reason."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

from sqlmodel import col, select
from temporalio import activity

from gpuflow.services.fleets import mark_agent_started, mark_unreachable
from gpuflow.status import HostState
from gpuflow.store.db import Store
from gpuflow.store.tables import HostRow
from gpuflow.workflows.models import ReviveInput, ReviveResult

AgentStarter = Callable[[HostRow], Awaitable[str | None]]
"""Makes sure the agent of a host is up; returns an error message or None."""

HOST_TIMEOUT_S = 150.0
"""One host's start (its SSH logins, pushing files, starting the agent) stops here, within the
workflow's REVIVE_TIMEOUT, so a hung host cannot hold the others' answers back."""
AT_ONCE = 16
"""Hosts started at once (SSH sessions a control worker opens for this)."""
HEARTBEAT_S = 5.0


async def revive_hosts(
    store: Store, ensure_agent: AgentStarter | None, inp: ReviveInput
) -> ReviveResult:
    """Start the agents of these hosts of the fleet; only ssh hosts that are not in
    maintenance are touched (the rows are read again: the fleet may have changed since)."""
    if ensure_agent is None:
        return ReviveResult()
    hosts = await asyncio.to_thread(_revivable, store, inp)
    gate = asyncio.Semaphore(AT_ONCE)

    async def start(host: HostRow) -> str | None:
        async with gate:
            try:
                return await asyncio.wait_for(ensure_agent(host), HOST_TIMEOUT_S)
            except TimeoutError:
                return f"host {host.id}: its agent did not start within {HOST_TIMEOUT_S:g} s"

    async with _heartbeats():
        errors = await asyncio.gather(*(start(host) for host in hosts))
    result = ReviveResult()
    for host, error in zip(hosts, errors, strict=True):
        if error is None:
            await asyncio.to_thread(mark_agent_started, store, host.id)
            result.revived.append(host.id)
            continue
        activity.logger.warning("host %s: could not start its agent: %s", host.id, error)
        if await asyncio.to_thread(mark_unreachable, store, host.id, error):
            result.unreachable.append(host.id)
    return result


def _revivable(store: Store, inp: ReviveInput) -> list[HostRow]:
    with store.read() as session:
        rows = session.exec(
            select(HostRow).where(HostRow.fleet == inp.fleet, col(HostRow.id).in_(inp.host_ids))
        ).all()
    wanted = {row.id: row for row in rows if _revivable_row(row)}
    return [wanted[hid] for hid in dict.fromkeys(inp.host_ids) if hid in wanted]


def _revivable_row(host: HostRow) -> bool:
    return bool(host.ssh) and not host.simulated and host.state != HostState.MAINTENANCE


@contextlib.asynccontextmanager
async def _heartbeats() -> AsyncIterator[None]:
    """Heartbeat while the hosts start, so a lost worker is noticed before REVIVE_TIMEOUT."""
    if not activity.in_activity():
        yield
        return

    async def beat() -> None:
        while True:
            activity.heartbeat()
            await asyncio.sleep(HEARTBEAT_S)

    task = asyncio.create_task(beat())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
