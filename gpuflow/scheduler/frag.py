"""Expected GPU fragmentation of a host under a fleet's usual request mix.

In the spirit of FGD (Weng et al., "Beware of Fragmentation", USENIX ATC '23): free GPU capacity
is fragmented *for a kind of request* when requests of that kind could not use it. FGD asks
whether one more request of the kind fits; gpuflow asks how much of the host's free GPU capacity
requests of the kind could take if they kept coming, which also sees CPU and memory run out
before the GPUs do. For a typical request t (k GPUs of `need` milli-GPUs each, c CPUs, m MiB):

    slots   = whole free GPUs // k               (k whole GPUs)
            = sum over GPUs of free // need      (a share of one GPU)
    n       = min(slots, free CPUs // c, free memory // m)
    lost(t) = max(0, free milli-GPUs - n * k * need - idle(t))
              (all of the free milli-GPUs when n = 0, as in FGD)
    idle(t) = what the same count gives on an idle host of the class (0 when t never fits it)

Leaving out `idle(t)` charges a host only for the capacity that using it has made unusable,
not for what t could never take on a host of that size (a 60-CPU 4-GPU request fits once on a
96-CPU 8-GPU host, whatever else runs there; 0.47-GPU shares leave 0.06 of every GPU). Without
it, a job that breaks an idle host shrinks that charge and so looks cheaper than it is, and
small jobs break the few hosts that large jobs need (benchmarks/README.md, Placement).

A CPU-only t loses the free GPUs only when it does not fit (it never uses them); a t limited to
other GPU models loses all of them. The host's expected fragmentation is the mix-weighted sum of
lost(t); the fragmentation scorer places a job where this grows the least.

A kind limited to some GPU models weighs more than its share of the requests: its demand falls
on those GPUs only. Its share is multiplied by its demand per GPU of those models relative to the
fleet's average, counted only for the part of them its own demand can fill: with e the models'
share of the fleet's GPUs and d the share of the GPU demand pinned to exactly those models,
(min(1, d / e) / e) ** `scarcity` (at least 1; `scarcity` 0 weighs by the share alone, as FGD
does). Without it, a job that may run anywhere takes the few GPUs of a model that pinned jobs
wait for as readily as the many GPUs of another; without the cap, a model that pinned jobs
cannot fill is kept from the jobs that could fill the rest.

`capacity` blends this measure (1) with FGD's one-more-request measure (0): lost(t) = blend *
gpuflow's + (1 - blend) * FGD's. On the openb trace the counting pays off for shared-GPU kinds
and mostly hurts for whole-GPU kinds when multi-GPU jobs are common (they then protect idle hosts
better with FGD's view), hence separate blends (`capacity`, `whole_capacity`). Everything is in
milli-GPUs (1000 = one GPU) and memoized per host state; free CPUs and memory enter the memo
keys only as the last step they passed at which some count changes, so hosts that differ below
that share one entry.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Mapping
from typing import Any

from gpuflow.scheduler.fit import Option
from gpuflow.scheduler.frag_groups import (
    _SLACK,
    _ClassKinds,
    _counted,
    _Kind,
    _pinned_demand,
    _Plan,
    _Step,
    class_kinds,
)
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
        idle: float = 1.0,
    ) -> None:
        """`supply`: the fleet's GPUs per model, for the weight of kinds limited to some models
        (`scarcity`, see the module docstring; 0: FGD's weights). `idle` 1 leaves out what a kind
        would lose on an idle host of the class, 0 does not (FGD)."""
        self.capacity = min(1.0, max(0.0, capacity))
        """1: gpuflow's measure; 0: FGD's; in between, that blend of the two."""
        self.whole_capacity = self.capacity if whole_capacity is None else whole_capacity
        self.idle = min(1.0, max(0.0, idle))
        """How much of what a kind would lose on an idle host of the class is left out."""
        supply = supply or {}
        fleet_gpus = sum(supply.values())
        pinned = _pinned_demand(mix)
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
                eligible = sum(supply.get(name, 0) for name in item.gpu_names) / (fleet_gpus or 1)
                if eligible:
                    # Demand per GPU of its models, in the part of them its pinned demand fills.
                    pressure = min(1.0, pinned[item.gpu_names] / eligible) / eligible
                    weight *= max(1.0, pressure) ** scarcity
            key = (gpus, need, float(item.cpus), int(item.memory_mib), item.gpu_names)
            merged[key] = merged.get(key, 0.0) + weight
        total = sum(merged.values()) or 1.0
        self.kinds = [
            _Kind(weight / total, gpus, need, cpus, memory, names)
            for (gpus, need, cpus, memory, names), weight in merged.items()
        ]
        self._per_class: dict[int, _ClassKinds] = {}
        self._memo: dict[tuple[Any, ...], float] = {}
        self._plans: dict[tuple[int, tuple[int, ...]], _Plan] = {}
        self._cpu_unfit: dict[tuple[int, float, int], float] = {}
        self._per_free: dict[tuple[int, ...], list[tuple[int, ...]]] = {}

    def forget(self) -> None:
        """Free the memo tables (the mix was replaced; see scorers._retire)."""
        for table in (self._per_class, self._memo, self._plans, self._cpu_unfit, self._per_free):
            table.clear()

    def _kinds_for(self, cls: HostClass) -> _ClassKinds:
        found = self._per_class.get(cls.id)
        if found is not None:
            return found
        found = self._per_class[cls.id] = class_kinds(
            self.kinds,
            cls,
            capacity=self.capacity,
            whole_capacity=self.whole_capacity,
            idle=self.idle,
        )
        return found

    def fragmentation(
        self, cls: HostClass, free: tuple[int, ...], cpus: float, memory: int
    ) -> float:
        """Expected lost milli-GPUs of a host with `free` (ascending) milli-GPUs per GPU."""
        kinds = self._per_class.get(cls.id) or self._kinds_for(cls)
        # Free CPUs and memory matter only through the steps they have passed.
        steps = kinds.cpu_steps
        passed = bisect_right(steps, cpus + _SLACK)
        cpus = steps[passed - 1] + _SLACK / 2 if passed else 0.0
        steps_memory = kinds.memory_steps
        passed = bisect_right(steps_memory, memory)
        memory = steps_memory[passed - 1] if passed else 0
        key = (cls.id, free, cpus, memory)
        found = self._memo.get(key)
        if found is not None:
            return found
        plan = self._plans.get((cls.id, free))
        if plan is None:
            plan = self._plan(cls, kinds, free)
        total, result, roomy_cpus, roomy_memory, roomy, active = plan
        if total:
            if kinds.cpu_only:
                unfit = self._cpu_unfit.get((cls.id, cpus, memory))
                if unfit is None:
                    unfit = sum(w for w, c, m in kinds.cpu_only if c > cpus or m > memory)
                    if len(self._cpu_unfit) > 100_000:
                        self._cpu_unfit.clear()
                    self._cpu_unfit[cls.id, cpus, memory] = unfit
                # CPU-only kinds lose the GPUs only when they do not fit.
                result += unfit * total
            if cpus >= roomy_cpus and memory >= roomy_memory:
                # The GPUs run out first for every kind of every group.
                result += roomy
            else:
                for (
                    least_cpus,
                    least_memory,
                    most_cpus,
                    most_memory,
                    all_lost,
                    gpu_bound,
                    rest,
                ) in active:
                    if least_cpus > cpus or least_memory > memory:
                        result += all_lost
                    elif most_cpus <= cpus and most_memory <= memory:
                        # The GPUs run out first for every kind of the group.
                        result += gpu_bound
                    else:
                        result += _counted(rest, total, cpus, memory)
        if len(self._memo) > 500_000:
            self._memo.clear()
        self._memo[key] = result
        return result

    def _plan(self, cls: HostClass, kinds: _ClassKinds, free: tuple[int, ...]) -> _Plan:
        """What of the measure depends on the free GPUs alone: the total, the loss of the kinds
        that cannot use them whatever the CPUs and memory, and per group that can: its
        thresholds and its loss when the GPUs run out first (see `_Plan`)."""
        total = sum(free)
        base = 0.0
        active: list[_Step] = []
        if total:
            base = total * kinds.lost
            slots_small = self._slots_of(kinds, free)
            for group in kinds.groups:
                (
                    weight,
                    size,
                    blend,
                    least_cpus,
                    least_memory,
                    most_cpus,
                    most_memory,
                    needs,
                    idle,
                    position,
                ) = group
                slots, small = slots_small[position]
                if slots == 0:
                    base += weight * total
                    continue
                counted = total - slots * size
                if idle is None:
                    gpu_bound = weight * (blend * counted + (1 - blend) * small)
                else:
                    # Each kind counts what exceeds its idle loss: those below `counted`.
                    losses, weights, weighted = idle
                    below = bisect_left(losses, counted)
                    gpu_bound = blend * (counted * weights[below] - weighted[below])
                    gpu_bound += weight * (1 - blend) * small
                active.append(
                    (
                        least_cpus,
                        least_memory,
                        most_cpus * slots,
                        most_memory * slots,
                        weight * total,
                        gpu_bound,
                        (slots, size, blend, (1 - blend) * small, needs),
                    )
                )
        if len(self._plans) > 100_000:
            self._plans.clear()
        roomy_cpus = max((step[2] for step in active), default=0.0)
        roomy_memory = max((step[3] for step in active), default=0)
        roomy = sum(step[5] for step in active)
        plan = (total, base, roomy_cpus, roomy_memory, roomy, tuple(active))
        self._plans[cls.id, free] = plan
        return plan

    def _slots_of(self, kinds: _ClassKinds, free: tuple[int, ...]) -> list[tuple[int, int]]:
        """Per group: how many requests the free GPUs alone could take, and the milli-GPUs
        too small for one (FGD's loss)."""
        partial = bisect_left(free, 1000)  # GPUs with less than a whole GPU free
        whole_free = len(free) - partial
        small = sum(free[:partial])
        found: list[tuple[int, int]] = [(whole_free // gpus, small) for gpus in kinds.whole]
        shares = kinds.shares
        if shares:
            table = self._per_free.get(shares)
            if table is None:
                # Per milli-GPUs left on a GPU: how many of each share it holds.
                table = self._per_free[shares] = [
                    tuple(value // need for need in shares) for value in range(1000)
                ]
            shared = free[bisect_right(free, 0) : partial]
            if not shared:
                by_share: tuple[int, ...] | map[int] = table[0]
            elif len(shared) == 1:
                by_share = table[shared[0]]
            else:
                by_share = map(sum, zip(*[table[value] for value in shared], strict=True))
            if self.capacity == 1:  # gpuflow's measure alone: no FGD's loss to count
                found += [
                    (whole_free * per_gpu + extra, 0)
                    for per_gpu, extra in zip(kinds.per_gpu, by_share, strict=True)
                ]
                return found
            for need, per_gpu, extra in zip(shares, kinds.per_gpu, by_share, strict=True):
                small = sum(free[: bisect_left(free, need)])
                found.append((whole_free * per_gpu + extra, small))
        return found


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
