"""What the scheduler derives from a snapshot, kept with the snapshot between placements.

A placement pass reads every host; recomputing the same facts for 1,000+ hosts on every pass
would cost more than the decision itself. So the scheduler keeps, next to each snapshot:

- host classes: hosts that are alike in everything static (OS, GPUs, size, labels, taints)
  share one class, and static verdicts are decided once per class;
- per host, the usage it last read (`HostView`), and an id of that usage (`state_id`), so that
  fit and score are decided once per distinct state;
- the output of the static filters per request.

The contract this relies on: a Snapshot is a value. Change usage only with `apply_placement` /
`release_placement` (or build a new snapshot, as the store does on every pass); change anything
else (hosts, labels, GPUs) by building a new snapshot. Host states may change in place: they are
compared on every call. Whatever the cache says, the host a placement lands on is read again
before the placement is returned, so a stale cache can never put a job over capacity.
"""

from __future__ import annotations

import math
from bisect import insort
from operator import attrgetter
from typing import Any

from gpuflow.scheduler.model import FleetSnapshot, HostSnapshot, Rejection, Snapshot
from gpuflow.status import HostState

EPSILON = 1e-9
"""Slack for float GPU shares: 0.46 + 0.54 must fit in one GPU."""

_ATTRIBUTE = "_gpuflow_scheduler_index"
_MAX_MEMO = 200_000
_JOURNAL = 20_000
_SHARE_STEPS = 20


class HostClass:
    """Static facts shared by alike hosts; memo tables keyed by request."""

    __slots__ = (
        "block_cpus",
        "block_disk",
        "block_gpus",
        "block_memory",
        "blocks",
        "cpus",
        "disk",
        "id",
        "key",
        "memo",
        "memory",
        "n_gpus",
        "sample",
    )

    def __init__(self, class_id: int, key: tuple[Any, ...], host: HostSnapshot) -> None:
        self.id = class_id
        self.key = key
        self.sample = host
        """One host of the class; static checks read it."""
        self.n_gpus = len(host.gpus)
        self.cpus = float(host.cpus)
        self.memory = host.memory_mib
        self.disk = host.disk_mib
        self.blocks = max(1, host.blocks)
        self.block_gpus = self.n_gpus // self.blocks
        self.block_cpus = self.cpus / self.blocks
        self.block_memory = self.memory // self.blocks
        self.block_disk = self.disk // self.blocks
        self.memo: dict[Any, Any] = {}
        """Static verdicts per request key (compatibility, labels, matching GPUs)."""


def class_key(host: HostSnapshot) -> tuple[Any, ...]:
    return (
        host.os,
        host.arch,
        host.backend,
        host.driver_version,
        tuple((g.name, g.vendor, g.memory_mib, g.compute_capability) for g in host.gpus),
        host.cpus,
        host.memory_mib,
        host.disk_mib,
        host.blocks,
        tuple(sorted(host.labels.items())),
        tuple(host.taints),
    )


def usage_key(host: HostSnapshot) -> tuple[Any, ...]:
    return (
        tuple([g.used for g in host.gpus]),
        host.cpus_used,
        host.memory_used_mib,
        host.disk_used_mib,
        frozenset(host.blocks_used),
    )


class HostView:
    """One host as the scheduler sees it: the snapshot object, its class, its free capacity."""

    __slots__ = (
        "blocks_free",
        "cls",
        "cpus_free",
        "disk_free",
        "fleet",
        "free_milli",
        "gpu_used",
        "host",
        "idle",
        "memory_free",
        "order",
        "state_id",
    )

    def __init__(self, host: HostSnapshot, cls: HostClass, order: int, fleet: str) -> None:
        self.host = host
        self.cls = cls
        self.order = order
        self.fleet = fleet
        self.gpu_used: list[float] = []
        self.free_milli: tuple[int, ...] = ()
        """Free milli-GPUs per GPU (GPUs of taken blocks count as taken), for scoring."""
        self.cpus_free = 0.0
        self.memory_free = 0
        self.disk_free = 0
        self.blocks_free: tuple[int, ...] = ()
        self.idle = True
        self.state_id = -1


