"""Expected GPU fragmentation of a host under a fleet's usual request mix.

In the spirit of FGD (Weng et al., "Beware of Fragmentation", USENIX ATC '23): free GPU capacity
is fragmented *for a kind of request* when that request could not use it. For a typical request
t and a host:

- if t cannot run on the host right now (too few GPUs with enough free share, too few CPUs or
  too little memory, wrong GPU model), all of the host's free GPU capacity is lost to t;
- otherwise the free capacity of the GPUs that have less free than t needs of one GPU is lost.

The host's expected fragmentation is the mix-weighted sum over t. The fragmentation scorer
places a job where this grows the least. Everything here is in milli-GPUs (1000 = one GPU) and
memoized per host state, since alike hosts in alike states are common.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
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


@dataclass(frozen=True, slots=True)
class _Kind:
    weight: float
    gpus: int
    need: int
    """Milli-GPUs needed on each of its GPUs (1000 for whole GPUs)."""
    cpu_rank: int
    memory_rank: int
    names: frozenset[str]


class Workload:
    """A request mix, prepared for fast evaluation; one per fleet mix."""

    def __init__(self, mix: list[TypicalRequest] | tuple[TypicalRequest, ...]) -> None:
        merged: dict[tuple[Any, ...], float] = {}
        for item in mix:
            if item.weight <= 0:
                continue
            if item.gpu_fraction is not None and 0 < item.gpu_fraction < 1:
                gpus, need = 1, round(item.gpu_fraction * 1000)
            else:
                gpus, need = item.gpus, 1000 if item.gpus else 0
            key = (gpus, need, float(item.cpus), item.memory_mib, item.gpu_names)
            merged[key] = merged.get(key, 0.0) + item.weight
        total = sum(merged.values()) or 1.0
        self.cpu_levels = sorted({key[2] for key in merged})
        self.memory_levels = sorted({key[3] for key in merged})
        self.kinds = [
            _Kind(
                weight / total, gpus, need,
                self.cpu_levels.index(cpus), self.memory_levels.index(memory), names,
            )
            for (gpus, need, cpus, memory, names), weight in merged.items()
        ]
        self._per_class: dict[int, tuple[list[_Kind], float]] = {}
        self._memo: dict[tuple[Any, ...], float] = {}

    def _kinds_for(self, cls: HostClass) -> tuple[list[_Kind], float]:
        """Kinds that may use this class's GPUs, and the weight of those that never can."""
        found = self._per_class.get(cls.id)
        if found is None:
            models = {gpu.name for gpu in cls.sample.gpus}
            usable = [k for k in self.kinds if not k.names or models & k.names]
            lost = sum(k.weight for k in self.kinds if k.names and not models & k.names)
            found = self._per_class[cls.id] = (usable, lost)
        return found

    def fragmentation(
        self, cls: HostClass, free: tuple[int, ...], cpus: float, memory: float
    ) -> float:
        """Expected lost milli-GPUs of a host with `free` (ascending) milli-GPUs per GPU."""
        cpu_rank = bisect_right(self.cpu_levels, cpus + 1e-9)
        memory_rank = bisect_right(self.memory_levels, memory)
        key = (cls.id, free, cpu_rank, memory_rank)
        found = self._memo.get(key)
        if found is not None:
            return found
        kinds, lost_weight = self._kinds_for(cls)
        total = sum(free)
        count = len(free)
        prefix = [0]
        for value in free:
            prefix.append(prefix[-1] + value)
        result = total * lost_weight
        for kind in kinds:
            if kind.cpu_rank >= cpu_rank or kind.memory_rank >= memory_rank:
                result += kind.weight * total
            elif kind.gpus == 0:
                continue
            else:
                short = bisect_left(free, kind.need)
                if count - short < kind.gpus:
                    result += kind.weight * total
                else:
                    result += kind.weight * prefix[short]
        if len(self._memo) > 500_000:
            self._memo.clear()
        self._memo[key] = result
        return result


def free_milli(view: HostView) -> list[int]:
    """Free milli-GPUs per GPU; on a split host, GPUs of taken blocks count as taken."""
    cls = view.cls
    if cls.blocks > 1:
        per_block = max(cls.block_gpus, 1)
        open_blocks = set(view.blocks_free)
        return [1000 if i // per_block in open_blocks else 0 for i in range(cls.n_gpus)]
    return [max(0, round((1 - used) * 1000)) for used in view.gpu_used]


def host_free(view: HostView) -> tuple[float, float]:
    cls = view.cls
    if cls.blocks > 1:
        count = len(view.blocks_free)
        return cls.block_cpus * count, cls.block_memory * count
    return view.cpus_free, view.memory_free


def growth(workload: Workload, view: HostView, option: Option, before: float) -> float:
    """How much expected fragmentation (milli-GPUs) seating `option` on the host adds."""
    cls = view.cls
    free = free_milli(view)
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
    return workload.fragmentation(view.cls, tuple(sorted(free_milli(view))), cpus, memory)
