"""Deleting a fleet (gpuflow/services/fleets.py `delete_fleet`) with jobs that need it, on
SQLite and PostgreSQL."""

from __future__ import annotations

import pytest

from gpuflow.errors import GpuflowError
from gpuflow.services.fleets import apply_fleet, delete_fleet, fleet_names_in
from gpuflow.services.queue_entries import leave_queue_in
from gpuflow.specs import FleetSpec
from gpuflow.store.db import Store
from tests.unit.store.test_admission_store import _enqueue, _fleet
from tests.unit.store.test_plan_preview import _end


def test_a_fleet_that_waiting_jobs_need_is_not_deleted_under_them(store: Store) -> None:
    """Seen from the CLI: `fleet delete small` went through while a job that named only
    `small` waited, and the job then waited for a fleet that no longer existed. As with running
    jobs (and `queue delete`), the delete is refused and says which jobs; a job that may run on
    another fleet too does not hold it."""
    _fleet(store, gpus=1, cpus=8)  # fleet `sim`
    other = {"name": "other", "kind": "sim", "hosts": [{"name": "o1", "cpus": 8}]}  # no GPU
    apply_fleet(store, FleetSpec.model_validate(other))
    assert _enqueue(store, "holder", 0, fleets=["sim"]).placement is not None
    assert _enqueue(store, "stuck", 1, fleets=["sim"]).placement is None
    assert _enqueue(store, "flexible", 2, fleets=["sim", "other"]).placement is None
    _end(store, "holder")
    with pytest.raises(GpuflowError) as refused:
        delete_fleet(store, "sim")
    assert str(refused.value) == (
        "fleet sim: 1 waiting job(s) can run on no other fleet (stuck); stop them first, or "
        "apply the fleets they name"
    )
    with store.read() as session:
        assert "sim" in fleet_names_in(session)
    with store.placement_transaction() as session:
        leave_queue_in(session, job_id="job-stuck")
    delete_fleet(store, "sim")  # `flexible` names `other` too: it does not hold the fleet
    with store.read() as session:
        assert "sim" not in fleet_names_in(session)


def test_one_local_fleet_serves_this_machine(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """A second `kind: local` fleet on the embedded stack's machine listed it twice, its CPUs
    counted twice, and no agent served the second. A GPU host that registers itself as a local
    fleet of its own name (infra/README.md) is another machine: it may."""
    from gpuflow.services.fleets import local_host_name
    from gpuflow.workflows.models import HostFacts

    here = HostFacts(os="linux", arch="x86_64", cpus=4, memory_mib=8, disk_mib=8)

    def local(name: str) -> FleetSpec:
        return FleetSpec.model_validate({"name": name, "kind": "local"})

    apply_fleet(store, local("local"), {local_host_name(): here})
    apply_fleet(store, local("local"), {local_host_name(): here})  # again: the same fleet
    with pytest.raises(GpuflowError, match=r"^this machine \(.+\) is fleet local's already"):
        apply_fleet(store, local("f6"), {local_host_name(): here})
    with store.read() as session:
        assert fleet_names_in(session) == ["local"]
    delete_fleet(store, "local")
    apply_fleet(store, local("f6"), {local_host_name(): here})  # once it is gone
    # Applied from another machine, its own local fleet.
    from gpuflow.services import fleets

    monkeypatch.setattr(fleets, "local_host_name", lambda: "gpu-box-1-host")
    apply_fleet(store, local("gpu-box-1"), {"gpu-box-1-host": here})
    with store.read() as session:
        assert fleet_names_in(session) == ["f6", "gpu-box-1"]