class StatePools:
    """The usage states of one fleet, bucketed by the room they have, so that a request looks
    only at states that might take it: by the largest free share of one GPU (twentieths), by
    whole free GPUs (GPUs of free blocks on a split host), and by free CPUs (powers of two)."""

    def __init__(self) -> None:
        self.by_share: list[set[int]] = [set() for _ in range(_SHARE_STEPS + 1)]
        self.by_whole: dict[int, set[int]] = {}
        self.by_cpus: dict[int, set[int]] = {}
        self._where: dict[int, tuple[int, int, int]] = {}

    def add(self, view: HostView) -> None:
        cls = view.cls
        if cls.blocks > 1:
            whole = len(view.blocks_free) * cls.block_gpus
            share = _SHARE_STEPS if whole else 0
            cpus = cls.block_cpus * len(view.blocks_free)
        else:
            whole = sum(1 for used in view.gpu_used if used <= EPSILON)
            most = 1 - min(view.gpu_used) if view.gpu_used else 0.0
            share = min(_SHARE_STEPS, max(0, int(most * _SHARE_STEPS + EPSILON)))
            cpus = view.cpus_free
        cpu_level = max(0, int(cpus + EPSILON)).bit_length()
        self._where[view.state_id] = (share, whole, cpu_level)
        self.by_share[share].add(view.state_id)
        self.by_whole.setdefault(whole, set()).add(view.state_id)
        self.by_cpus.setdefault(cpu_level, set()).add(view.state_id)

    def remove(self, state_id: int) -> None:
        share, whole, cpu_level = self._where.pop(state_id)
        self.by_share[share].discard(state_id)
        self.by_whole[whole].discard(state_id)
        self.by_cpus[cpu_level].discard(state_id)

    @staticmethod
    def room_for(fraction: float | None, gpus: int, cpus: float) -> tuple[int, int]:
        """What a request needs of a state's room: (0: share, 1: whole GPUs, 2: CPUs; level)."""
        if fraction is not None:
            return 0, max(0, int((fraction - EPSILON) * _SHARE_STEPS))
        if gpus > 0:
            return 1, gpus
        return 2, max(0, int(cpus)).bit_length()

    def with_room(self, room: tuple[int, int]) -> list[set[int]]:
        """States that may have the room (a superset of those where the request fits)."""
        axis, level = room
        if axis == 0:
            return self.by_share[level:]
        found = self.by_whole if axis == 1 else self.by_cpus
        return [states for have, states in found.items() if have >= level]

    def has_room(self, state_id: int, room: tuple[int, int]) -> bool:
        """Whether the state is among `with_room(room)`."""
        where = self._where.get(state_id)
        return where is not None and where[room[0]] >= room[1]


