"""The fast path's winner, kept up to date between placements instead of found by a scan.

A usage state's score for a request never changes (the state is a value), so once every state
of a fleet has been scored for a kind of request, only states that appeared since need scoring:
the states that hosts entered are in the index's journal. A heap per (fleet, scorer, request)
holds (-score, order of the state's first host, state); an entry is believed only while its
state still has hosts and that first host is the one it names, so states that vanished or whose
first host changed are dropped or re-entered when they reach the top. The winner is the one the
scan over every state gives: the best score, ties to the host listed first.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from heapq import heapify, heappop, heappush
from typing import Any

from gpuflow.scheduler.fit import Option
from gpuflow.scheduler.index import SnapshotIndex

Scorer = Callable[[int], tuple[float, Option] | None]
"""A state's (score, best option) for the request, or None when the request does not fit."""


class Ranking:
    """The states that take one kind of request on one fleet, best first."""

    __slots__ = ("entered", "heap", "position")

    def __init__(self, index: SnapshotIndex, states: Iterable[int], score: Scorer) -> None:
        members = index.members
        self.heap: list[tuple[float, int, int]] = []
        self.entered: dict[int, int] = {}
        """State -> the order its newest entry names (states that do not fit are left out)."""
        for state_id in states:
            found = score(state_id)
            if found is not None:
                order = members[state_id][0].order
                self.heap.append((-found[0], order, state_id))
                self.entered[state_id] = order
        heapify(self.heap)
        self.position = index.journal_end

    def catch_up(self, index: SnapshotIndex, score: Scorer) -> bool:
        """Enter the states of hosts whose usage changed since the last look; False when the
        journal no longer reaches back that far (build a new ranking)."""
        if self.position < index.journal_start:
            return False
        # States that hosts entered since: the new ones, and those that may have a new first
        # host (a host's current state is the last it entered).
        changed = set(index.entered[self.position - index.journal_start :])
        members = index.members
        heap = self.heap
        entered = self.entered
        for state_id in changed:
            hosts = members.get(state_id)
            if hosts is None:
                continue
            order = hosts[0].order
            if entered.get(state_id) == order:
                continue
            found = score(state_id)
            if found is not None:
                heappush(heap, (-found[0], order, state_id))
                entered[state_id] = order
        self.position = index.journal_end
        if len(heap) > 8 * len(members) + 64:
            self._compact(members)
        return True

    def best(self, index: SnapshotIndex) -> tuple[float, int, int] | None:
        """(score, order, state) of the winner, or None when no state takes the request."""
        members = index.members
        heap = self.heap
        while heap:
            negative, order, state_id = heap[0]
            hosts = members.get(state_id)
            if hosts is None:  # no host is in this state now; one may be again later
                heappop(heap)
                if self.entered.get(state_id) == order:
                    del self.entered[state_id]
                continue
            first = hosts[0].order
            if first != order:
                heappop(heap)
                if self.entered.get(state_id) != first:
                    heappush(heap, (negative, first, state_id))
                    self.entered[state_id] = first
                continue
            return -negative, order, state_id
        return None

    def _compact(self, members: dict[int, Any]) -> None:
        """Drop the entries of vanished states and stale duplicates."""
        kept: dict[int, tuple[float, int, int]] = {}
        for entry in self.heap:
            hosts = members.get(entry[2])
            if hosts is not None:
                kept[entry[2]] = (entry[0], hosts[0].order, entry[2])
        self.heap = list(kept.values())
        heapify(self.heap)
        self.entered = {state_id: entry[1] for state_id, entry in kept.items()}
