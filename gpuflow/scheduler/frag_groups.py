"""The request mix as the fragmentation measure (frag.py) walks it: kinds of request grouped
by their GPU need per host class, and the per-group arithmetic of its hot loop. Only frag.py
uses these; they live apart to keep each module readable."""

from __future__ import annotations

from dataclasses import dataclass

from gpuflow.scheduler.index import HostClass
from gpuflow.scheduler.model import TypicalRequest

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

_Needs = tuple[tuple[float, float, int, float], ...]
"""(weight, CPUs, MiB, idle loss) of the kinds in one GPU group on one host class."""


_Idle = tuple[tuple[float, ...], tuple[float, ...], tuple[float, ...]]
"""A group's idle losses, ascending, with the running sums of weight and weight x loss up to
each (one more entry, 0 first)."""

_Group = tuple[float, int, float, float, int, float, int, _Needs, _Idle | None, int]
"""Kinds with the same GPU need (a run of them): (weight, milli-GPUs per request, blend, least
CPUs, least memory, most CPUs, most memory, demands, idle losses or None when all are 0, the
position of its GPU need in `whole` + `shares`)."""

_RUN = 8
"""Kinds per run of a GPU group (sorted by CPUs, then memory)."""


_Rest = tuple[int, int, float, float, _Needs]
"""(slots, milli-GPUs per request, blend, FGD's part of the loss, demands) of a group."""

_Step = tuple[float, int, float, int, float, float, _Rest]
"""A group with free GPU slots, as the measure walks it: (least CPUs, least memory, CPUs and
memory its hungriest kind needs for all slots, its loss when no kind fits, its loss when the
GPUs run out first, the rest for counting kind by kind)."""

_Plan = tuple[int, float, float, int, float, tuple[_Step, ...]]
"""(free milli-GPUs, loss that does not depend on CPUs or memory, CPUs and memory from which
the GPUs run out first for every group, the groups' loss then, groups with slots)."""


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
    per_gpu: tuple[int, ...]
    """How many of each share one whole GPU holds."""
    groups: tuple[_Group, ...]
    """The whole-GPU groups, then the share groups, in the order above (each in runs)."""
    cpu_steps: list[float]
    memory_steps: list[int]
    """Every amount of free CPUs / memory at which some count below changes (j x a kind's
    need, for j up to the requests of the kind the class's GPUs could hold), ascending: two
    hosts whose free CPUs (memory) lie between the same two steps lose the same."""


def alike_merged(demands: list[tuple[float, float, int]]) -> _Demand:
    """One demand per (CPUs, MiB): kinds that differ only in the GPU models they accept are
    alike on a host that all of them may use, and the hot loop walks each demand."""
    weights: dict[tuple[float, int], float] = {}
    for weight, cpus, memory in demands:
        weights[cpus, memory] = weights.get((cpus, memory), 0.0) + weight
    return tuple((weight, cpus, memory) for (cpus, memory), weight in weights.items())


