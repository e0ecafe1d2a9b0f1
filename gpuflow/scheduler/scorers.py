"""Scorers rank the hosts that fit: higher is better. Ties go to the host listed first.

- `binpack`: the most allocated host after placement (fills one host before starting the next);
  on a host, the fullest GPU that still takes a fraction.
- `spread`: the least allocated host; on a host, the emptiest GPU.
- `fragmentation` (default): where the fleet's expected GPU fragmentation grows the least (see
  frag.py), which keeps whole GPUs and whole hosts free for the jobs that need them; a little
  bin-packing breaks ties.
- `random`: a pseudo-random order per job (a baseline for benchmarks).

Weights come from the fleet's `scorer_weights` (configuration, not code):
`gpu`, `cpu`, `memory` weight the resources in binpack's and spread's allocation ratio
(defaults 1, 0.25, 0.25); `fragmentation` and `binpack` weight the terms of the fragmentation
scorer (defaults 1, 0.05: growth of expected fragmentation in GPUs, then GPU allocation of the
host as a tie-breaker); request kinds limited to some GPU models weigh more in the fleet's mix
the fewer of its GPUs they may use, as far as their own demand can fill them (`scarcity`,
default 1; 0 weighs by the share alone, as FGD does; see frag.py); `idle` (default 1) leaves out
of a host's count what a kind could never use on an idle host of that size (0: counted, as FGD
does). `capacity` and `capacity_whole` blend gpuflow's fragmentation measure (1)
with FGD's (0) for shared-GPU and whole-GPU request kinds (defaults 1 and 0.1, tuned on the
openb trace: see benchmarks/README.md).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from gpuflow.scheduler.fit import Option
from gpuflow.scheduler.frag import DEFAULT_MIX, Workload, current, growth
from gpuflow.scheduler.index import HostView, SnapshotIndex
from gpuflow.scheduler.model import FleetSnapshot
from gpuflow.specs.scoring import DEFAULT_SCORER, DEFAULT_WEIGHTS, SCORERS

SCORER_NAMES = (*SCORERS, "random")
"""The scorers users may choose, and `random`: a baseline the placement benchmark compares with."""


_GPU_ONLY = {"gpu": 1.0, "cpu": 0.0, "memory": 0.0}


@dataclass
class Scoring:
    """One scorer with its weights, ready to score the hosts of one fleet."""

    name: str
    weights: dict[str, float]
    workload: Workload | None
    job_name: str
    per_host: bool
    """True when a score depends on more than the host's state (so it is not memoized)."""
    _before: dict[int, float]
    weights_key: tuple[tuple[str, float], ...] = ()
    """The weights as a memo key."""

    def score(self, view: HostView, option: Option) -> float:
        if self.name == "binpack":
            return allocation_after(view, option, self.weights) + _gpu_choice(view, option)
        if self.name == "spread":
            return -allocation_after(view, option, self.weights) - _gpu_choice(view, option)
        if self.name == "random":
            return zlib.crc32(f"{self.job_name}/{view.host.id}".encode()) / 2**32
        assert self.workload is not None
        before = self._before.get(view.state_id)
        if before is None:
            before = self._before[view.state_id] = current(self.workload, view)
        added = growth(self.workload, view, option, before) / 1000
        if view.cls.n_gpus:
            packing = allocation_after(view, option, _GPU_ONLY) + _gpu_choice(view, option)
        else:
            packing = 1.0  # nothing to keep free here: CPU-only jobs go here first
        return -self.weights["fragmentation"] * added + self.weights["binpack"] * packing


def scorer_name(scorer: str | None, fleet: FleetSnapshot) -> str:
    """The scorer that places a job on this fleet: the job's own, else the fleet's."""
    return scorer or fleet.scorer or DEFAULT_SCORER


def orders_by_name(scorer: str | None, fleet: FleetSnapshot) -> bool:
    """Whether where a job goes on this fleet depends on the job's name (`random`)."""
    return scorer_name(scorer, fleet) == "random"


