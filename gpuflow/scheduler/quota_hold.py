"""Quota held for a job (admission.py): the first job of a queue that a pass holds on the
queue's quota holds the later jobs of its queue that need that quota, so that the queue drains
down to what the held job needs. Otherwise a stream of small jobs takes each GPU of quota as it
frees and a big job never starts (Kueue's BestEffortFIFO lets it starve; Slurm's backfill never
delays its first job). Jobs of other queues, jobs of other GPU models under a per-model quota,
and jobs that ask no GPU go on. Only a job that its queue's own quota can serve holds: one that
must borrow would hold its queue for as long as the cohort lends nothing, and waits best
effort, as borrowing is."""

from __future__ import annotations

from gpuflow.scheduler.admission_jobs import Waiting, queue_order
from gpuflow.scheduler.quota import Demand, Quotas
from gpuflow.specs.queue import ANY_MODEL


def quota_keys(quotas: Quotas, job: Waiting) -> frozenset[str]:
    """The quota keys a waiting job may count against in its queue: ANY_MODEL for a total
    quota or a job of any model, else the GPU models its options accept; none for a job that
    asks no GPU."""
    total = ANY_MODEL in quotas.queue(job.queue).quota
    keys: set[str] = set()
    for option in job.options or (job.job,):
        gpu = option.resources.gpu
        if gpu is None:
            continue
        if total or not gpu.names:
            return frozenset({ANY_MODEL})
        keys |= {name.upper() for name in gpu.names}
    return frozenset(keys)


class QuotaHolds:
    """Per queue: the job whose quota it holds this pass, and the quota keys that job needs."""

    def __init__(self, quotas: Quotas) -> None:
        self.quotas = quotas
        self.heads: dict[str, tuple[Waiting, frozenset[str]]] = {}

    def hold(self, job: Waiting, demand: Demand) -> None:
        """`job` was held on quota (it may wait, and its queue could admit it); `demand`: what
        its placement counts. It holds its queue if it is the first to and if its queue's own
        quota can serve it."""
        if job.queue not in self.heads and self.quotas.within_own(job.queue, demand):
            self.heads[job.queue] = (job, quota_keys(self.quotas, job))

    def behind(self, job: Waiting) -> str | None:
        """The job this one waits behind, if any: the one holding its queue's quota, when this
        one comes later in the queue's order and needs the same quota."""
        found = self.heads.get(job.queue)
        if found is None:
            return None
        head, keys = found
        if head.name == job.name or queue_order(job) < queue_order(head):
            return None
        wanted = quota_keys(self.quotas, job)
        if wanted and (ANY_MODEL in keys | wanted or keys & wanted):
            return head.name
        return None
