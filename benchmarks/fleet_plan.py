"""The arrivals' plan of benchmarks/fleet_scale.py (which arrivals are released, and before
which arrival) and the pure function's run on it, the quality the product is held to."""

from __future__ import annotations

import random
from collections import defaultdict

from openb import Node, OnlineMix, Pod, job_of, snapshot_of

from gpuflow.scheduler import apply_placement, place, release_placement
from gpuflow.scheduler.model import Placement

RELEASE_EVERY = 10


def release_plan(sequence: list[Pod], seed: int) -> dict[int, int]:
    """Every tenth arrival, if placed, is released before a later arrival drawn at random:
    arrival index -> the arrival index it is released before. The pure function and the
    product follow the same plan."""
    rng = random.Random(seed)
    return {
        i: rng.randint(i + 1, len(sequence))
        for i in range(RELEASE_EVERY - 1, len(sequence), RELEASE_EVERY)
    }


def grouped_releases(releases: dict[int, int], in_flight: int) -> dict[int, int]:
    """The release plan as groups of `in_flight` submits follow it: a release planned before an
    arrival inside a group happens before the next group (the pure function follows the same
    plan, so both see the same arrivals and releases)."""
    return {i: -(-before // in_flight) * in_flight for i, before in releases.items()}


def pure_run(
    nodes: list[Node], sequence: list[Pod], releases: dict[int, int], capacity: int
) -> tuple[float, int]:
    """Unallocated % at 100% arrived demand for the pure function, and arrivals it took."""
    snapshot = snapshot_of(nodes, "fragmentation", [])
    learned = OnlineMix(snapshot.fleets[0])
    due: dict[int, list[tuple[Pod, Placement]]] = defaultdict(list)
    arrived = held = 0
    for i, pod in enumerate(sequence):
        for gone, placement in due.pop(i, []):
            release_placement(snapshot, placement)
            arrived -= gone.gpu_milli_total
            held -= gone.gpu_milli_total
        job = job_of(pod)
        learned.arrived(job)
        result = place(job, snapshot)
        arrived += pod.gpu_milli_total
        if isinstance(result, Placement):
            apply_placement(snapshot, result)
            held += pod.gpu_milli_total
            if i in releases:
                due[releases[i]].append((pod, result))
        if arrived >= capacity:
            return 100 - held / capacity * 100, i + 1
    return 100 - held / capacity * 100, len(sequence)
