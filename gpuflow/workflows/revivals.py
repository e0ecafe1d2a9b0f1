"""Which silent ssh hosts a fleet's health round starts the agent of again, and how long one
that stays silent waits before its next try. Pure: FleetWorkflow calls it with its own state.

An ssh host's agent is started by the control plane over SSH (provisioning), but placement only
takes hosts whose agent answers: without these restarts, a host whose agent died (a reboot, an
OOM kill) would never take a job again. The tries back off so a host that cannot be reached
is not logged into every round."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta

from gpuflow.workflows.models import FleetHost, HostPing, Revival

REVIVE_PATCH = "fleet-revive-ssh-agents"
"""Runs recorded before the health round restarted agents replay without those steps."""
REVIVALS_PER_ROUND = 64
"""Agents a round starts at most; the others wait for the next round."""
REVIVE_BACKOFF_MAX = timedelta(minutes=10)
"""The longest wait between two tries on a host that stays silent."""


def due(
    hosts: Iterable[FleetHost],
    pings: Iterable[HostPing],
    revivals: Mapping[str, Revival],
    now: datetime,
) -> list[FleetHost]:
    """The ssh hosts whose agent did not answer and whose backoff has passed, in the hosts'
    order, at most REVIVALS_PER_ROUND."""
    silent = {ping.host_id for ping in pings if not ping.answered}
    chosen: list[FleetHost] = []
    for host in hosts:
        if not host.ssh or host.host_id not in silent:
            continue
        revival = revivals.get(host.host_id)
        if revival is None or revival.next_at <= now:
            chosen.append(host)
            if len(chosen) == REVIVALS_PER_ROUND:
                break
    return chosen


def after_round(
    revivals: Mapping[str, Revival],
    *,
    hosts: Iterable[FleetHost],
    pings: Iterable[HostPing],
    tried: Iterable[str],
    now: datetime,
    interval: timedelta,
) -> dict[str, Revival]:
    """The backoff after a round: a host that answered (or left the fleet) starts over; one
    tried in vain waits twice as long as the last time (one interval the first time), up to
    REVIVE_BACKOFF_MAX."""
    present = {host.host_id for host in hosts}
    answered = {ping.host_id for ping in pings if ping.answered}
    kept = {
        hid: revival for hid, revival in revivals.items() if hid in present and hid not in answered
    }
    for hid in tried:
        if hid in answered or hid not in present:
            continue
        tries = kept[hid].tries + 1 if hid in kept else 1
        kept[hid] = Revival(tries=tries, next_at=now + backoff(tries, interval))
    return kept


def backoff(tries: int, interval: timedelta) -> timedelta:
    """The wait after `tries` tries in vain: one interval, then twice as long each time."""
    return min(interval * (1 << min(max(tries - 1, 0), 16)), REVIVE_BACKOFF_MAX)
