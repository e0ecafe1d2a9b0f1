"""Marking a placement's resources used in a snapshot, and giving them back.

The store records allocations in its database and builds snapshots from them; these functions
keep an in-memory snapshot in step instead (benchmarks, tests, a long placement pass).
"""

from __future__ import annotations

from gpuflow.scheduler.index import EPSILON, HostView, SnapshotIndex, index_of
from gpuflow.scheduler.model import NodePlacement, Placement, Snapshot


def apply_placement(snapshot: Snapshot, placement: Placement) -> None:
    """Mark the placement's GPUs, shares, blocks, CPU, memory and disk as used.

    All or nothing: raises ValueError (and changes nothing) if any part is no longer free.
    """
    index = index_of(snapshot)
    views = [_view(index, node) for node in placement.nodes]
    for view, node in zip(views, placement.nodes, strict=True):
        problem = _conflict(view, node)
        if problem:
            raise ValueError(f"cannot apply placement on {view.host.name}: {problem}")
    for view, node in zip(views, placement.nodes, strict=True):
        host = view.host
        for i in node.gpu_indices:
            gpu = host.gpus[i]
            gpu.used = round(gpu.used + node.gpu_fraction, 9) if node.gpu_fraction else 1.0
        host.blocks_used.update(node.blocks)
        host.cpus_used = round(host.cpus_used + node.cpus, 9)
        host.memory_used_mib += node.memory_mib
        host.disk_used_mib += node.disk_mib
        index.refresh(view)


def release_placement(snapshot: Snapshot, placement: Placement) -> None:
    """Give back what `apply_placement` took (never below zero)."""
    index = index_of(snapshot)
    for node in placement.nodes:
        view = _view(index, node)
        host = view.host
        for i in node.gpu_indices:
            gpu = host.gpus[i]
            share = node.gpu_fraction or 1.0
            gpu.used = max(0.0, round(gpu.used - share, 9))
        host.blocks_used.difference_update(node.blocks)
        host.cpus_used = max(0.0, round(host.cpus_used - node.cpus, 9))
        host.memory_used_mib = max(0, host.memory_used_mib - node.memory_mib)
        host.disk_used_mib = max(0, host.disk_used_mib - node.disk_mib)
        index.refresh(view)


def _view(index: SnapshotIndex, node: NodePlacement) -> HostView:
    view = index.by_id.get(node.host_id)
    if view is None:
        raise ValueError(f"host {node.host_id} is not in the snapshot")
    if not index.is_current(view):
        index.refresh(view)
    return view


def _conflict(view: HostView, node: NodePlacement) -> str | None:
    host = view.host
    for i in node.gpu_indices:
        if not 0 <= i < len(host.gpus):
            return f"it has no GPU {i}"
        used = host.gpus[i].used
        if node.gpu_fraction:
            if used + node.gpu_fraction > 1 + EPSILON:
                return f"GPU {i} has {max(0.0, 1 - used):.2g} free, not {node.gpu_fraction:g}"
        elif used > EPSILON:
            return f"GPU {i} is taken"
    taken = set(node.blocks) & host.blocks_used
    if taken:
        return f"block {min(taken)} is taken"
    if host.cpus_used + node.cpus > host.cpus + EPSILON:
        return "not enough free CPUs"
    if host.memory_used_mib + node.memory_mib > host.memory_mib:
        return "not enough free memory"
    if host.disk_used_mib + node.disk_mib > host.disk_mib:
        return "not enough free disk"
    return None
