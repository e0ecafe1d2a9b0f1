"""A fleet's request mix, learned from the jobs it has been asked to run.

The fragmentation scorer (frag.py) keeps capacity usable for the fleet's usual requests. Those
are the requests its recent jobs made, each kind weighted by how often it came, recent jobs
weighing more:

- **Recency**: a job's weight halves every `half_life` jobs that arrived after it (decay by job
  count, not by time: what matters is which requests will compete for the capacity that frees
  up, and a quiet week changes nothing about that). The half-life is the number of jobs the
  fleet holds when full, taken as one per GPU (most jobs take one GPU or a share of one), at
  least `MIN_HALF_LIFE`: the mix then describes the jobs of about one turnover of the fleet's
  capacity, the ones its free capacity will be fought over by.
- **Thin history**: the built-in mix (frag.DEFAULT_MIX) is a prior worth `PRIOR_JOBS` jobs, as
  in additive smoothing: with an effective history of n jobs (the sum of their decayed weights)
  the learned shares weigh n / (n + PRIOR_JOBS), the built-in ones the rest. A fleet with no
  history uses the built-in mix alone; after 8 jobs it is half learned, after 100 about 93%.
- **Kinds** are the scheduler's own reading of a job (`resolve`): whole GPUs at least (or a
  share of one GPU), CPUs and memory at least, the GPU models it accepts. A job of several
  nodes is that many requests of its per-node shape.
- **Checkpoints**: a fleet's learned mix moves only at checkpoint jobs (`window`), so a store
  re-learns it only there: each job moves it by at most about 1 / (effective history), and a
  job is a checkpoint when a hash of its id falls on one in every so many jobs, chosen so the
  mix moves by at most `CHECKPOINT_DRIFT` between them. The rule reads nothing but the jobs, so
  every control worker and every cold read learn the same mix.
- **In use**: every new mix costs the scorer what it prepared for the last one, so a scheduler
  keeps the mix it scores with until the learned one has drifted from it by `DRIFT`
  (`MixLearner.refreshed`; the product stores the mix in use per fleet, gpuflow/services/mix.py
  `mix_in_use`, and compares at each checkpoint).

Everything here is pure: the store feeds it the fleet's recent jobs, the placement benchmark
the trace's pods as they arrive.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cache

from gpuflow.scheduler.frag import DEFAULT_MIX
from gpuflow.scheduler.model import TypicalRequest
from gpuflow.scheduler.request import resolve
from gpuflow.specs import JobSpec

MIN_HALF_LIFE = 64
"""Jobs. A share estimated from n jobs has a standard error up to 1 / (2 sqrt(n)); 64 keeps it
within about 6 points however small the fleet."""

PRIOR_JOBS = 8.0
"""How many jobs the built-in mix counts as: about one per kind it lists (7), so each of its
kinds weighs like one observed job until history outweighs it."""

DRIFT = 0.1
"""Total variation distance (the share of the weight that moved) at which a long-lived
scheduler state replaces the mix it scores with (`MixLearner.refreshed`)."""

CHECKPOINT_DRIFT = DRIFT / 8
"""How far a learned mix may move between checkpoints (total variation, at most): a drift of
DRIFT from the mix in use is noticed at most this late. (At 1,213 hosts a checkpoint every ~47
placements; each re-learns the window, O(jobs), and compares.)"""

CHECKPOINT_REACH = 8
"""How many checkpoint intervals back a window looks for its checkpoint (past that, e**-8 of
the time, the newest job anchors it)."""

COMPARE_SPACING = 2
"""Checkpoints from one comparison of a stored mix in use with the learned mix to the next:
every DRIFT / 4 of the effective history, as `MixLearner.refreshed` compares."""

Kind = tuple[int, float | None, float, int, frozenset[str]]
"""(whole GPUs, share of one GPU or None, CPUs, MiB, accepted GPU models)."""


@dataclass(frozen=True)
class LearnedMix:
    """The mix to score with and where it comes from (shown by `gpuflow fleet list`)."""

    requests: tuple[TypicalRequest, ...]
    source: str
    """`learned` when some history went into it, `built-in` when none did."""
    jobs: float
    """Effective number of jobs behind the learned part (sum of decayed weights)."""
    observed: int = 0
    """Jobs the learner had seen when it made this mix."""
    shares: dict[Kind, float] | None = field(default=None, compare=False, repr=False)
    """Each kind's share, when the learner made it (for `MixLearner.refreshed`)."""


def half_life(fleet_gpus: int) -> float:
    """Jobs after which a job's weight has halved, for a fleet of this many GPUs."""
    return float(max(MIN_HALF_LIFE, fleet_gpus))


