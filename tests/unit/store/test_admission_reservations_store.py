"""The reservations of blocked jobs go from one admission pass to the next through the loop's
one carried value (`ReservationState`, the others in its `then`), on SQLite and PostgreSQL."""

from __future__ import annotations

from gpuflow.services.admission import run_pass_in
from gpuflow.services.fleets import apply_fleet
from gpuflow.specs import FleetSpec
from gpuflow.store.db import Store
from gpuflow.workflows.queue_models import ReservationState
from tests.unit.store.test_admission_store import _enqueue


def _two_hosts(store: Store) -> None:
    host = {"cpus": 8, "gpus": [{"name": "A100", "memory": "80GB", "count": 1}]}
    spec = {"type": "fleet", "name": "sim", "kind": "sim", "hosts": []}
    spec["hosts"] = [{"name": name, **host} for name in ("a", "b")]
    apply_fleet(store, FleetSpec.model_validate(spec))


def test_two_blocked_jobs_hold_reservations_from_pass_to_pass(store: Store) -> None:
    _two_hosts(store)
    for k, name in enumerate(("run-a", "run-b")):
        assert _enqueue(store, name, k).placement is not None
    for k, name in enumerate(("first", "second"), start=2):
        assert _enqueue(store, name, k, priority=100).placement is None
    assert _enqueue(store, "low", 4).placement is None  # what the second is kept from
    with store.placement_transaction() as session:
        outcome = run_pass_in(session, reservation=None)
    carried = outcome.reservation
    assert carried is not None and carried.job == "job-first"
    assert [held.job for held in carried.then] == ["job-second"]
    assert {*carried.hosts, *carried.then[0].hosts} == {"sim/a", "sim/b"}
    # the loop carries it as a workflow payload
    carried = ReservationState.model_validate_json(carried.model_dump_json())
    # both reservations hold from the start of the next pass
    with store.placement_transaction() as session:
        again = run_pass_in(session, reservation=carried)
    assert again.reservation is not None
    assert again.reservation.job == "job-first" and again.reservation.hosts == carried.hosts
    assert [(r.job, r.hosts) for r in again.reservation.then] == [
        ("job-second", carried.then[0].hosts)
    ]
    assert not again.admitted
