"""Taking and releasing capacity, on SQLite and PostgreSQL."""

from __future__ import annotations

import threading

from gpuflow.scheduler.model import Placement, Unschedulable
from gpuflow.services.capacity import (
    allocations_of,
    read_snapshot,
    release_allocation,
    take_allocation,
)
from gpuflow.services.fleets import apply_fleet, sweep_drained
from gpuflow.specs import FleetSpec, JobSpec
from gpuflow.store.db import Store


def _fleet(store: Store, gpus: int = 4, hosts: int = 1, blocks: int = 1) -> FleetSpec:
    spec = FleetSpec.model_validate(
        {
            "type": "fleet",
            "name": "sim",
            "kind": "sim",
            "hosts": [
                {
                    "name": f"h{i}",
                    "cpus": 16,
                    "blocks": blocks,
                    "gpus": [{"name": "A100", "memory": "80GB", "count": gpus}],
                }
                for i in range(hosts)
            ],
        }
    )
    apply_fleet(store, spec)
    return spec


def _job(name: str = "j", gpu: str = "A100:1", **extra: object) -> JobSpec:
    return JobSpec.model_validate(
        {"name": name, "commands": ["true"], "resources": {"gpu": gpu, "cpu": 1}, **extra}
    )


def test_take_is_idempotent_per_job_and_attempt(store: Store) -> None:
    _fleet(store)
    first = take_allocation(store, job_id="job-a-1", attempt=1, job=_job())
    again = take_allocation(store, job_id="job-a-1", attempt=1, job=_job())
    assert isinstance(first, Placement)
    assert again == first
    assert len(allocations_of(store, "job-a-1")) == 1
    with store.session() as session:
        host = read_snapshot(session).hosts()[0]
    assert sum(gpu.used for gpu in host.gpus) == 1


def test_new_attempt_gives_back_the_old_allocation_first(store: Store) -> None:
    _fleet(store, gpus=1)
    take_allocation(store, job_id="job-a-1", attempt=1, job=_job())
    second = take_allocation(store, job_id="job-a-1", attempt=2, job=_job())
    assert isinstance(second, Placement)
    assert [row.attempt for row in allocations_of(store, "job-a-1")] == [2]


def test_release_frees_and_is_idempotent(store: Store) -> None:
    _fleet(store, gpus=1)
    take_allocation(store, job_id="job-a-1", attempt=1, job=_job())
    blocked = take_allocation(store, job_id="job-b-1", attempt=1, job=_job("b"))
    assert isinstance(blocked, Unschedulable)
    assert release_allocation(store, job_id="job-a-1") == 1
    assert release_allocation(store, job_id="job-a-1") == 0
    assert isinstance(take_allocation(store, job_id="job-b-1", attempt=1, job=_job("b")), Placement)


def test_concurrent_placements_never_share_a_gpu(store: Store) -> None:
    _fleet(store, gpus=4, hosts=2)
    results: list[Placement | Unschedulable] = []
    lock = threading.Lock()

    def worker(i: int) -> None:
        result = take_allocation(store, job_id=f"job-c-{i}", attempt=1, job=_job(f"c{i}"))
        with lock:
            results.append(result)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    placed = [r for r in results if isinstance(r, Placement)]
    assert len(placed) == 8
    taken = [(n.host_id, g) for p in placed for n in p.nodes for g in n.gpu_indices]
    assert len(taken) == len(set(taken)) == 8
    with store.session() as session:
        for host in read_snapshot(session).hosts():
            assert all(gpu.used <= 1 for gpu in host.gpus)


def test_removed_host_with_a_job_is_drained_not_deleted(store: Store) -> None:
    spec = _fleet(store, hosts=2)
    placed = take_allocation(
        store, job_id="job-a-1", attempt=1, job=_job(placement={"hosts": ["h1"]})
    )
    assert isinstance(placed, Placement)
    apply_fleet(store, spec.model_copy(update={"hosts": []}))
    with store.session() as session:
        hosts = {h.name: h for h in read_snapshot(session).hosts()}
    assert set(hosts) == {"h1"}
    assert hosts["h1"].state.value == "maintenance"
    assert sweep_drained(store, "sim") == []  # a job still holds it
    release_allocation(store, job_id="job-a-1")
    assert sweep_drained(store, "sim") == ["sim/h1"]  # drained: it goes, as apply would
    with store.session() as session:
        assert list(read_snapshot(session).hosts()) == []
    assert sweep_drained(store, "sim") == []


def test_a_host_shrunk_under_a_running_job_keeps_it_and_says_so(store: Store) -> None:
    spec = _fleet(store, gpus=4)
    placed = take_allocation(store, job_id="job-a-1", attempt=1, job=_job(gpu="A100:3"))
    assert isinstance(placed, Placement) and placed.nodes[0].gpu_indices == [0, 1, 2]
    smaller = spec.model_dump(mode="json")
    smaller["hosts"][0]["gpus"][0]["count"] = 2
    warnings = apply_fleet(store, FleetSpec.model_validate(smaller))
    assert warnings == [
        "host h0 now has 2 GPU(s), but job-a-1 (GPU 2) still run(s) on the GPUs it drops: "
        "they keep running, and nothing new is placed there"
    ]
    assert len(allocations_of(store, "job-a-1")) == 1  # nothing taken from the job
    assert apply_fleet(store, spec) == []  # back to 4: nothing dropped
    # Another model under the job: said too (it was silent), the job left as placed.
    other = spec.model_dump(mode="json")
    other["hosts"][0]["gpus"][0]["name"] = "H100"
    warnings = apply_fleet(store, FleetSpec.model_validate(other))
    assert warnings == [
        "host h0: job-a-1 (GPUs 0, 1, 2: A100 -> H100) still run(s) on GPUs the fleet now "
        "declares another model: they keep running as placed; new jobs are placed by the new "
        "models"
    ]
    assert len(allocations_of(store, "job-a-1")) == 1
