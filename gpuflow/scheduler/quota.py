"""Queue quotas as admission counts them: GPUs per quota key (a GPU model, or ANY_MODEL for a
total), per queue, with borrowing from the idle quota of the queue's cohort.

A queue may always use up to its nominal quota (capacity permitting; if borrowers hold it, they
may be preempted). Beyond that it borrows: its own borrowing stays within its
`borrowing_limit`, and the cohort's total borrowing stays within what its queues lend, each
lending at most `lending_limit` of its idle quota.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

from gpuflow.scheduler.model import Placement
from gpuflow.specs.job import JobSpec
from gpuflow.specs.queue import ANY_MODEL, QUOTA_WAIT, QueueSpec, gpu_amounts
from gpuflow.status import NEVER_ADMITTED

if TYPE_CHECKING:
    from gpuflow.scheduler.admission_jobs import Running

EPSILON = 1e-9
Demand = Mapping[str, float]
"""GPUs per quota key."""


def gpus_by_model(placement: Placement) -> dict[str, float]:
    """GPUs a placement holds per model; a shared GPU counts as its fraction."""
    held: dict[str, float] = defaultdict(float)
    for node in placement.nodes:
        share = node.gpu_fraction or 1.0
        for name in node.gpu_names:
            held[name.upper()] += share
    return dict(held)


def gpu_count(placement: Placement) -> float:
    return sum(gpus_by_model(placement).values())


class Quotas:
    """Usage of every queue against its quota; changed as admission takes and frees GPUs."""

    def __init__(self, queues: Iterable[QueueSpec]) -> None:
        self.queues = {queue.name: queue for queue in queues}
        self.usage: dict[str, dict[str, float]] = {name: defaultdict(float) for name in self.queues}
        self._running: dict[str, Demand] = {}
        """Running job -> its demand, as `reclaimable` asked it (a placement does not change
        while a pass runs)."""

    def queue(self, name: str) -> QueueSpec:
        found = self.queues.get(name)
        if found is None:
            raise ValueError(f"no queue named {name}; known: {', '.join(sorted(self.queues))}")
        return found

    def demand(self, queue: str, placement: Placement) -> dict[str, float]:
        """What the placement counts against this queue's quota keys."""
        held = gpus_by_model(placement)
        if ANY_MODEL in self.queue(queue).quota:
            return {ANY_MODEL: sum(held.values())} if held else {}
        return held

    @classmethod
    def holding(cls, queues: Iterable[QueueSpec], held: Iterable[tuple[str, Placement]]) -> Quotas:
        """The queues' quotas with what `held` (queue, placement) counts against them; a
        placement of a queue not among them counts for none (a queue deleted meanwhile)."""
        quotas = cls(queues)
        for queue, placement in held:
            if queue in quotas.queues:
                quotas.add(queue, quotas.demand(queue, placement))
        return quotas

    def add(self, queue: str, demand: Demand, sign: float = 1.0) -> None:
        usage = self.usage[self.queue(queue).name]
        for key, gpus in demand.items():
            usage[key] = max(0.0, usage[key] + sign * gpus)

    def share(self, queue: str) -> float:
        """Dominant share: the highest usage / nominal quota over the queue's keys (usage of a
        key without quota counts as a very large share)."""
        quota, usage = self.queue(queue).quota, self.usage[queue]
        share = 0.0
        for key in set(quota) | set(usage):
            used, nominal = usage.get(key, 0.0), quota.get(key, 0)
            if used > EPSILON:
                share = max(share, used / nominal if nominal else 1e9 * used)
        return share

    def borrowed(self, queue: str, key: str) -> float:
        return max(0.0, self.usage[queue].get(key, 0.0) - self.queue(queue).quota.get(key, 0))

    def borrowing(self, queue: str) -> bool:
        return any(self.borrowed(queue, key) > EPSILON for key in self.usage[queue])

    def over(self, queue: str) -> bool:
        """Whether the queue uses beyond its nominal quota what nothing lends it now: a quota
        (its own, or a lender's) lowered under running jobs, or its cohort left."""
        return any(
            self.borrowed(queue, key) > EPSILON and not self.borrowing_fits(queue, key)
            for key in self.usage[queue]
        )

    def reclaimable(self, candidates: Sequence[Running], queue: str) -> list[Running]:
        """The candidates, in their order, that a job of `queue` may preempt: its own queue's,
        and another queue's only while that queue still borrows a model the victim holds once
        the candidates before it are released, as Kueue reclaims: taking quota back never
        takes a lender's own nominal quota (a victim may take its queue below it by no more
        than its own size)."""
        kept = []
        with self.trial():
            for job in candidates:
                demand = self._running.get(job.name)
                if demand is None:  # a running job's placement is fixed for the pass
                    demand = self._running[job.name] = self.demand(job.queue, job.placement)
                if job.queue != queue and not any(
                    self.borrowed(job.queue, key) > EPSILON for key in demand
                ):
                    continue
                kept.append(job)
                self.add(job.queue, demand, -1.0)
        return kept

    @contextmanager
    def trial(self) -> Iterator[None]:
        """Usage changed within the block is given back as it was at its start."""
        saved = {name: dict(usage) for name, usage in self.usage.items()}
        try:
            yield
        finally:
            for name, usage in saved.items():
                self.usage[name] = defaultdict(float, usage)

    def within_nominal(self, queue: str, demand: Demand) -> bool:
        quota, usage = self.queue(queue).quota, self.usage[queue]
        return all(
            usage.get(key, 0.0) + gpus <= quota.get(key, 0) + EPSILON
            for key, gpus in demand.items()
        )

    def within_own(self, queue: str, demand: Demand) -> bool:
        """Whether the queue's nominal quota could hold `demand` with nothing of its own
        running."""
        quota = self.queue(queue).quota
        return all(gpus <= quota.get(key, 0) + EPSILON for key, gpus in demand.items())

    def borrows(self, queue: str, demand: Demand) -> bool:
        """Taking `demand` more would take the queue beyond its nominal quota."""
        return not self.within_nominal(queue, demand)

    def cohort(self, queue: str) -> list[str]:
        """The queues that share with this one, itself included (itself alone without cohort)."""
        cohort = self.queue(queue).cohort
        if cohort is None:
            return [queue]
        return sorted(name for name, spec in self.queues.items() if spec.cohort == cohort)

    def cohort_keys(self, queue: str) -> set[str]:
        """The quota keys (GPU models) that the queue or a queue of its cohort has quota for."""
        return {key for name in self.cohort(queue) for key in self.queue(name).quota}

    def lendable(self, queue: str, key: str) -> float:
        """Idle quota of this queue that its cohort may borrow now."""
        spec = self.queue(queue)
        idle = max(0.0, spec.quota.get(key, 0) - self.usage[queue].get(key, 0.0))
        return idle if spec.lending_limit is None else min(idle, spec.lending_limit)

    def allows(self, queue: str, demand: Demand) -> bool:
        """Whether the queue may take `demand` more GPUs under its quota and its cohort's."""
        if self.within_nominal(queue, demand):
            return True
        spec = self.queue(queue)
        if spec.cohort is None:
            return False
        self.add(queue, demand)
        try:
            return all(self.borrowing_fits(queue, key) for key in demand)
        finally:
            self.add(queue, demand, -1.0)

    def borrowing_fits(self, queue: str, key: str) -> bool:
        """The queue's borrowing of `key` is within its limit and within what its cohort lends."""
        limit = self.queue(queue).borrowing_limit
        if limit is not None and self.borrowed(queue, key) > limit + EPSILON:
            return False
        members = self.cohort(queue)
        borrowed = sum(self.borrowed(name, key) for name in members)
        lent = sum(self.lendable(name, key) for name in members)
        return borrowed <= lent + EPSILON


