"""A run of an admission pass whose result the loop never recorded (its worker died after the
commit) is run again with the same `pass_id`: it tells again the jobs the lost run admitted
or refused, which wait no more and would otherwise never hear (gpuflow/workflows/admission.py)."""

from __future__ import annotations

import asyncio

from gpuflow.control.admission import AdmissionActivities
from gpuflow.services.capacity import allocations_of
from gpuflow.store.db import Store
from gpuflow.workflows.queue_models import PassInput, PassResult
from tests.unit.store.test_admission_store import _enqueue, _entry, _fleet, _release


def _pass(store: Store, pass_id: str | None) -> PassResult:
    return asyncio.run(AdmissionActivities(store).admission_pass(PassInput(pass_id=pass_id)))


def test_a_pass_run_again_tells_what_its_lost_run_decided_and_no_other_pass_does(
    store: Store,
) -> None:
    _fleet(store)
    assert _enqueue(store, "blocker", 0).placement is not None
    assert _enqueue(store, "low", 1).placement is None
    assert _enqueue(store, "late", 2, may_wait=False).refused is None  # waits behind low
    _release(store, "blocker")

    lost = _pass(store, "p1")
    assert [(a.job_id, a.attempt) for a in lost.admitted] == [("job-low", 1)]
    assert [r.job_id for r in lost.refused] == ["job-late"]
    entry = _entry(store, "low")
    assert entry is not None and (entry.state, entry.decided_by) == ("admitted", "p1")

    again = _pass(store, "p1")
    assert again.admitted == lost.admitted  # the same placement, not a second one
    assert again.refused == lost.refused
    assert len(allocations_of(store, "job-low")) == 1

    assert _pass(store, "p2").admitted == [] and _pass(store, "p2").refused == []
    assert _pass(store, None).admitted == []