def scoring_for(
    index: SnapshotIndex, fleet: FleetSnapshot, scorer: str | None, job_name: str
) -> Scoring:
    name = scorer_name(scorer, fleet)
    if name not in SCORER_NAMES:
        # Specs validate scorer names, so an unknown one is a bug: refuse it, never fall back.
        raise ValueError(f"unknown scorer {name!r}; allowed: {', '.join(SCORER_NAMES)}")
    weights = {**DEFAULT_WEIGHTS, **fleet.scorer_weights}
    workload: Workload | None = None
    before: dict[int, float] = {}
    if name == "fragmentation":
        mix = fleet.workload or DEFAULT_MIX
        capacity = weights["capacity"]
        whole = weights["capacity_whole"]
        scarcity = weights["scarcity"]
        idle = weights["idle"]
        # One prepared mix per fleet and weights, kept while the fleet's `workload` is the same
        # list object (a learned mix is replaced, never edited in place; the entry holds the
        # list, so its id cannot be reused meanwhile).
        key = (fleet.name, capacity, whole, scarcity, idle)
        cached = index.workloads.get(key)
        if cached is None or cached[0] is not fleet.workload:
            if cached is not None:
                _retire(index, cached[1])
            workload = Workload(
                mix,
                capacity=capacity,
                whole_capacity=whole,
                supply=gpu_supply(fleet),
                scarcity=scarcity,
                idle=idle,
            )
            cached = index.workloads[key] = (fleet.workload, workload, {})
        _, workload, before = cached
    weights_key = tuple(sorted(weights.items()))
    return Scoring(name, weights, workload, job_name, name == "random", before, weights_key)


def _retire(index: SnapshotIndex, workload: Workload) -> None:
    """Drop what was memoized for a replaced mix. Rankings and score memos name a mix by its
    id, so the object is kept (emptied) for the index's life: no later mix can take its id."""
    gone = id(workload)
    for table in (index.rankings, index.fit_memo):
        for stale in [key for key in table if isinstance(key, tuple) and gone in key]:
            del table[stale]
    workload.forget()
    index.workloads.setdefault("retired", []).append(workload)


def gpu_supply(fleet: FleetSnapshot) -> dict[str, int]:
    """The fleet's GPUs per model."""
    supply: dict[str, int] = {}
    for host in fleet.hosts:
        for gpu in host.gpus:
            supply[gpu.name] = supply.get(gpu.name, 0) + 1
    return supply


def allocation_after(view: HostView, option: Option, weights: dict[str, float]) -> float:
    """Weighted share of the host allocated once the option is placed, 0..1."""
    cls = view.cls
    total = 0.0
    weight_sum = 0.0
    if cls.n_gpus:
        if cls.blocks > 1:
            taken = cls.blocks - len(view.blocks_free) + len(option.blocks)
            gpu_share = taken / cls.blocks
        else:
            added = option.fraction if option.fraction is not None else len(option.gpus)
            gpu_share = (sum(view.gpu_used) + added) / cls.n_gpus
        total += weights["gpu"] * gpu_share
        weight_sum += weights["gpu"]
    if cls.cpus:
        total += weights["cpu"] * (cls.cpus - view.cpus_free + option.cpus) / cls.cpus
        weight_sum += weights["cpu"]
    if cls.memory:
        used = cls.memory - view.memory_free + option.memory_mib
        total += weights["memory"] * used / cls.memory
        weight_sum += weights["memory"]
    return total / weight_sum if weight_sum else 0.0


def _gpu_choice(view: HostView, option: Option) -> float:
    """For a fraction: a nudge toward the fuller GPU (hosts' totals are equal across GPUs)."""
    if option.fraction is None or not option.gpus:
        return 0.0
    return 1e-6 * view.gpu_used[option.gpus[0]]
