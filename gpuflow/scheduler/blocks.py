"""Hosts split into equal blocks.

A host with `blocks = B > 1` is cut into B equal parts: block i holds GPUs [i*g, (i+1)*g) with
g = GPUs / B, and a B-th of the CPUs, memory and disk. A job takes the smallest number of free
blocks that covers its request and holds them whole (nobody else uses the rest of a block). GPU
fractions are not offered on split hosts: a block is the unit of sharing there, and allowing
both would let two kinds of accounting disagree about one GPU.
"""

from __future__ import annotations

from gpuflow.scheduler.model import HostSnapshot


def block_of_gpu(host: HostSnapshot, index: int) -> int:
    per_block = max(1, len(host.gpus) // max(1, host.blocks))
    return index // per_block


def gpus_of_block(host: HostSnapshot, block: int) -> range:
    per_block = len(host.gpus) // max(1, host.blocks)
    return range(block * per_block, (block + 1) * per_block)


def blocks_busy(host: HostSnapshot) -> tuple[int, int]:
    """(taken, total) blocks, for `gpuflow fleet list` (e.g. `2/4 busy`); (0, 1) if not split."""
    total = max(1, host.blocks)
    return len([b for b in host.blocks_used if 0 <= b < total]), total


def auto_blocks(gpus: int, cpus: int) -> int:
    """`blocks: auto`: the most blocks that divide both the GPUs and the CPUs evenly."""
    best = 1
    for count in range(1, max(gpus, 1) + 1):
        if gpus % count == 0 and cpus % count == 0:
            best = count
    return best