def never_admitted(queues: Iterable[QueueSpec], queue: str, job: JobSpec) -> str | None:
    """Why `queue` could not admit the job even with its whole cohort idle (none of the GPU
    models the job accepts has enough quota there, its own or to borrow), in words; None when
    an idle cohort would admit it."""
    gpu = job.resources.gpu
    quotas = Quotas(queues)
    if gpu is None or quota_allows_some(quotas, queue, job):
        return None
    spec = quotas.queue(queue)
    models = " or ".join(gpu.names) if gpu.names else "any model"
    lends = f" and cohort {spec.cohort}'s lending" if spec.cohort else ""
    return (
        f"queue {queue} {NEVER_ADMITTED}: it asks {gpu.count.min * job.nodes:g} GPU(s) of "
        f"{models}, more than its quota ({gpu_amounts(spec.quota)}){lends} allows"
    )


def quota_wait(quotas: Quotas, queue: str, job: JobSpec) -> str:
    """Which limit keeps the queue, at the usage `quotas` counts, from taking the job, in
    words: its quota without a cohort to borrow from, its `borrowing_limit`, or what its cohort
    lends now (naming the lenders' `lending_limit` that holds it back). Said of the fewest GPUs
    of the first model the job's first option accepts that its cohort has quota for (the
    first of any, for a total quota)."""
    spec = quotas.queue(queue)
    asked = _first_ask(quotas, queue, job)
    if asked is None or quotas.allows(queue, dict([asked])):
        return f"{QUOTA_WAIT}queue {queue} has no quota left for it"
    key, gpus = asked
    nominal, used = spec.quota.get(key, 0), quotas.usage[queue].get(key, 0.0)
    uses = f"{QUOTA_WAIT}{queue} uses {key + ':' if key != ANY_MODEL else ''}{round(used, 2):g}"
    more = f"needs {gpus:g} more"
    if spec.cohort is None:
        return f"{uses} of its {nominal} and {more}, with no cohort to borrow from"
    limit = spec.borrowing_limit
    if limit is not None and used + gpus > nominal + limit + EPSILON:
        full = "=" if abs(used - nominal - limit) <= EPSILON else "of"
        return f"{uses} {full} its {nominal} + borrowing_limit {limit} and {more}"
    others = [name for name in quotas.cohort(queue) if name != queue]
    lent = sum(quotas.lendable(name, key) for name in others)
    free = lent - sum(quotas.borrowed(name, key) for name in quotas.cohort(queue))
    lends = "nothing" if free <= EPSILON else gpu_amounts({key: free})
    held = [  # lenders with more idle than they may lend
        f"{name} lends at most {lender.lending_limit}"
        for name in others
        if (lender := quotas.queue(name)).lending_limit is not None
        and lender.quota.get(key, 0) - quotas.usage[name].get(key, 0.0)
        > lender.lending_limit + EPSILON
    ]
    why = f" ({', '.join(held)})" if held else ""
    return f"{uses} of its {nominal} and {more}, cohort {spec.cohort} lends {lends} now{why}"


