"""The fast path's shortlist: the hosts that can still win a placement.

Hosts are grouped by usage state (alike hosts in alike states score alike), and states are
bucketed by the room they have (index.StatePools), so a request looks at one host per state
among the states that might take it, instead of at every host.
"""

from __future__ import annotations

from gpuflow.scheduler.filters import Context
from gpuflow.scheduler.index import HostView, SnapshotIndex, StatePools
from gpuflow.scheduler.request import Request


def contenders(hosts: list[HostView], ctx: Context, *, per_host: bool) -> list[HostView]:
    """The hosts that can win, for the fast path: those of states that have room for this kind
    of request and, of hosts alike in class and usage, only the first (ties go to it anyway).

    Hosts left out would fit no better than one kept, so the verdict is the one the full list
    gives; when nothing fits, the caller runs the filters over every host to word the reasons.
    """
    request, index = ctx.request, ctx.index
    if request.selected_hosts is not None or len(hosts) < 64:
        return hosts
    groups = _groups(ctx)
    admitted = static_orders(index, ctx.fleet.name, hosts)
    members = index.members
    if admitted is None and not per_host:
        return [members[state_id][0] for group in groups for state_id in group]
    chosen: list[HostView] = []
    for state_id in (state_id for group in groups for state_id in group):
        for view in members[state_id]:
            if admitted is None or view.order in admitted:
                chosen.append(view)
                if not per_host:
                    break
    return chosen


def contender_states(hosts: list[HostView], ctx: Context) -> list[set[int]] | None:
    """The same shortlist as usage states (each stands for its first host), when every host of
    the fleet passed the static filters; None when it must be built host by host."""
    request, index = ctx.request, ctx.index
    if request.selected_hosts is not None or len(hosts) < 64:
        return None
    if static_orders(index, ctx.fleet.name, hosts) is not None:
        return None
    return _groups(ctx)


def _groups(ctx: Context) -> list[set[int]]:
    """States that have room for this kind of request (a superset of those that fit)."""
    return ctx.index.pools[ctx.fleet.name].with_room(room_of(ctx.request))


def room_of(request: Request) -> tuple[int, int]:
    """The room a state must have to be worth a look (see StatePools.room_for)."""
    gpus = request.gpu_min if request.wants_gpu else 0
    return StatePools.room_for(request.fraction, gpus, request.cpus)


def static_orders(index: SnapshotIndex, fleet: str, hosts: list[HostView]) -> set[int] | None:
    """Orders of the hosts that passed the static filters; None when all of the fleet did."""
    if len(hosts) == len(index.fleet_hosts[fleet]):
        return None
    found = index.admitted.get(id(hosts))
    if found is None or found[0] is not hosts:
        found = index.admitted[id(hosts)] = (hosts, {view.order for view in hosts})
    return found[1]
