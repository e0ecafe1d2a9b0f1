"""Control-plane metrics: the place step as it happens, and the fleet and the jobs as the
database has them at scrape time.

The database numbers are the same whichever control worker serves them; with several control
workers, aggregate with `max without (instance)`, not `sum`.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from prometheus_client import Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import case, func
from sqlmodel import Session, col, select

from gpuflow.metrics._registry import REGISTRY
from gpuflow.scheduler.model import Unschedulable
from gpuflow.status import HostState, JobStatus
from gpuflow.store.db import SUBMITTED, Store
from gpuflow.store.tables import AllocationRow, GpuRow, HostRow, JobRow, QueueEntryRow
from gpuflow.workflows.models import JobStatusInput

log = logging.getLogger("gpuflow.metrics")

WAIT_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 600, 1800, 3600, 6 * 3600, 24 * 3600)
"""Seconds: a job that fits is placed within a second; one that waits for capacity, hours."""

PLACEMENT_SECONDS = Histogram(
    "gpuflow_placement_seconds",
    "Time one place step takes (warm state, fit, commit), by outcome",
    ["outcome"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
    registry=REGISTRY,
)
JOB_WAIT_SECONDS = Histogram(
    "gpuflow_job_wait_seconds",
    "Time from a job's submission to its first placement, observed when it is placed",
    ["fleet"],
    buckets=WAIT_BUCKETS,
    registry=REGISTRY,
)

RELEASE_SECONDS = Histogram(
    "gpuflow_release_seconds",
    "Time one release takes: the placement transaction it shares with the releases that "
    "came with it (gpuflow/control/releases.py)",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
    registry=REGISTRY,
)
RELEASE_GROUP_SIZE = Histogram(
    "gpuflow_release_group_size",
    "Releases served by one placement transaction",
    buckets=(1, 2, 4, 8, 16, 32, 64),
    registry=REGISTRY,
)


def observe_release_group(seconds: float, releases: int) -> None:
    """One transaction served `releases` releases in `seconds`."""
    RELEASE_GROUP_SIZE.observe(releases)
    for _ in range(releases):
        RELEASE_SECONDS.observe(seconds)


def observe_placement(seconds: float, result: object) -> None:
    """One place step took `seconds` and ended in `result` (a Placement or Unschedulable)."""
    outcome = "unschedulable" if isinstance(result, Unschedulable) else "placed"
    PLACEMENT_SECONDS.labels(outcome).observe(seconds)


def observe_wait(session: Session, placed: JobStatusInput) -> None:
    """`placed` (a job's placement record) was just written in `session`'s transaction: observe
    how long the job waited since it was submitted. Only a first attempt is observed: a retry's
    wait would include the runs before it. The job's row is already in the session, so this
    reads nothing."""
    if placed.placement is not None:
        observe_admitted(session, placed.job_id, placed.attempt, placed.placement.fleet)


def observe_admitted(session: Session, job_id: str, attempt: int, fleet: str) -> None:
    """The job's attempt was just placed (by its place step or an admission pass) in
    `session`'s transaction: `observe_wait` without a record."""
    if attempt != 1:
        return
    submitted = session.info.get(SUBMITTED, {}).get(job_id)
    if submitted is None:
        job = session.get(JobRow, job_id)
        if job is None:
            return
        submitted = job.submitted_at
    waited = max(0.0, _utcnow() - _aware(submitted))
    JOB_WAIT_SECONDS.labels(fleet).observe(waited)


def _utcnow() -> float:
    return datetime.now(UTC).timestamp()


def _aware(at: datetime) -> float:
    # SQLite and a `timestamp without time zone` column give naive datetimes, written as UTC.
    return (at if at.tzinfo else at.replace(tzinfo=UTC)).timestamp()


ENDED_CACHE_S = 15.0
"""The ended-jobs counter counts the whole job history, the one read that grows with time (for
50,000 jobs about 35 ms on SQLite and 20 ms on PostgreSQL, against 12 ms for all the rest): it
is refreshed this often, the rest every second."""

_LIVE = [JobStatus.PENDING, JobStatus.PROVISIONING, JobStatus.RUNNING]


class StoreMetrics(Collector):
    """Jobs, hosts and GPUs from the database, in a few grouped reads, at most once per
    `cache_s` (the ended-jobs counter, once per `ended_cache_s`) whatever the number of
    scrapers."""

    def __init__(
        self, store: Store, *, cache_s: float = 1.0, ended_cache_s: float = ENDED_CACHE_S
    ) -> None:
        self.store = store
        self.cache_s = cache_s
        self.ended_cache_s = ended_cache_s
        self._lock = threading.Lock()
        self._cached: list[Metric] = []
        self._ended: list[Metric] = []
        self._at = self._ended_at = float("-inf")

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            now = time.monotonic()
            if now - self._at >= self.cache_s:
                with_ended = now - self._ended_at >= self.ended_cache_s
                self._cached, ended = self._read(with_ended=with_ended)
                self._at = now
                if ended is not None:
                    self._ended, self._ended_at = [ended], now
            families = [*self._cached, *self._ended]
        yield from families

    def _read(self, *, with_ended: bool) -> tuple[list[Metric], Metric | None]:
        """gpuflow_store_up and the families, and the ended-jobs counter if asked."""
        up = GaugeMetricFamily("gpuflow_store_up", "Whether the last read of the database worked")
        try:
            with self.store.read() as session:
                families = [*_live_job_families(session), *_capacity_families(session)]
                ended = _ended_jobs(session) if with_ended else None
        except Exception as exc:  # a scrape reports the outage; it never raises
            log.warning("metrics: cannot read the database: %s", str(exc).splitlines()[0])
            up.add_metric([], 0)
            return [up], None
        up.add_metric([], 1)
        return [up, *families], ended


def _live_job_families(session: Session) -> list[Metric]:
    """Jobs that have not ended, by the status index: the cost follows the live jobs, not the
    history."""
    waiting = func.sum(case((col(JobRow.waiting_for_capacity), 1), else_=0))
    rows = session.exec(
        select(  # type: ignore[call-overload]
            JobRow.fleet, JobRow.status, func.count(), func.min(JobRow.submitted_at), waiting
        )
        .where(col(JobRow.status).in_(_LIVE))
        .group_by(JobRow.fleet, JobRow.status)
    ).all()
    jobs = GaugeMetricFamily(
        "gpuflow_jobs",
        "Jobs that have not ended, by fleet and status (fleet is empty before placement)",
        labels=["fleet", "status"],
    )
    pending, waiting_count, oldest = 0, 0, None
    for fleet, status, count, first, waiters in sorted(rows, key=lambda r: (r[0] or "", r[1])):
        jobs.add_metric([fleet or "", status], count)
        if status == JobStatus.PENDING:
            pending += count
            waiting_count += int(waiters or 0)
            if first is not None:
                oldest = _aware(first) if oldest is None else min(oldest, _aware(first))
    queued = session.exec(
        select(QueueEntryRow.queue, QueueEntryRow.reason, func.count())
        .where(col(QueueEntryRow.state) == "waiting")
        .group_by(col(QueueEntryRow.queue), col(QueueEntryRow.reason))
    ).all()
    in_queues = GaugeMetricFamily(
        "gpuflow_queue_waiting_jobs",
        "Jobs waiting in a queue, by queue and why (no_capacity, quota, reserved, "
        "preempting; empty before the first pass)",
        labels=["queue", "reason"],
    )
    for queue, reason, count in sorted(queued, key=lambda r: (r[0], r[1] or "")):
        in_queues.add_metric([queue, (reason or "").split(":")[0]], count)
        waiting_count += count
    return [
        jobs,
        GaugeMetricFamily("gpuflow_jobs_pending", "Jobs not placed yet", value=pending),
        GaugeMetricFamily(
            "gpuflow_jobs_waiting_for_capacity",
            "Pending jobs that wait for capacity (in a queue, or placing themselves)",
            value=waiting_count,
        ),
        in_queues,
        GaugeMetricFamily(
            "gpuflow_jobs_pending_oldest_seconds",
            "How long the longest-pending job has waited (0 when none is pending)",
            value=max(0.0, _utcnow() - oldest) if oldest is not None else 0.0,
        ),
    ]


def _ended_jobs(session: Session) -> Metric:
    rows = session.exec(
        select(JobRow.fleet, JobRow.status, JobRow.termination_reason, func.count())
        .where(col(JobRow.status).not_in(_LIVE))
        .group_by(col(JobRow.fleet), col(JobRow.status), col(JobRow.termination_reason))
    ).all()
    ended = CounterMetricFamily(
        "gpuflow_jobs_ended",
        "Jobs that ended, by fleet, status and termination reason "
        "(reason gpu_underutilized: ended by the utilization policy)",
        labels=["fleet", "status", "reason"],
    )
    for fleet, status, reason, count in rows:
        ended.add_metric([fleet or "", status, reason or ""], count)
    return ended


def _capacity_families(session: Session) -> list[Metric]:
    hosts = {
        host_id: (fleet, state)
        for host_id, fleet, state in session.exec(
            select(HostRow.id, HostRow.fleet, HostRow.state)
        ).all()
    }
    models = {
        (host_id, index): name
        for host_id, index, name in session.exec(
            select(GpuRow.host_id, GpuRow.index, GpuRow.name)
        ).all()
    }
    held: set[tuple[str, int]] = set()
    for host_id, indices in session.exec(
        select(AllocationRow.host_id, AllocationRow.gpu_indices)
    ).all():
        held.update((host_id, int(i)) for i in _ints(indices))
    total: Counter[tuple[str, str]] = Counter()
    allocated: Counter[tuple[str, str]] = Counter()
    free: Counter[tuple[str, str]] = Counter()
    for (host_id, index), model in models.items():
        if host_id not in hosts:
            continue
        fleet, state = hosts[host_id]
        key = (fleet, model)
        total[key] += 1
        if (host_id, index) in held:
            allocated[key] += 1
        elif state == HostState.READY:
            free[key] += 1
    host_states = Counter(hosts.values())
    families: list[Metric] = []
    for name, help_text, counts in (
        ("gpuflow_gpus", "GPUs by fleet and model", total),
        ("gpuflow_gpus_allocated", "GPUs held by jobs (whole or a share)", allocated),
        ("gpuflow_gpus_free", "GPUs no job holds, on ready hosts", free),
    ):
        family = GaugeMetricFamily(name, help_text, labels=["fleet", "model"])
        for key in sorted(total):
            family.add_metric(list(key), counts[key])
        families.append(family)
    host_family = GaugeMetricFamily(
        "gpuflow_hosts", "Hosts by fleet and state", labels=["fleet", "state"]
    )
    for (fleet, state), count in sorted(host_states.items()):
        host_family.add_metric([fleet, state], count)
    families.append(host_family)
    return families


def _ints(value: Any) -> list[int]:
    """A JSON list column as ints (some drivers hand it back as text)."""
    if isinstance(value, str):
        import json

        value = json.loads(value)
    return [int(v) for v in value or []]


_watch_lock = threading.Lock()
_store_collector: StoreMetrics | None = None


@contextlib.contextmanager
def watch_store(store: Store) -> Iterator[None]:
    """Serve the database's jobs and capacity from this process while the block runs. One store
    at a time: a second control worker in the same process (tests) adds nothing."""
    global _store_collector
    collector = StoreMetrics(store)
    with _watch_lock:
        mine = _store_collector is None
        if mine:
            _store_collector = collector
            REGISTRY.register(collector)
    try:
        yield
    finally:
        if mine:
            with _watch_lock:
                REGISTRY.unregister(collector)
                _store_collector = None
