"""The fewest running jobs, taken in a given order, whose release lets a job fit: what a
reservation waits for (reservation.py) and what a preemption takes (admission.py).

Both ask the same question of a long list (every running job, ~8,000 on a large fleet) whose
answer is usually near its front. Releasing more never takes room away, so fitting is monotone
in the prefix's length: the search gallops from the front (1, 2, 4, ... jobs) and then bisects
between the last two probes, and the snapshot is moved from one probe to the next by releasing
or restoring only the jobs between them. An answer of k jobs costs O(k) releases and O(log k)
placements, instead of releasing and restoring half the list at every step of a bisection over
all of it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Protocol

from gpuflow.scheduler.model import Placement, Snapshot
from gpuflow.scheduler.usage import apply_placement, release_placement


class Holding(Protocol):
    """A running job: what it holds."""

    @property
    def placement(self) -> Placement: ...


class Released:
    """The first `count` jobs of `order` released from the snapshot; moving to another count
    releases or restores only the jobs between, the latest released first back, so every state
    on the way is one the snapshot has been in."""

    def __init__(self, snapshot: Snapshot, order: Sequence[Holding]) -> None:
        self.snapshot, self.order, self.count = snapshot, order, 0

    def to(self, count: int) -> None:
        while self.count < count:
            release_placement(self.snapshot, self.order[self.count].placement)
            self.count += 1
        while self.count > count:
            self.count -= 1
            apply_placement(self.snapshot, self.order[self.count].placement)


@contextmanager
def releasing(snapshot: Snapshot, order: Sequence[Holding]) -> Iterator[Released]:
    """A `Released` prefix of `order`, every job of it restored when the block ends."""
    released = Released(snapshot, order)
    try:
        yield released
    finally:
        released.to(0)


def shortest(
    released: Released,
    fits: Callable[[], Placement | None],
    *,
    start: int = 0,
    end: int | None = None,
) -> tuple[int, Placement] | None:
    """The fewest jobs k in (start, end] (end: the whole order) whose release makes `fits()`
    return something, with what it returned; None when releasing all `end` does not. The
    caller knows that `start` jobs do not make it fit. `released` is left at some count in
    between: restore it when done."""
    end = len(released.order) if end is None else end
    low, step = start, 1  # low: known not to fit
    while True:
        probe = min(low + step, end)
        if probe <= low:
            return None
        released.to(probe)
        found = fits()
        if found is not None:
            break
        low, step = probe, 2 * step
    high = probe  # fits with high released, not with low
    while high - low > 1:
        middle = (low + high) // 2
        released.to(middle)
        placed = fits()
        if placed is None:
            low = middle
        else:
            high, found = middle, placed
    return high, found