def effective_jobs(jobs: int, half_life_jobs: float) -> float:
    """The decayed weight of `jobs` consecutive jobs, the newest weighing 1."""
    step = 2.0 ** (-1.0 / half_life_jobs)
    return float(jobs) if step >= 1.0 else (1.0 - step**jobs) / (1.0 - step)


def checkpoint_every(jobs: int, half_life_jobs: float) -> int:
    """How many jobs apart the checkpoints of a window of `jobs` jobs are (on average): the
    `CHECKPOINT_DRIFT` share of its effective history, at least 1 (a young fleet's mix follows
    every job)."""
    return max(1, int(CHECKPOINT_DRIFT * effective_jobs(jobs, half_life_jobs)))


@cache
def saturation(limit: int, half_life_jobs: float) -> int:
    """The fewest jobs at which `checkpoint_every` reaches its value for a full window of
    `limit`: it never decreases with more jobs, so a window of at least this many jobs has the
    full window's checkpoints, and whoever counts a fleet's jobs to place them need not count
    past it (1 for a fleet whose every job is a checkpoint)."""
    final = checkpoint_every(limit, half_life_jobs)
    low, high = 1, max(1, limit)
    while low < high:
        middle = (low + high) // 2
        if checkpoint_every(middle, half_life_jobs) >= final:
            high = middle
        else:
            low = middle + 1
    return low


def checkpoint_reads(limit: int, half_life_jobs: float) -> int:
    """How many of the newest jobs the comparison checkpoint is looked for among (`anchor`
    with `COMPARE_SPACING`): `CHECKPOINT_REACH` of its intervals."""
    return CHECKPOINT_REACH * checkpoint_every(limit, half_life_jobs) * COMPARE_SPACING


def window_reads(limit: int, half_life_jobs: float) -> int:
    """How many of the newest jobs `window` needs to see."""
    return limit + CHECKPOINT_REACH * checkpoint_every(limit, half_life_jobs)


def is_checkpoint(job_id: str, every: int) -> bool:
    return every <= 1 or zlib.crc32(job_id.encode()) % every == 0


def window(newest_first: Sequence[str], limit: int, half_life_jobs: float) -> list[str]:
    """The jobs a fleet's mix is learned from, oldest first: the `limit` newest of those at or
    before the newest checkpoint job (see the module docstring), among the newest
    `window_reads` jobs, newest first. The same jobs give the same window, whoever reads."""
    start = anchor(newest_first, min(len(newest_first), limit), half_life_jobs)
    return list(reversed(newest_first[start : start + limit]))


def anchor(
    newest_first: Sequence[str], jobs: int, half_life_jobs: float, *, spacing: int = 1
) -> int:
    """Where a window starts in `newest_first` (at least its newest `CHECKPOINT_REACH`
    checkpoint intervals): the newest checkpoint job, else the newest job. `jobs`: the
    window's size (how many jobs there are, up to its limit). `spacing`: checkpoints this many
    times as far apart (`COMPARE_SPACING`)."""
    found = newest_checkpoint(newest_first, jobs, half_life_jobs, spacing=spacing)
    return 0 if found is None else found


def newest_checkpoint(
    newest_first: Sequence[str], jobs: int, half_life_jobs: float, *, spacing: int = 1
) -> int | None:
    """`anchor`'s checkpoint job, or None when there is none among `newest_first` within
    `CHECKPOINT_REACH` intervals (so a reader of fewer ids than that can tell it must read
    on)."""
    every = checkpoint_every(jobs, half_life_jobs) * spacing
    reach = min(len(newest_first), CHECKPOINT_REACH * every)
    return next((i for i in range(reach) if is_checkpoint(newest_first[i], every)), None)


def kind_of(job: JobSpec) -> tuple[Kind, int]:
    """What one node of the job asks for, and for how many nodes."""
    request = resolve(job)
    gpus = request.gpu_min if request.wants_gpu and request.fraction is None else 0
    kind = (gpus, request.fraction, request.cpus, request.memory_mib, request.names)
    return kind, max(1, request.nodes)


def typical(kind: Kind, weight: float) -> TypicalRequest:
    gpus, fraction, cpus, memory_mib, names = kind
    return TypicalRequest(
        weight=weight,
        gpus=gpus,
        gpu_fraction=fraction,
        cpus=cpus,
        memory_mib=memory_mib,
        gpu_names=names,
    )


