"""Resource fit on one host: GPU model, per-GPU memory, count (ranges, fractions), CPU, memory,
disk and blocks. Returns the ways the job can sit on the host (`Option`s), or why it cannot.

Count ranges take as many free matching GPUs as the host has, up to the range's maximum and at
least its minimum. A fraction takes a share of one GPU; shares on a GPU never add up past 1.
Per-GPU memory is compared in whole GB (GPUs report a little less than their nominal size).
"""

from __future__ import annotations

from typing import NamedTuple

from gpuflow.scheduler.compat import gpu_meets_capability
from gpuflow.scheduler.index import EPSILON, HostClass, HostView, ceil_div
from gpuflow.scheduler.request import Request
from gpuflow.specs.units import format_size_mib


class Option(NamedTuple):
    """One way to seat a node on a host (a named tuple: placement passes build many)."""

    gpus: tuple[int, ...]
    fraction: float | None
    blocks: tuple[int, ...]
    cpus: float
    memory_mib: int
    disk_mib: int


Fit = tuple[Option, ...] | str
"""Options (at least one) or the reason the host cannot take the node."""


def _gb(mib: int) -> int:
    return round(mib / 1024)


def _size(mib: float) -> str:
    return format_size_mib(int(mib))


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def matching_gpus(cls: HostClass, request: Request) -> tuple[int, ...] | str:
    """GPU indices of the model, vendor, memory and capability asked for (static, per class)."""
    memo_key = ("gpus", request.key)
    found: tuple[int, ...] | str | None = cls.memo.get(memo_key)
    if found is not None:
        return found
    gpus = cls.sample.gpus
    if not request.wants_gpu:
        result: tuple[int, ...] | str = ()
    elif not gpus:
        result = f"has no GPUs, job needs {request.describe_gpu()}"
    else:
        pool = [g for g in gpus if request.vendor is None or g.vendor == request.vendor]
        named = [g for g in pool if not request.names or g.name in request.names]
        low, high = request.gpu_memory_min, request.gpu_memory_max
        sized = [
            g
            for g in named
            if _gb(g.memory_mib) >= _gb(low) and (high is None or _gb(g.memory_mib) <= _gb(high))
        ]
        capable = [g for g in sized if gpu_meets_capability(g.compute_capability, request)]
        if capable:
            result = tuple(g.index for g in capable)
        elif not named:
            have = ", ".join(sorted({g.name for g in pool or gpus}))
            result = f"has {have} GPUs, job needs {' or '.join(sorted(request.names))}"
        elif not sized:
            have = ", ".join(sorted({_size(_gb(g.memory_mib) * 1024) for g in named}))
            result = f"GPUs have {have}, job needs {_memory_range(low, high)}"
        else:
            result = f"no GPU has compute capability {request.compute_capability_text} or higher"
    cls.memo[memo_key] = result
    return result


def _memory_range(low: int, high: int | None) -> str:
    if high is not None and high == low:
        return _size(low)
    return f"{_size(low) if low else ''}..{'' if high is None else _size(high)}"


def fit(view: HostView, request: Request, allowed: frozenset[int] | None) -> Fit:
    """How the node can sit on this host now, or why it cannot (reason without host name)."""
    cls = view.cls
    matched = matching_gpus(cls, request)
    if isinstance(matched, str):
        return matched
    candidates = matched if allowed is None else tuple(i for i in matched if i in allowed)
    gpu_word = "GPU" if allowed is None else "named GPU"
    if request.wants_gpu and len(candidates) < max(request.gpu_min, 1 if request.fraction else 0):
        if allowed is not None and not candidates:
            return f"none of the named GPUs ({_indices(allowed)}) fits {request.describe_gpu()}"
        return f"has {_plural(len(candidates), gpu_word)}, job needs {request.describe_gpu()}"
    if request.nodes > 1 and not view.idle:
        return f"busy, and a {request.nodes}-node job needs whole idle hosts"
    if cls.blocks > 1:
        return _fit_blocks(view, request, candidates, gpu_word)
    return _fit_whole_host(view, request, candidates, gpu_word)