class SnapshotIndex:
    def __init__(self, snapshot: Snapshot) -> None:
        self.fleets: dict[str, FleetSnapshot] = {}
        self.fleet_hosts: dict[str, list[HostView]] = {}
        self.views: list[HostView] = []
        self.by_id: dict[str, HostView] = {}
        self.classes: dict[tuple[Any, ...], HostClass] = {}
        self.state_ids: dict[tuple[Any, ...], int] = {}
        self.static_memo: dict[Any, tuple[list[HostView], list[Rejection]]] = {}
        self.fit_memo: dict[Any, dict[int, Any]] = {}
        """Per request (and scorer): host state id -> fit, or -> (score, option)."""
        self.rankings: dict[Any, Any] = {}
        """Per fleet, scorer and request: the fast path's ranking of states (ranking.py)."""
        self.workloads: dict[Any, Any] = {}
        """Per fleet mix: the prepared Workload and fragmentation per host state id."""
        self.rejections: dict[tuple[str, str, str], Rejection] = {}
        self.admitted: dict[int, tuple[list[HostView], set[int]]] = {}
        """Per static-filter survivor list: the orders of its hosts."""
        self.resource_rejections: dict[tuple[str, str], Rejection] = {}
        """Resource-fit rejections by (host name, reason): a full explanation is built often."""
        self.members: dict[int, list[HostView]] = {}
        self.journal: list[HostView] = []
        """Hosts whose usage changed, in order; `journal_start` is the position of the first."""
        self.journal_start = 0
        self.entered: list[int] = []
        """Beside the journal: the usage state each of those hosts entered."""
        self.refusals: dict[Any, Any] = {}
        """Per request refused by every host: the explanation and the journal end it saw."""
        """Hosts in each usage state, in snapshot order (alike hosts in alike states)."""
        self.pools: dict[str, StatePools] = {}
        self._shape = self._shape_of(snapshot)
        for fleet in snapshot.fleets:
            self.fleets[fleet.name] = fleet
            self.pools[fleet.name] = StatePools()
            views = self.fleet_hosts.setdefault(fleet.name, [])
            for host in fleet.hosts:
                key = class_key(host)
                cls = self.classes.get(key)
                if cls is None:
                    cls = self.classes[key] = HostClass(len(self.classes), key, host)
                view = HostView(host, cls, len(self.views), fleet.name)
                self.views.append(view)
                views.append(view)
                self.by_id[host.id] = view
                self.refresh(view)
        self.hosts = [view.host for view in self.views]
        self.states = [host.state for host in self.hosts]

    @staticmethod
    def _shape_of(snapshot: Snapshot) -> list[tuple[FleetSnapshot, list[HostSnapshot], int]]:
        return [(fleet, fleet.hosts, len(fleet.hosts)) for fleet in snapshot.fleets]

    def describes(self, snapshot: Snapshot) -> bool:
        """Same fleets and host lists as when the index was built."""
        shape = self._shape
        if len(shape) != len(snapshot.fleets):
            return False
        for (fleet, hosts, count), now in zip(shape, snapshot.fleets, strict=True):
            if fleet is not now or hosts is not now.hosts or count != len(hosts):
                return False
        return True

    def states_changed(self) -> bool:
        """Read every host's state; forget static verdicts if one changed since last read."""
        states = list(map(_STATE, self.hosts))
        if states == self.states:
            return False
        self.states = states
        self.static_memo.clear()
        return True

    def refresh(self, view: HostView) -> None:
        """Read the host's usage again (after apply/release, or when found stale)."""
        host, cls = view.host, view.cls
        view.gpu_used = [gpu.used for gpu in host.gpus]
        view.cpus_free = cls.cpus - host.cpus_used
        view.memory_free = cls.memory - host.memory_used_mib
        view.disk_free = cls.disk - host.disk_used_mib
        view.blocks_free = tuple(i for i in range(cls.blocks) if i not in host.blocks_used)
        if cls.blocks > 1:
            per_block = max(cls.block_gpus, 1)
            open_blocks = set(view.blocks_free)
            view.free_milli = tuple(
                1000 if i // per_block in open_blocks else 0 for i in range(cls.n_gpus)
            )
        else:
            view.free_milli = tuple(max(0, round((1 - used) * 1000)) for used in view.gpu_used)
        view.idle = host.idle
        key = (view.fleet, cls.id, *usage_key(host))
        state_id = self.state_ids.get(key)
        if state_id is None:
            if len(self.state_ids) > _MAX_MEMO:
                self.forget_memos()
                return
            state_id = self.state_ids[key] = len(self.state_ids)
        if state_id != view.state_id:
            self._leave(view)
            view.state_id = state_id
            self._join(view)
            self.journal.append(view)
            self.entered.append(state_id)
            if len(self.journal) > 2 * _JOURNAL:
                del self.journal[:_JOURNAL]
                del self.entered[:_JOURNAL]
                self.journal_start += _JOURNAL

    @property
    def journal_end(self) -> int:
        return self.journal_start + len(self.journal)

    def changed_since(self, position: int) -> list[HostView] | None:
        """Hosts whose usage changed after `position`; None when that is too long ago."""
        if position < self.journal_start:
            return None
        return self.journal[position - self.journal_start :]

    def _join(self, view: HostView) -> None:
        members = self.members.get(view.state_id)
        if members is None:
            self.members[view.state_id] = [view]
            self.pools[view.fleet].add(view)
        else:
            insort(members, view, key=_order)

    def _leave(self, view: HostView) -> None:
        members = self.members.get(view.state_id)
        if members is None:
            return
        members.remove(view)
        if not members:
            del self.members[view.state_id]
            self.pools[view.fleet].remove(view.state_id)

    def is_current(self, view: HostView) -> bool:
        """Whether the cached usage still matches the host (it was not edited by hand)."""
        key = (view.fleet, view.cls.id, *usage_key(view.host))
        return self.state_ids.get(key) == view.state_id

    def refresh_all(self) -> None:
        for view in self.views:
            self.refresh(view)

    def forget_memos(self) -> None:
        """Start the memo tables afresh (they only grow); every host is read again."""
        self.state_ids.clear()
        self.fit_memo.clear()
        self.rankings.clear()
        self.workloads.clear()
        self.resource_rejections.clear()
        self.refusals.clear()
        self.members.clear()
        for fleet in self.pools:
            self.pools[fleet] = StatePools()
        for view in self.views:
            view.state_id = -1
        for view in self.views:
            self.refresh(view)

    def rejection(self, host: str, stage: str, reason: str) -> Rejection:
        """Rejections are values; equal ones are shared, which makes a full explanation cheap."""
        key = (host, stage, reason)
        found = self.rejections.get(key)
        if found is None:
            if len(self.rejections) > _MAX_MEMO:
                self.rejections.clear()
            # Built without validation: three strings the scheduler wrote (explanations of
            # refused requests build many).
            found = Rejection.model_construct(host=host, filter=stage, reason=reason)
            self.rejections[key] = found
        return found


_STATE = attrgetter("state")


def _order(view: HostView) -> int:
    return view.order


def index_of(snapshot: Snapshot) -> SnapshotIndex:
    """The index kept with this snapshot, built on first use (see the module docstring)."""
    index = snapshot.__dict__.get(_ATTRIBUTE)
    if not isinstance(index, SnapshotIndex) or not index.describes(snapshot):
        index = SnapshotIndex(snapshot)
        snapshot.__dict__[_ATTRIBUTE] = index
    return index


def is_ready(host: HostSnapshot) -> bool:
    return host.state == HostState.READY


def ceil_div(need: float, size: float) -> int:
    if need <= 0:
        return 0
    if size <= 0:
        return 1 << 30
    return max(0, math.ceil(need / size - EPSILON))