def class_kinds(
    kinds: list[_Kind], cls: HostClass, *, capacity: float, whole_capacity: float, idle: float
) -> _ClassKinds:
    """The mix as seen by one host class (`Workload`'s blends and idle share given): its kinds
    grouped by their GPU need, in runs, each with what it would lose on an idle host of the
    class, and the steps of free CPUs and memory at which some count changes."""
    models = {gpu.name for gpu in cls.sample.gpus}
    lost = 0.0
    cpu_only: list[tuple[float, float, int]] = []
    whole: dict[int, list[tuple[float, float, int]]] = {}
    shares: dict[int, list[tuple[float, float, int]]] = {}
    for kind in kinds:
        demand = (kind.weight, kind.cpus, kind.memory_mib)
        if kind.gpus == 0:
            cpu_only.append(demand)
        elif kind.names and not models & kind.names:
            lost += kind.weight
        elif kind.need >= 1000:
            whole.setdefault(kind.gpus, []).append(demand)
        else:
            shares.setdefault(kind.need, []).append(demand)

    sample = cls.sample
    idle_total = cls.n_gpus * 1000
    idle_cpus = float(sample.cpus) + _SLACK
    idle_memory = sample.memory_mib

    def idle_loss(slots: int, size: int, cpus: float, memory: int) -> float:
        """What one kind loses on an idle host of the class (the measure of frag.py)."""
        count: float = slots
        if cpus > 0:
            count = min(count, idle_cpus // cpus)
        if memory > 0:
            count = min(count, idle_memory // memory)
        if count == 0:
            return 0.0  # never fits: all of a host's free GPUs are lost to it, as in FGD
        return idle * (idle_total - count * size)

    def grouped(
        groups: dict[int, list[tuple[float, float, int]]], milli: int, blend: float, first: int
    ) -> list[_Group]:
        """Per GPU need, its kinds in runs of alike CPU and memory needs (`_RUN`): a run
        whose every kind has CPUs and memory for all the GPU slots is counted at once."""
        found: list[_Group] = []
        for position, (size, demands) in enumerate(sorted(groups.items()), start=first):
            per = size * milli
            slots = cls.n_gpus // size if milli == 1000 else cls.n_gpus * (1000 // size)
            needs = sorted(
                (cpus, memory, weight, idle_loss(slots, per, cpus, memory))
                for weight, cpus, memory in alike_merged(demands)
            )
            for start in range(0, len(needs), _RUN):
                run = tuple((w, c, m, floor) for c, m, w, floor in needs[start : start + _RUN])
                found.append(
                    (
                        sum(need[0] for need in run),
                        per,
                        blend,
                        min(need[1] for need in run),
                        min(need[2] for need in run),
                        max(need[1] for need in run),
                        max(need[2] for need in run),
                        run,
                        _idle_sums(run),
                        position,
                    )
                )
        return found

    groups = (
        *grouped(whole, 1000, whole_capacity, 0),
        *grouped(shares, 1, capacity, len(whole)),
    )
    cpu_steps: set[float] = set()
    memory_steps: set[int] = set()
    for _, need_cpus, need_memory in cpu_only:
        cpu_steps.add(need_cpus)
        memory_steps.add(need_memory)
    sizes = (*sorted(whole), *sorted(shares))
    for group in groups:
        gpus = sizes[group[9]]
        most = cls.n_gpus // gpus if group[1] >= 1000 else cls.n_gpus * (1000 // gpus)
        for _, need_cpus, need_memory, _ in group[7]:
            cpu_steps.update(j * need_cpus for j in range(1, most + 1))
            memory_steps.update(j * need_memory for j in range(1, most + 1))
    return _ClassKinds(
        lost,
        tuple(cpu_only),
        tuple(sorted(whole)),
        tuple(sorted(shares)),
        tuple(1000 // need for need in sorted(shares)),
        groups,
        sorted(cpu_steps),
        sorted(memory_steps),
    )


def _counted(rest: _Rest, total: int, cpus: float, memory: int) -> float:
    """A group's loss when CPUs or memory may run out before its GPU slots, kind by kind."""
    slots, size, blend, kept, needs = rest
    result = 0.0
    for weight, need_cpus, need_memory, floor in needs:
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
            result += weight * total
        else:
            counted = total - count * size - floor
            if counted > 0:
                result += weight * (blend * counted + kept)
            else:
                result += weight * kept
    return result


def _idle_sums(needs: _Needs) -> _Idle | None:
    if all(need[3] == 0 for need in needs):
        return None
    ordered = sorted((idle, weight) for weight, _, _, idle in needs)
    weights = [0.0]
    weighted = [0.0]
    for idle, weight in ordered:
        weights.append(weights[-1] + weight)
        weighted.append(weighted[-1] + weight * idle)
    return tuple(idle for idle, _ in ordered), tuple(weights), tuple(weighted)


def _pinned_demand(
    mix: list[TypicalRequest] | tuple[TypicalRequest, ...],
) -> dict[frozenset[str], float]:
    """Per set of GPU models: the share of the mix's GPU demand that may run on those only."""
    amounts: dict[frozenset[str], float] = {}
    total = 0.0
    for item in mix:
        if item.weight <= 0:
            continue
        share = item.gpu_fraction if item.gpu_fraction is not None and item.gpu_fraction < 1 else 0
        amount = item.weight * (share or item.gpus)
        total += amount
        if item.gpu_names and amount:
            amounts[item.gpu_names] = amounts.get(item.gpu_names, 0.0) + amount
    return {names: amount / (total or 1.0) for names, amount in amounts.items()}