def _fit_whole_host(
    view: HostView, request: Request, candidates: tuple[int, ...], gpu_word: str
) -> Fit:
    used = view.gpu_used
    chosen: tuple[tuple[int, ...], ...] = ((),)
    if request.fraction is not None:
        share = request.fraction
        limit = 1 + EPSILON - share
        seen: dict[float, int] = {}
        for i in candidates:
            level = used[i]  # shares are kept rounded (apply_placement), so equal ones compare
            if level <= limit and level not in seen:
                seen[level] = i
        if not seen:
            most = max(1 - used[i] for i in candidates)
            return f"no GPU has {share:g} free (most free: {max(most, 0):.2g})"
        chosen = tuple([(i,) for i in seen.values()])
    elif request.wants_gpu:
        free = [i for i in candidates if used[i] <= EPSILON]
        if len(free) < request.gpu_min:
            return (
                f"{len(free)} of {_plural(len(candidates), gpu_word)} free, "
                f"job needs {request.gpu_min}"
            )
        chosen = (tuple(free if request.gpu_max is None else free[: request.gpu_max]),)
    if (
        request.cpus > view.cpus_free + EPSILON
        or request.memory_mib > view.memory_free
        or request.disk_mib > view.disk_free
    ):
        shortfall = _host_shortfall(view, request.cpus, request.memory_mib, request.disk_mib)
        if shortfall:
            return shortfall
    fraction, cpus, memory, disk = (
        request.fraction,
        request.cpus,
        request.memory_mib,
        request.disk_mib,
    )
    return tuple([Option(gpus, fraction, (), cpus, memory, disk) for gpus in chosen])


def _host_shortfall(view: HostView, cpus: float, memory: int, disk: int) -> str | None:
    cls = view.cls
    if cpus > cls.cpus + EPSILON:
        return f"has {cls.cpus:g} CPUs, job needs {cpus:g}"
    if memory > cls.memory:
        return f"has {_size(cls.memory)} memory, job needs {_size(memory)}"
    if disk > cls.disk:
        return f"has {_size(cls.disk)} disk, job needs {_size(disk)}"
    if cpus > view.cpus_free + EPSILON:
        return f"{max(view.cpus_free, 0):g} of {cls.cpus:g} CPUs free, job needs {cpus:g}"
    if memory > view.memory_free:
        return (
            f"{_size(max(view.memory_free, 0))} of {_size(cls.memory)} memory free, "
            f"job needs {_size(memory)}"
        )
    if disk > view.disk_free:
        return (
            f"{_size(max(view.disk_free, 0))} of {_size(cls.disk)} disk free, "
            f"job needs {_size(disk)}"
        )
    return None


def _fit_blocks(
    view: HostView, request: Request, candidates: tuple[int, ...], gpu_word: str
) -> Fit:
    cls = view.cls
    total = cls.blocks
    if request.fraction is not None:
        return f"split into {total} blocks; a GPU fraction needs a host that is not split"
    per_block = max(cls.block_gpus, 1)
    in_block: dict[int, list[int]] = {}
    for i in candidates:
        in_block.setdefault(i // per_block, []).append(i)
    other = max(
        1,
        ceil_div(request.cpus, cls.block_cpus),
        ceil_div(request.memory_mib, cls.block_memory),
        ceil_div(request.disk_mib, cls.block_disk),
    )
    if request.nodes > 1:
        order = list(range(total))
        needed_all = total
    else:
        order = sorted(view.blocks_free, key=lambda b: (-len(in_block.get(b, ())), b))
        needed_all = _blocks_needed(range(total), in_block, request.gpu_min, other)
    if needed_all > total:
        shortfall = _host_shortfall(view, request.cpus, request.memory_mib, request.disk_mib)
        if shortfall and shortfall.startswith("has "):
            return shortfall
        return f"has {_plural(len(candidates), gpu_word)}, job needs {request.describe_gpu()}"
    taken: list[int] = []
    gpus: list[int] = []
    for block in order:
        if request.nodes == 1 and len(taken) >= other and len(gpus) >= request.gpu_min:
            break
        taken.append(block)
        gpus.extend(i for i in in_block.get(block, ()) if view.gpu_used[i] <= EPSILON)
    if len(taken) < other or len(gpus) < request.gpu_min or len(taken) < needed_all:
        return f"{len(view.blocks_free)} of {total} blocks free, job needs {needed_all}"
    taken.sort()
    gpus.sort()
    if request.gpu_max is not None:
        gpus = gpus[: request.gpu_max]
    if not request.wants_gpu:
        gpus = []
    count = len(taken)
    return (
        Option(
            tuple(gpus),
            None,
            tuple(taken),
            cls.block_cpus * count,
            cls.block_memory * count,
            cls.block_disk * count,
        ),
    )


def _blocks_needed(blocks: range, in_block: dict[int, list[int]], gpu_min: int, other: int) -> int:
    """Fewest blocks of an empty host that hold `gpu_min` matching GPUs and `other` blocks."""
    counts = sorted((len(in_block.get(b, ())) for b in blocks), reverse=True)
    have = 0
    for taken, count in enumerate(counts, start=1):
        have += count
        if have >= gpu_min and taken >= other:
            return taken
    return len(counts) + 1


def _indices(indices: frozenset[int]) -> str:
    return ", ".join(str(i) for i in sorted(indices))
