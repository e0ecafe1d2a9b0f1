"""Hosts split into equal blocks.

A host with `blocks = B > 1` is cut into B equal parts: block i holds GPUs [i*g, (i+1)*g) with
g = GPUs / B, and a B-th of the CPUs, memory and disk. A job takes the smallest number of free
blocks that covers its request and holds them whole (nobody else uses the rest of a block); a
node of a multi-node job needs every block free and takes them all. GPU
fractions are not offered on split hosts: a block is the unit of sharing there, and allowing
both would let two kinds of accounting disagree about one GPU.
"""

from __future__ import annotations

from gpuflow.scheduler.model import HostSnapshot


def blocks_busy(host: HostSnapshot) -> tuple[int, int]:
    """(taken, total) blocks, for `gpuflow fleet list` (e.g. `2/4 busy`); (0, 1) if not split."""
    total = max(1, host.blocks)
    return len([b for b in host.blocks_used if 0 <= b < total]), total