def _first_ask(quotas: Quotas, queue: str, job: JobSpec) -> tuple[str, float] | None:
    """(quota key, GPUs): the fewest GPUs of the job's first option that asks any, of the
    first model it accepts that its queue's cohort has quota for."""
    spec = quotas.queue(queue)
    for option in job.resource_options():
        wanted = option.resources.gpu
        if wanted is None:
            continue
        gpus = wanted.count.min * option.nodes
        if ANY_MODEL in spec.quota:
            return ANY_MODEL, gpus
        covered = quotas.cohort_keys(queue)
        keys = wanted.names or sorted(covered)
        return next((key for key in keys if key in covered), keys[0] if keys else ANY_MODEL), gpus
    return None


def mixed_cohort(spec: QueueSpec, queues: Iterable[QueueSpec]) -> str | None:
    """Why the queue may not be applied as `spec` among `queues` (the others), in words: its
    cohort's other queues have the other kind of quota. Lending is counted per quota key, a
    total's (ANY_MODEL) apart from each model's, so a queue with a total quota and one with a
    quota per model would never lend each other anything. None when the kinds agree."""
    if spec.cohort is None:
        return None
    total = ANY_MODEL in spec.quota
    unlike = [
        queue
        for queue in queues
        if queue.cohort == spec.cohort
        and queue.name != spec.name
        and (ANY_MODEL in queue.quota) != total
    ]
    if not unlike:
        return None
    named = ", ".join(sorted(queue.name for queue in unlike))
    if total:
        model = min(key for queue in unlike for key in queue.quota)
        kinds = "a quota per GPU model, and a total quota"
        fix = f"write {spec.name}'s per model (gpus: {{{model}: {spec.quota[ANY_MODEL]}}})"
    else:
        kinds = "a total quota, and a quota per GPU model"
        fix = f"write {spec.name}'s as a total (gpus: {sum(spec.quota.values())})"
    return (
        f"queue {spec.name}: the other queues of cohort {spec.cohort} ({named}) have {kinds} "
        "shares nothing with them (a cohort lends per model, or as one total, never across "
        f"the two); {fix}, or use another cohort"
    )


def quota_allows_some(quotas: Quotas, queue: str, job: JobSpec) -> bool:
    """Whether the queue, at the usage `quotas` counts, may take the fewest GPUs of some
    model one of the job's options accepts (a job asking no GPU: always)."""
    spec = quotas.queue(queue)
    for option in job.resource_options():
        wanted = option.resources.gpu
        if wanted is None:
            return True
        gpus = wanted.count.min * option.nodes
        if ANY_MODEL in spec.quota:
            keys = [ANY_MODEL]
        else:
            keys = wanted.names or sorted(quotas.cohort_keys(queue))
        if any(quotas.allows(queue, {key: gpus}) for key in keys):
            return True
    return False


def by_covered_model(quotas: Quotas, queue: str, options: Iterable[JobSpec]) -> Iterator[JobSpec]:
    """The job's resource options narrowed to one GPU model at a time among those the queue's
    cohort has quota for, in the order the job names them (by name for a job of any model):
    where a job that accepts several models may go when its best placement is over quota, as
    Kueue tries a workload's flavors in order. Nothing when the quota is a total (every model
    counts alike) or an option names one model."""
    if ANY_MODEL in quotas.queue(queue).quota:
        return
    keys = quotas.cohort_keys(queue)
    for option in options:
        gpu = option.resources.gpu
        if gpu is None or len(gpu.names) == 1:
            continue
        for model in [m for m in gpu.names if m in keys] if gpu.names else sorted(keys):
            narrowed = gpu.model_copy(update={"names": [model]})
            yield option.model_copy(
                update={"resources": option.resources.model_copy(update={"gpu": narrowed})}
            )
