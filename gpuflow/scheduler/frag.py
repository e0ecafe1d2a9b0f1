"""Expected GPU fragmentation of a host under a fleet's usual request mix.

In the spirit of FGD (Weng et al., "Beware of Fragmentation", USENIX ATC '23): free GPU capacity
is fragmented *for a kind of request* when requests of that kind could not use it. FGD asks
whether one more request of the kind fits; gpuflow asks how much of the host's free GPU capacity
requests of the kind could take if they kept coming, which also sees CPU and memory run out
before the GPUs do. For a typical request t (k GPUs of `need` milli-GPUs each, c CPUs, m MiB):

    slots   = whole free GPUs // k               (k whole GPUs)
            = sum over GPUs of free // need      (a share of one GPU)
    n       = min(slots, free CPUs // c, free memory // m)
    lost(t) = free milli-GPUs - n * k * need     (all of it when n = 0, as in FGD)

A CPU-only t loses the free GPUs only when it does not fit (it never uses them); a t limited to
other GPU models loses all of them. The host's expected fragmentation is the mix-weighted sum of
lost(t); the fragmentation scorer places a job where this grows the least.

A kind limited to some GPU models weighs its share of the requests times the fleet's GPUs over
the GPUs of its models (to the power `scarcity`: 1 by default, 0 weighs by the share alone, as
FGD does): its demand is spread over those GPUs only, so per GPU it presses harder on them than
a kind that may run anywhere. Without this, a job that may run anywhere takes the few GPUs of a
model that pinned jobs wait for as readily as the many GPUs of another model.

`capacity` blends this measure (1) with FGD's one-more-request measure (0): lost(t) = blend *
gpuflow's + (1 - blend) * FGD's. On the openb trace the counting pays off for shared-GPU kinds
and mostly hurts for whole-GPU kinds when multi-GPU jobs are common (they then protect idle hosts
better with FGD's view), hence separate blends (`capacity`, `whole_capacity`). Everything is in
milli-GPUs (1000 = one GPU) and memoized per host state.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuflow.scheduler.fit import Option
from gpuflow.scheduler.index import HostClass, HostView
from gpuflow.scheduler.model import TypicalRequest

DEFAULT_MIX: tuple[TypicalRequest, ...] = (
    TypicalRequest(weight=0.15, cpus=4, memory_mib=16 * 1024),
    TypicalRequest(weight=0.10, gpu_fraction=0.25, cpus=2, memory_mib=8 * 1024),
    TypicalRequest(weight=0.15, gpu_fraction=0.5, cpus=4, memory_mib=16 * 1024),
    TypicalRequest(weight=0.40, gpus=1, cpus=8, memory_mib=32 * 1024),
    TypicalRequest(weight=0.08, gpus=2, cpus=16, memory_mib=64 * 1024),
    TypicalRequest(weight=0.07, gpus=4, cpus=32, memory_mib=128 * 1024),
    TypicalRequest(weight=0.05, gpus=8, cpus=64, memory_mib=256 * 1024),
)
"""Used when the fleet reports no mix of its own: mostly single GPUs, some shares, a few big."""

_SLACK = 1e-6


@dataclass(frozen=True, slots=True)
class _Kind:
    weight: float
    gpus: int
    need: int
    """Milli-GPUs needed on each of its GPUs (1000 for whole GPUs, 0 for CPU-only)."""
    cpus: float
    memory_mib: int
    names: frozenset[str]


_Demand = tuple[tuple[float, float, int], ...]
"""(weight, CPUs, MiB) of the kinds in one GPU group."""


_Group = tuple[float, int, float, float, int, float, int, _Demand]
"""Kinds with the same GPU need: (weight, milli-GPUs per request, blend, least CPUs, least
memory, most CPUs, most memory, demands). A plain tuple: it is unpacked in the hot loop."""


@dataclass(frozen=True, slots=True)
class _ClassKinds:
    """The mix as seen by one host class: kinds grouped by their GPU need."""

    lost: float
    """Weight of the kinds that can never use this class's GPUs (other models)."""
    cpu_only: _Demand
    whole: tuple[int, ...]
    """GPU counts of the groups of kinds that take whole GPUs."""
    shares: tuple[int, ...]
    """Milli-GPUs of the groups of kinds that take a share of one GPU."""
    groups: tuple[_Group, ...]
    """The whole-GPU groups, then the share groups, in the order above."""


