"""The fewest running jobs whose release lets a job fit (gpuflow/scheduler/prefix.py): the same
answer as trying every prefix, at a cost that grows with the answer, not with the list, and the
snapshot left as it was."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from gpuflow.scheduler import Placement, Snapshot, apply_placement, place, release_placement
from gpuflow.scheduler.prefix import Released, releasing, shortest
from tests.unit.scheduler.conftest import load_host, make_job, make_snapshot
from tests.unit.scheduler.test_admission import as_running, waiting

FOUND = Placement(fleet="lab", nodes=[], score=0.0, scorer="test")


class Counted(Released):
    """A prefix that only counts: how far it was moved, and by how many jobs in all."""

    def __init__(self, length: int) -> None:
        super().__init__(make_snapshot(), [object()] * length)  # type: ignore[list-item]
        self.moved = 0

    def to(self, count: int) -> None:
        self.moved += abs(count - self.count)
        self.count = count


@given(
    st.integers(0, 400).flatmap(
        lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(0, n), st.integers(1, n + 1))
    )
)
def test_the_search_finds_the_shortest_prefix_at_a_cost_of_the_answer(
    case: tuple[int, int, int, int],
) -> None:
    length, start, end, needed = case
    start = min(start, end)
    needed = max(needed, start + 1)  # the caller knows `start` jobs are not enough
    released = Counted(length)

    def fits() -> Placement | None:
        return FOUND if released.count >= needed else None

    found = shortest(released, fits, start=start, end=end)
    if needed <= end:
        assert found == (needed, FOUND)
        # galloping past the answer at most doubles the distance from `start`, then the
        # bisection moves back and forth within it
        assert released.moved <= start + 4 * (needed - start)
    else:
        assert found is None
        assert released.moved == (end if end > start else 0)  # straight on to the end, once


def _usage(snapshot: Snapshot) -> list[tuple[str, list[float], float]]:
    return [(h.id, [g.used for g in h.gpus], h.cpus_used) for h in snapshot.hosts()]


@given(st.integers(0, 10_000))
def test_on_a_real_snapshot_it_agrees_with_trying_every_prefix_and_restores_it(
    seed: int,
) -> None:
    rng = random.Random(seed)
    snapshot = make_snapshot(*(load_host("h100x8", name=f"gpu-{i}") for i in range(4)))
    running = []
    for i in range(rng.randint(20, 32)):
        job = waiting(f"r{i}", rng.choice([1, 1, 1, 2, 4]))
        found = place(job.job, snapshot)
        if isinstance(found, Placement):
            apply_placement(snapshot, found)
            running.append(as_running(job, found, now=i))
    rng.shuffle(running)
    big = make_job({"gpu": rng.choice([4, 8])}, name="big")
    before = _usage(snapshot)

    def fits() -> Placement | None:
        found = place(big, snapshot)
        return found if isinstance(found, Placement) else None

    def by_trying_every_prefix() -> int | None:
        for k in range(len(running) + 1):
            for job in running[:k]:
                release_placement(snapshot, job.placement)
            try:
                if fits() is not None:
                    return k
            finally:
                for job in running[:k]:
                    apply_placement(snapshot, job.placement)
        return None

    expected = by_trying_every_prefix()
    with releasing(snapshot, running) as released:
        found = shortest(released, fits) if fits() is None else (0, None)
    assert (found[0] if found else None) == expected
    assert _usage(snapshot) == before