class MixLearner:
    """Decayed counts of request kinds, fed one job at a time (oldest first).

    The newest job has weight 1 and each older one 2 ** (-age / half_life); counts are kept
    scaled by the newest weight so a job costs one dict update, and rescaled before they
    overflow.
    """

    def __init__(self, half_life_jobs: float) -> None:
        if half_life_jobs <= 0:
            raise ValueError("half_life_jobs must be positive")
        self._growth = 2.0 ** (1.0 / half_life_jobs)
        self._scale = 1.0
        self._counts: dict[Kind, float] = {}
        self._total = 0.0
        self.observed = 0
        """Jobs seen (each node of a job counts)."""
        self._next_check = 0.0

    def observe(self, kind: Kind, count: int = 1) -> None:
        self.observe_all(((kind, count),))

    def observe_all(self, jobs: Iterable[tuple[Kind, int]]) -> None:
        """`observe` for each (kind, count), oldest first (a store re-learns a window of
        thousands of jobs at each checkpoint: one call, not one per job)."""
        growth, scale, total, observed = self._growth, self._scale, self._total, self.observed
        counts = self._counts
        for kind, count in jobs:
            scale *= growth
            if scale > 1e100:
                factor = 1.0 / scale
                counts = {k: v * factor for k, v in counts.items()}
                total *= factor
                scale = 1.0
            observed += count
            added = scale * count
            counts[kind] = counts.get(kind, 0.0) + added
            total += added
        self._scale, self._total, self.observed, self._counts = scale, total, observed, counts

    def observe_job(self, job: JobSpec) -> None:
        kind, nodes = kind_of(job)
        self.observe(kind, nodes)

    @property
    def jobs(self) -> float:
        """Effective number of jobs: the decayed weights summed (the newest counts 1)."""
        return self._total / self._scale

    def shares(self) -> dict[Kind, float]:
        """Each kind's share of the mix: the learned shares blended with the built-in mix."""
        jobs = self.jobs
        learned = jobs / (jobs + PRIOR_JOBS)
        shares = {kind: learned * count / self._total for kind, count in self._counts.items()}
        for kind, share in _BUILT_IN.items():
            shares[kind] = shares.get(kind, 0.0) + (1.0 - learned) * share
        return shares

    def mix(self) -> LearnedMix:
        """The mix to score with (see the module docstring)."""
        if self._total <= 0:
            return LearnedMix(DEFAULT_MIX, "built-in", 0.0)
        shares = self.shares()
        requests = tuple(typical(kind, share) for kind, share in shares.items())
        return LearnedMix(requests, "learned", self.jobs, self.observed, shares)

    def refreshed(self, in_use: LearnedMix | None) -> LearnedMix | None:
        """The current mix when it has drifted from `in_use` by at least DRIFT, else None.

        For a scheduler that keeps one snapshot over many placements (the benchmark): each new
        mix starts its memo tables afresh, so it is replaced when it has really moved, not on
        every job. New jobs move the mix at most by their share of the weight, so the distance
        is measured only every DRIFT / 4 of the effective history. The product applies the same
        rule at checkpoint jobs (`window`), to a mix in use stored per fleet, so that every
        control worker and every cold read agree on it (gpuflow/services/mix.py)."""
        if in_use is None:
            return self.mix()
        if self.observed < self._next_check:
            return None
        self._next_check = self.observed + max(1.0, DRIFT / 4 * self.jobs)
        current = self.shares()
        if drift(in_use.shares or shares_of(in_use.requests), current) >= DRIFT:
            return self.mix()
        return None


def drift(a: dict[Kind, float], b: dict[Kind, float]) -> float:
    """Total variation distance between two mixes' shares (0 alike .. 1 disjoint)."""
    total = math.fsum(abs(share - b.get(kind, 0.0)) for kind, share in a.items())
    total += math.fsum(share for kind, share in b.items() if kind not in a)
    return 0.5 * total


def shares_of(mix: Iterable[TypicalRequest]) -> dict[Kind, float]:
    """Each kind's share of a mix given as requests (kinds listed twice are merged)."""
    shares: dict[Kind, float] = {}
    for item in mix:
        kind = (item.gpus, item.gpu_fraction, float(item.cpus), item.memory_mib, item.gpu_names)
        shares[kind] = shares.get(kind, 0.0) + item.weight
    total = math.fsum(shares.values()) or 1.0
    return {kind: weight / total for kind, weight in shares.items()}


_BUILT_IN = shares_of(DEFAULT_MIX)


def learned_mix(jobs: Iterable[JobSpec], fleet_gpus: int) -> LearnedMix:
    """The mix of a fleet whose recent jobs are `jobs`, oldest first."""
    learner = MixLearner(half_life(fleet_gpus))
    for job in jobs:
        learner.observe_job(job)
    return learner.mix()
