"""An admission pass's result is one Temporal payload (2 MiB at most), on SQLite and
PostgreSQL: a pass admits at most NODES_ADMITTED_PER_PASS nodes and words at most TOLD_PER_PASS
jobs' waits or refusals in TOLD_LINES lines each, saying it left some for the next (`more`);
the next passes do the rest. Small bounds here, patched: what is checked is that nothing is
lost, doubled or left over-allocated, and that the database keeps every reason."""

from __future__ import annotations

from typing import Any

import pytest

from gpuflow.services import admission
from gpuflow.services.admission import PassOutcome, run_pass_in
from gpuflow.services.capacity import allocations_of
from gpuflow.services.fleets import apply_fleet
from gpuflow.specs import FleetSpec
from gpuflow.store.db import Store
from tests.unit.store.test_admission_store import _enqueue, _entry
from tests.unit.store.test_warm import _look, _memory_checked, _never_over_allocated

HOSTS = 6


def _fleet(store: Store, state: str = "ready") -> None:
    hosts: list[dict[str, Any]] = [
        {"name": f"h{i}", "state": state, "gpus": [{"name": "A100", "memory": "80GB", "count": 1}]}
        for i in range(HOSTS)
    ]
    apply_fleet(store, FleetSpec.model_validate({"name": "sim", "kind": "sim", "hosts": hosts}))


def _pass(store: Store) -> PassOutcome:
    with store.placement_transaction() as session:
        return run_pass_in(session, reservation=None)


def test_a_pass_admits_at_most_its_nodes_and_the_next_passes_the_rest(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(admission, "NODES_ADMITTED_PER_PASS", 2)
    _fleet(store, state="not_ready")
    names = [f"j{k}" for k in range(HOSTS + 1)]
    for k, name in enumerate(names):
        assert _enqueue(store, name, k).placement is None  # nothing ready: they wait
    _fleet(store)  # the hosts are back: room for all but one
    admitted: list[list[str]] = []
    with _memory_checked() as checks:
        for _ in range(10):
            outcome = _pass(store)
            admitted.append([job.job_id for job in outcome.admitted])
            _look(store)
            if not outcome.more:
                break
    assert checks[0] > 0
    # in the pass's order (submission order here), two at a time, the last one left waiting
    assert admitted == [
        [f"job-{n}" for n in names[0:2]],
        [f"job-{n}" for n in names[2:4]],
        [f"job-{n}" for n in names[4:6]],
    ]
    assert all(len(allocations_of(store, f"job-{n}")) == 1 for n in names[:HOSTS])
    assert allocations_of(store, f"job-{names[-1]}") == []
    entry = _entry(store, names[-1])
    assert entry is not None and entry.state == "waiting"
    _never_over_allocated(store)


def test_a_pass_words_at_most_its_jobs_in_a_few_lines_and_the_next_the_rest(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(admission, "TOLD_PER_PASS", 2)
    monkeypatch.setattr(admission, "TOLD_LINES", 3)
    _fleet(store)
    for k in range(5):  # two GPUs on hosts of one: a reason per host, nowhere to go
        _enqueue(store, f"big{k}", k, resources={"gpu": "A100:2"})
    told: list[list[str]] = []
    for _ in range(10):
        outcome = _pass(store)
        told.append([job.job_id for job in outcome.held])
        for job in outcome.held:
            assert len(job.reasons) == 3
            assert job.reasons[-1] == f"... and {HOSTS - 2} more lines"
        if not outcome.more:
            break
    # the first was worded as it entered (nothing waited then); the passes word the others
    assert [len(jobs) for jobs in told] == [2, 2]
    assert sorted(j for jobs in told for j in jobs) == [f"job-big{k}" for k in range(1, 5)]
    for k in range(5):  # the database keeps a line per host
        entry = _entry(store, f"big{k}")
        assert entry is not None and entry.detail is not None
        assert len(entry.detail.splitlines()) == HOSTS
    assert not _pass(store).more  # all worded: nothing left for a next pass
