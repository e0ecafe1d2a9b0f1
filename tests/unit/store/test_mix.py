"""A fleet's mix learned from its jobs in the store (gpuflow/services/mix.py), on SQLite and
PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gpuflow.scheduler.frag import DEFAULT_MIX
from gpuflow.scheduler.mix import MIN_HALF_LIFE, PRIOR_JOBS
from gpuflow.services.capacity import read_snapshot
from gpuflow.services.fleets import apply_fleet
from gpuflow.services.mix import fleet_mix, mix_info
from gpuflow.specs import FleetSpec, JobSpec
from gpuflow.status import JobStatus
from gpuflow.store.db import Store
from gpuflow.store.tables import JobRow

START = datetime(2026, 1, 1, tzinfo=UTC)


def _fleet(store: Store, name: str = "sim") -> None:
    apply_fleet(
        store,
        FleetSpec.model_validate(
            {
                "type": "fleet",
                "name": name,
                "kind": "sim",
                "hosts": [
                    {
                        "name": "h0",
                        "cpus": 16,
                        "gpus": [{"name": "T4", "memory": "16GB", "count": 4}],
                    }
                ],
            }
        ),
    )


def _add(
    store: Store,
    job_id: str,
    gpu: object,
    *,
    minute: int,
    fleet: str | None = "sim",
    status: JobStatus = JobStatus.DONE,
    spec: dict[str, object] | None = None,
) -> None:
    if spec is None:
        job = JobSpec.model_validate(
            {"name": job_id, "commands": ["true"], "resources": {"gpu": gpu, "cpu": 2}}
        )
        spec = job.model_dump(mode="json")
    with store.session() as session:
        session.add(
            JobRow(
                id=job_id,
                name=job_id,
                status=status,
                spec=spec,
                fleet=fleet,
                submitted_at=START + timedelta(minutes=minute),
            )
        )
        session.commit()


def test_a_fleet_without_jobs_uses_the_built_in_mix(store: Store) -> None:
    _fleet(store)
    with store.read() as session:
        mix = fleet_mix(session, "sim", 4)
        snapshot = read_snapshot(session)
        info = mix_info(session, snapshot.fleets[0])
    assert mix.source == "built-in" and mix.requests == DEFAULT_MIX
    assert snapshot.fleets[0].workload == list(DEFAULT_MIX)
    assert info["source"] == "built-in" and info["jobs"] == 0


def test_recent_jobs_of_the_fleet_make_its_mix(store: Store) -> None:
    _fleet(store)
    _fleet(store, "other")
    _add(store, "a", "T4:2", minute=0)  # older: weighs 2 ** (-1 / 64) of the newest
    _add(store, "b", 0.5, minute=1)
    _add(store, "c", 1, minute=2, fleet="other")  # another fleet's: not counted
    _add(store, "d", 1, minute=3, fleet=None, status=JobStatus.PENDING)  # waits for any fleet
    _add(store, "e", 1, minute=4, fleet=None, status=JobStatus.FAILED)  # never placed: no
    _add(store, "f", 1, minute=5, spec={"name": "f", "bogus": True})  # unreadable: left out
    with store.read() as session:
        snapshot = read_snapshot(session)
        fleet = next(f for f in snapshot.fleets if f.name == "sim")
        info = mix_info(session, fleet)
    g = 2 ** (-1 / MIN_HALF_LIFE)
    jobs = 1 + g + g**2  # d (newest), b, a
    assert info["source"] == "learned" and info["jobs"] == pytest.approx(jobs, abs=0.01)
    learned = jobs / (jobs + PRIOR_JOBS)
    weights = {
        (r.gpus, r.gpu_fraction, r.cpus, r.memory_mib, r.gpu_names): r.weight
        for r in fleet.workload
    }
    assert weights[2, None, 2.0, 0, frozenset({"T4"})] == pytest.approx(learned * g**2 / jobs)
    assert weights[0, 0.5, 2.0, 0, frozenset()] == pytest.approx(learned * g / jobs)
    one = next(r.weight for r in DEFAULT_MIX if r.gpus == 1)  # 8 CPUs: not d's kind
    assert weights[1, None, 8, 32768, frozenset()] == pytest.approx((1 - learned) * one)
    assert weights[1, None, 2.0, 0, frozenset()] == pytest.approx(learned / jobs)
    assert sum(weights.values()) == pytest.approx(1.0)
    heaviest = info["requests"][0]
    assert heaviest["weight"] >= info["requests"][-1]["weight"]
    assert set(heaviest) == {"weight", "gpus", "gpu_fraction", "cpus", "memory_mib", "gpu_names"}
