"""gpuflow's Prometheus metrics: the database collector (SQLite and PostgreSQL), the place step's
histograms, and GPU series from an agent's samples (the endpoint address and the Temporal SDK
bridge: test_metrics_endpoint.py). Each is read back through Prometheus's own text format."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlmodel import select
from temporalio.testing import ActivityEnvironment

from gpuflow.agent.activities import HostAgent
from gpuflow.control.activities import ControlActivities
from gpuflow.metrics import (
    REGISTRY,
    GpuSamples,
    MeteredSampler,
    SampledRun,
)
from gpuflow.metrics.store import StoreMetrics
from gpuflow.scheduler.model import NodePlacement
from gpuflow.services.capacity import release_allocation, take_allocation
from gpuflow.services.fleets import apply_fleet, set_host_state
from gpuflow.services.jobs import record_status_in
from gpuflow.specs import FleetSpec, JobSpec
from gpuflow.status import JobStatus, TerminationReason
from gpuflow.store.db import Store
from gpuflow.store.tables import JobRow, QueueEntryRow
from gpuflow.workflows.models import (
    JobStatusInput,
    PlaceInput,
    ProbeInput,
    StartProcessInput,
    StopProcessInput,
)
from tests.fake_sampler import FixedSampler
from tests.prometheus_text import scrape as _scrape
from tests.prometheus_text import value as _value

# --- the database collector -----------------------------------------------------------------


def _fleet(store: Store) -> None:
    spec = FleetSpec.model_validate(
        {
            "type": "fleet",
            "name": "sim",
            "kind": "sim",
            "hosts": [
                {"name": "a", "cpus": 16, "gpus": [{"name": "A100", "memory": "80GB", "count": 4}]},
                {"name": "b", "cpus": 16, "gpus": [{"name": "L4", "memory": "24GB", "count": 2}]},
            ],
        }
    )
    apply_fleet(store, spec)


def _job(name: str, gpu: str) -> JobSpec:
    return JobSpec.model_validate(
        {"name": name, "commands": ["true"], "resources": {"gpu": gpu, "cpu": 1}}
    )


def _status(
    store: Store,
    job_id: str,
    status: JobStatus,
    *,
    fleet: str | None = None,
    reason: str | None = None,
    waiting: bool = False,
    submitted: datetime | None = None,
) -> None:
    with store.session() as session:
        record_status_in(
            session,
            job_id=job_id,
            name=job_id,
            spec={},
            status=status,
            event_key=f"{status}-{reason}",
            fleet=fleet,
            reason=reason,
            waiting_for_capacity=waiting,
        )
        if submitted is not None:
            row = session.exec(select(JobRow).where(JobRow.id == job_id)).one()
            row.submitted_at = submitted
            session.add(row)
        session.commit()


def test_store_metrics_count_jobs_and_gpus(store: Store) -> None:
    _fleet(store)
    assert not isinstance(
        take_allocation(store, job_id="job-r-1", attempt=1, job=_job("r", "A100:2")), type(None)
    )
    take_allocation(store, job_id="job-s-1", attempt=1, job=_job("s", "L4:1"))
    _status(store, "job-r-1", JobStatus.RUNNING, fleet="sim")
    _status(store, "job-s-1", JobStatus.RUNNING, fleet="sim")
    old = datetime.now(UTC) - timedelta(minutes=5)
    _status(store, "job-p-1", JobStatus.PENDING, waiting=True, submitted=old)
    _status(store, "job-q-1", JobStatus.PENDING)
    _status(
        store,
        "job-i-1",
        JobStatus.TERMINATED,
        fleet="sim",
        reason=TerminationReason.GPU_UNDERUTILIZED.value,
    )
    _status(store, "job-d-1", JobStatus.DONE, fleet="sim", reason=TerminationReason.DONE.value)
    with store.session() as session:  # one job waits in a queue, over its quota
        session.add(
            QueueEntryRow(
                job_id="job-w-1", attempt=1, name="w", queue="team", state="waiting", reason="quota"
            )
        )
        session.commit()

    samples = _scrape(StoreMetrics(store))

    assert _value(samples, "gpuflow_store_up") == 1
    assert _value(samples, "gpuflow_jobs", fleet="sim", status="running") == 2
    assert _value(samples, "gpuflow_jobs", fleet="", status="pending") == 2  # not placed yet
    assert _value(samples, "gpuflow_jobs_pending") == 2
    assert _value(samples, "gpuflow_jobs", fleet="sim", status="done") is None  # history: below
    assert _value(samples, "gpuflow_jobs_waiting_for_capacity") == 2
    assert _value(samples, "gpuflow_queue_waiting_jobs", queue="team", reason="quota") == 1
    oldest = _value(samples, "gpuflow_jobs_pending_oldest_seconds")
    assert oldest is not None and 290 < oldest < 400
    assert (
        _value(
            samples,
            "gpuflow_jobs_ended_total",
            fleet="sim",
            status="terminated",
            reason="gpu_underutilized",
        )
        == 1
    )
    assert (
        _value(samples, "gpuflow_jobs_ended_total", fleet="sim", status="done", reason="done") == 1
    )
    assert _value(samples, "gpuflow_gpus", fleet="sim", model="A100") == 4
    assert _value(samples, "gpuflow_gpus_allocated", fleet="sim", model="A100") == 2
    assert _value(samples, "gpuflow_gpus_free", fleet="sim", model="A100") == 2
    assert _value(samples, "gpuflow_gpus_allocated", fleet="sim", model="L4") == 1
    assert _value(samples, "gpuflow_gpus_free", fleet="sim", model="L4") == 1
    assert _value(samples, "gpuflow_hosts", fleet="sim", state="ready") == 2


def test_store_metrics_follow_releases_and_host_state(store: Store) -> None:
    _fleet(store)
    take_allocation(store, job_id="job-r-1", attempt=1, job=_job("r", "A100:3"))
    collector = StoreMetrics(store, cache_s=0, ended_cache_s=0)
    assert _value(_scrape(collector), "gpuflow_gpus_allocated", fleet="sim", model="A100") == 3
    release_allocation(store, job_id="job-r-1")
    set_host_state(store, "sim/b", "not_ready", "agent not answering")
    samples = _scrape(collector)
    assert _value(samples, "gpuflow_gpus_allocated", fleet="sim", model="A100") == 0
    assert _value(samples, "gpuflow_gpus_free", fleet="sim", model="A100") == 4
    assert _value(samples, "gpuflow_gpus_free", fleet="sim", model="L4") == 0  # host not ready
    assert _value(samples, "gpuflow_hosts", fleet="sim", state="not_ready") == 1


def test_store_metrics_are_cached_between_close_scrapes(store: Store) -> None:
    _fleet(store)
    collector = StoreMetrics(store, cache_s=60)
    assert _value(_scrape(collector), "gpuflow_gpus_allocated", fleet="sim", model="A100") == 0
    take_allocation(store, job_id="job-r-1", attempt=1, job=_job("r", "A100:1"))
    assert _value(_scrape(collector), "gpuflow_gpus_allocated", fleet="sim", model="A100") == 0
    collector.cache_s = 0
    assert _value(_scrape(collector), "gpuflow_gpus_allocated", fleet="sim", model="A100") == 1


def test_the_ended_counter_is_read_less_often_than_the_live_jobs(store: Store) -> None:
    collector = StoreMetrics(store, cache_s=0, ended_cache_s=60)
    _status(store, "job-a-1", JobStatus.RUNNING, fleet="sim")
    assert _value(_scrape(collector), "gpuflow_jobs", fleet="sim", status="running") == 1
    _status(store, "job-a-1", JobStatus.DONE, fleet="sim", reason="done")
    samples = _scrape(collector)
    assert _value(samples, "gpuflow_jobs", fleet="sim", status="running") is None
    assert (
        _value(samples, "gpuflow_jobs_ended_total", fleet="sim", status="done", reason="done")
        is None
    )  # the history is read again after ended_cache_s
    collector.ended_cache_s = 0
    assert (
        _value(
            _scrape(collector),
            "gpuflow_jobs_ended_total",
            fleet="sim",
            status="done",
            reason="done",
        )
        == 1
    )


def test_store_metrics_report_an_unreachable_database(tmp_path: Path) -> None:
    broken = Store("postgresql://nobody@127.0.0.1:1/none")
    samples = _scrape(StoreMetrics(broken))
    assert _value(samples, "gpuflow_store_up") == 0
    assert not any(name == "gpuflow_jobs" for name, _ in samples)
    broken.dispose()


# --- the place step -------------------------------------------------------------------------


def _histogram_count(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name + "_count", labels) or 0.0


async def test_place_step_observes_latency_and_wait(store: Store) -> None:
    _fleet(store)
    activities = ControlActivities(store)
    placed_before = _histogram_count("gpuflow_placement_seconds", outcome="placed")
    unplaced_before = _histogram_count("gpuflow_placement_seconds", outcome="unschedulable")
    waits_before = _histogram_count("gpuflow_job_wait_seconds", fleet="sim")
    wait_sum_before = (
        REGISTRY.get_sample_value("gpuflow_job_wait_seconds_sum", {"fleet": "sim"}) or 0.0
    )

    def place(job_id: str, gpu: str, attempt: int = 1) -> PlaceInput:
        return PlaceInput(
            job_id=job_id,
            attempt=attempt,
            spec=_job(job_id, gpu),
            before=JobStatusInput(
                job_id=job_id,
                name=job_id,
                status=JobStatus.PENDING,
                attempt=attempt,
                event_key="submitted",
            ),
            placed=JobStatusInput(
                job_id=job_id,
                name=job_id,
                status=JobStatus.PROVISIONING,
                attempt=attempt,
                event_key="placed",
            ),
        )

    _status(
        store, "job-w-1", JobStatus.PENDING, submitted=datetime.now(UTC) - timedelta(seconds=30)
    )
    result = await activities.place_job(place("job-w-1", "A100:1"))
    assert result.placement is not None
    assert (await activities.place_job(place("job-x-1", "A100:9"))).placement is None
    assert (await activities.place_job(place("job-y-1", "L4:1", attempt=2))).placement

    assert _histogram_count("gpuflow_placement_seconds", outcome="placed") == placed_before + 2
    assert (
        _histogram_count("gpuflow_placement_seconds", outcome="unschedulable")
        == unplaced_before + 1
    )
    # the first attempt's wait is observed (about 30 s); the retry's is not
    assert _histogram_count("gpuflow_job_wait_seconds", fleet="sim") == waits_before + 1
    wait = REGISTRY.get_sample_value("gpuflow_job_wait_seconds_sum", {"fleet": "sim"}) or 0.0
    assert 29 < wait - wait_sum_before < 60


# --- GPU series from an agent's samples -----------------------------------------------------


def _fixed(*, simulated: bool) -> FixedSampler:
    return FixedSampler(
        utilization=lambda gpu: 10.0 * gpu,
        memory_used_mib=lambda gpu: gpu,
        memory_total_mib=80,
        simulated=simulated,
    )


async def test_gpu_series_follow_a_job_on_a_real_agent(tmp_path: Path) -> None:
    series = GpuSamples()
    inner = _fixed(simulated=True)
    agent = HostAgent(
        host_id="sim/h1",
        state_dir=tmp_path / "agent",
        sampler=MeteredSampler(inner, host_id="sim/h1", samples=series),
    )
    env = ActivityEnvironment()
    node = NodePlacement(
        rank=0,
        host_id="sim/h1",
        host_name="h1",
        fleet="sim",
        task_queue="q",
        gpu_indices=[2, 3],
        address="127.0.0.1",
    )
    await env.run(
        agent.start_process,
        StartProcessInput(
            job_id="job-spin-ab12",
            attempt=1,
            node=node,
            nodes=1,
            master_address="127.0.0.1",
            commands=["sleep 30"],
        ),
    )
    probe = await env.run(
        agent.probe_process,
        ProbeInput(job_id="job-spin-ab12", attempt=1, rank=0, gpu_indices=[2, 3]),
    )
    assert probe.state == "running" and len(probe.samples) == 2

    samples = _scrape(series)
    labels = {"host": "sim/h1", "job_id": "job-spin-ab12", "source": "simulated"}
    assert _value(samples, "gpuflow_gpu_utilization_percent", gpu="3", **labels) == 30
    assert _value(samples, "gpuflow_gpu_memory_used_bytes", gpu="2", **labels) == 2 * 1024**2
    assert _value(samples, "gpuflow_gpu_memory_total_bytes", gpu="2", **labels) == 80 * 1024**2

    await env.run(
        agent.stop_process, StopProcessInput(job_id="job-spin-ab12", attempt=1, rank=0, grace_s=5)
    )
    assert inner.forgotten  # the agent's own sampler is still told
    assert not [key for key in _scrape(series) if key[0].startswith("gpuflow_gpu_")]


def test_gpu_series_say_nvml_for_real_gpus() -> None:
    series = GpuSamples()
    sampler = MeteredSampler(_fixed(simulated=False), host_id="gpu/box", samples=series)
    sampler.sample(SampledRun("/state/jobs/job-t-1/1-0", 1, (0,)), 0.0)
    sources = {
        dict(labels)["source"]
        for name, labels in _scrape(series)
        if name == "gpuflow_gpu_utilization_percent"
    }
    assert sources == {"nvml"}


# --- the dashboard ------------------------------------------------------------------------


def test_dashboard_reads_only_metrics_gpuflow_exports(store: Store, tmp_path: Path) -> None:
    _fleet(store)
    _status(store, "job-d-1", JobStatus.DONE, fleet="sim", reason="done")
    _status(store, "job-r-1", JobStatus.RUNNING, fleet="sim")
    series = GpuSamples()
    MeteredSampler(_fixed(simulated=True), host_id="sim/a", samples=series).sample(
        SampledRun("/s/jobs/job-a-1/1-0", 1, (0,)), 0.0
    )
    exported = {name for name, _ in (*_scrape(StoreMetrics(store)), *_scrape(series))}
    exported |= {
        name
        for family in REGISTRY.collect()
        for name in [family.name + suffix for suffix in ("_bucket", "_count", "_sum")]
    }
    dashboard = json.loads((Path(__file__).parents[2] / "infra/grafana/gpuflow.json").read_text())
    used = {
        name
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
        for name in re.findall(r"gpuflow_[a-z_]+", target["expr"])
    }
    assert used and used <= exported, used - exported