def alike_merged(demands: list[tuple[float, float, int]]) -> _Demand:
    """One demand per (CPUs, MiB): kinds that differ only in the GPU models they accept are
    alike on a host that all of them may use, and the hot loop walks each demand."""
    weights: dict[tuple[float, int], float] = {}
    for weight, cpus, memory in demands:
        weights[cpus, memory] = weights.get((cpus, memory), 0.0) + weight
    return tuple((weight, cpus, memory) for (cpus, memory), weight in weights.items())


class Workload:
    """A request mix, prepared for fast evaluation; one per fleet mix."""

    def __init__(
        self,
        mix: list[TypicalRequest] | tuple[TypicalRequest, ...],
        *,
        capacity: float = 1.0,
        whole_capacity: float | None = None,
        supply: Mapping[str, int] | None = None,
        scarcity: float = 1.0,
    ) -> None:
        """`supply`: the fleet's GPUs per model; a kind limited to some models weighs its share
        of the requests times (fleet's GPUs / its models' GPUs) ** `scarcity` (0: FGD's weights)."""
        self.capacity = min(1.0, max(0.0, capacity))
        """1: gpuflow's measure; 0: FGD's; in between, that blend of the two."""
        self.whole_capacity = self.capacity if whole_capacity is None else whole_capacity
        supply = supply or {}
        fleet_gpus = sum(supply.values())
        merged: dict[tuple[Any, ...], float] = {}
        for item in mix:
            if item.weight <= 0:
                continue
            if item.gpu_fraction is not None and 0 < item.gpu_fraction < 1:
                gpus, need = 1, round(item.gpu_fraction * 1000)
            else:
                gpus, need = item.gpus, 1000 if item.gpus else 0
            weight = item.weight
            if gpus and item.gpu_names:
                eligible = sum(supply.get(name, 0) for name in item.gpu_names)
                if eligible:
                    weight *= (fleet_gpus / eligible) ** scarcity
            key = (gpus, need, float(item.cpus), int(item.memory_mib), item.gpu_names)
            merged[key] = merged.get(key, 0.0) + weight
        total = sum(merged.values()) or 1.0
        self.kinds = [
            _Kind(weight / total, gpus, need, cpus, memory, names)
            for (gpus, need, cpus, memory, names), weight in merged.items()
        ]
        self._per_class: dict[int, _ClassKinds] = {}
        self._memo: dict[tuple[Any, ...], float] = {}
        self._slots: dict[tuple[int, tuple[int, ...]], tuple[tuple[int, int], ...]] = {}

    def _kinds_for(self, cls: HostClass) -> _ClassKinds:
        found = self._per_class.get(cls.id)
        if found is not None:
            return found
        models = {gpu.name for gpu in cls.sample.gpus}
        lost = 0.0
        cpu_only: list[tuple[float, float, int]] = []
        whole: dict[int, list[tuple[float, float, int]]] = {}
        shares: dict[int, list[tuple[float, float, int]]] = {}
        for kind in self.kinds:
            demand = (kind.weight, kind.cpus, kind.memory_mib)
            if kind.gpus == 0:
                cpu_only.append(demand)
            elif kind.names and not models & kind.names:
                lost += kind.weight
            elif kind.need >= 1000:
                whole.setdefault(kind.gpus, []).append(demand)
            else:
                shares.setdefault(kind.need, []).append(demand)

        def grouped(
            groups: dict[int, list[tuple[float, float, int]]], milli: int, blend: float
        ) -> list[_Group]:
            return [
                (
                    sum(d[0] for d in demands),
                    size * milli,
                    blend,
                    min(d[1] for d in demands),
                    min(d[2] for d in demands),
                    max(d[1] for d in demands),
                    max(d[2] for d in demands),
                    alike_merged(demands),
                )
                for size, demands in sorted(groups.items())
            ]

        found = self._per_class[cls.id] = _ClassKinds(
            lost,
            tuple(cpu_only),
            tuple(sorted(whole)),
            tuple(sorted(shares)),
            (*grouped(whole, 1000, self.whole_capacity), *grouped(shares, 1, self.capacity)),
        )
        return found

    def fragmentation(
        self, cls: HostClass, free: tuple[int, ...], cpus: float, memory: int
    ) -> float:
        """Expected lost milli-GPUs of a host with `free` (ascending) milli-GPUs per GPU."""
        key = (cls.id, free, round(cpus, 6), memory)
        found = self._memo.get(key)
        if found is not None:
            return found
        total = sum(free)
        result = 0.0
        if total:
            kinds = self._kinds_for(cls)
            cpus += _SLACK
            result = total * kinds.lost
            for weight, need_cpus, need_memory in kinds.cpu_only:
                if need_cpus > cpus or need_memory > memory:
                    result += weight * total
            slots_small = self._slots.get((cls.id, free))
            if slots_small is None:
                slots_small = self._slots_of(cls, kinds, free)
            for (slots, small), group in zip(slots_small, kinds.groups, strict=True):
                weight, size, blend, least_cpus, least_memory, most_cpus, most_memory, demands = (
                    group
                )
                if slots == 0 or least_cpus > cpus or least_memory > memory:
                    result += weight * total
                elif most_cpus * slots <= cpus and most_memory * slots <= memory:
                    # The GPUs run out first for every kind of the group.
                    result += weight * (blend * (total - slots * size) + (1 - blend) * small)
                else:
                    lost = 0.0
                    kept = (1 - blend) * small
                    for weight, need_cpus, need_memory in demands:
                        # A float count (from the CPUs) is a whole number: same arithmetic.
                        count: float = slots
                        if need_cpus > 0:
                            by_cpu = cpus // need_cpus
                            if by_cpu < count:
                                count = by_cpu
                        if need_memory > 0:
                            by_memory = memory // need_memory
                            if by_memory < count:
                                count = by_memory
                        if count == 0:
                            lost += weight * total
                        else:
                            lost += weight * (blend * (total - count * size) + kept)
                    result += lost
        if len(self._memo) > 500_000:
            self._memo.clear()
        self._memo[key] = result
        return result

    def _slots_of(
        self, cls: HostClass, kinds: _ClassKinds, free: tuple[int, ...]
    ) -> tuple[tuple[int, int], ...]:
        """Per group: how many requests the free GPUs alone could take, and the milli-GPUs
        too small for one (FGD's loss)."""
        partial = bisect_left(free, 1000)  # GPUs with less than a whole GPU free
        whole_free = len(free) - partial
        small = sum(free[:partial])
        found: list[tuple[int, int]] = [(whole_free // gpus, small) for gpus in kinds.whole]
        shared = free[bisect_right(free, 0) : partial]
        for need in kinds.shares:
            slots = whole_free * (1000 // need)
            for value in shared:
                slots += value // need
            small = 0 if self.capacity == 1 else sum(free[: bisect_left(free, need)])
            found.append((slots, small))
        if len(self._slots) > 100_000:
            self._slots.clear()
        result = self._slots[(cls.id, free)] = tuple(found)
        return result


def host_free(view: HostView) -> tuple[float, int]:
    cls = view.cls
    if cls.blocks > 1:
        count = len(view.blocks_free)
        return cls.block_cpus * count, cls.block_memory * count
    return view.cpus_free, view.memory_free


def growth(workload: Workload, view: HostView, option: Option, before: float) -> float:
    """How much expected fragmentation (milli-GPUs) seating `option` on the host adds."""
    cls = view.cls
    free = list(view.free_milli)
    if cls.blocks > 1:
        per_block = max(cls.block_gpus, 1)
        for block in option.blocks:
            for i in range(block * per_block, (block + 1) * per_block):
                free[i] = 0
    elif option.fraction is not None:
        for i in option.gpus:
            free[i] = max(0, free[i] - round(option.fraction * 1000))
    else:
        for i in option.gpus:
            free[i] = 0
    cpus, memory = host_free(view)
    after = workload.fragmentation(
        cls, tuple(sorted(free)), cpus - option.cpus, memory - option.memory_mib
    )
    return after - before


def current(workload: Workload, view: HostView) -> float:
    cpus, memory = host_free(view)
    return workload.fragmentation(view.cls, tuple(sorted(view.free_milli)), cpus, memory)
