"""The job that holds the backfill reservation says so where a user looks (gpuflow/services/
verdicts.py `mark_reserved`, queues.py `waiting_places`), on SQLite and PostgreSQL: which
hosts are reserved for it and by when it starts, known when the jobs it waits for declare a
max_duration; no other entry says it, and the mark goes with the reservation."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from gpuflow.cli.waiting import reserved_text
from gpuflow.control.api_common import job_record
from gpuflow.services.admission import run_pass_in
from gpuflow.services.capacity import allocations_of
from gpuflow.services.queues import waiting_places
from gpuflow.store.db import Store
from gpuflow.store.tables import JobRow
from tests.unit.store.test_admission_store import _enqueue, _entry, _fleet, _release

WAITS = {"retry": {"on_events": ["no-capacity"], "duration": "1h"}}


def _row(name: str) -> JobRow:
    """The job's row as ps reads it (the entries here are made without their jobs' rows)."""
    return JobRow(id=f"job-{name}", name=name, status="pending", spec={"name": name})


def _pass(store: Store) -> None:
    with store.placement_transaction() as session:
        run_pass_in(session, reservation=None)


def test_the_reserved_job_says_its_hosts_and_when_it_starts(store: Store) -> None:
    _fleet(store, gpus=4, cpus=32)
    before = datetime.now(UTC)
    assert _enqueue(store, "short", 0, max_duration="10m").placement is not None
    big = _enqueue(store, "big", 1, resources={"gpu": "A100:4"}, **WAITS)
    assert big.placement is None
    _enqueue(store, "small", 2, resources={"gpu": "A100:2"}, **WAITS)  # after big, in its room
    _pass(store)

    with store.read() as session:
        places = waiting_places(session, ["job-big", "job-small"])
    held, later = places["job-big"], places["job-small"]
    assert held.reserved_hosts == ("sim/h1",)
    assert held.reserved_start is not None
    ends = held.reserved_start - before  # short's start + its max_duration
    assert timedelta(minutes=10) <= ends < timedelta(minutes=10, seconds=30)
    assert (later.reason, later.reserved_hosts, later.reserved_start) == (
        "reserved_for:job-big",
        (),
        None,
    )

    record = job_record(_row("big"), held)
    assert (record.reserved_hosts, record.reserved_start) == (["sim/h1"], held.reserved_start)
    text = reserved_text(record, now=held.reserved_start - timedelta(minutes=4))
    assert text == "reserves h1 (starts within 4m)"

    _release(store, "short")
    _pass(store)
    assert len(allocations_of(store, "job-big")) == 1
    admitted, waits = _entry(store, "big"), _entry(store, "small")
    assert admitted is not None and (admitted.reserved_hosts, admitted.reserved_start) == (
        None,
        None,
    )
    # the mark went with the reservation: small holds it now, for as long as big runs
    assert waits is not None and (waits.reserved_hosts, waits.reserved_start) == ("sim/h1", None)


def test_a_start_nobody_can_tell_is_unknown(store: Store) -> None:
    _fleet(store, gpus=2, cpus=16)
    assert _enqueue(store, "open-ended", 0).placement is not None  # no max_duration
    assert _enqueue(store, "big", 1, resources={"gpu": "A100:2"}, **WAITS).placement is None
    _enqueue(store, "other", 2, **WAITS)
    _pass(store)
    with store.read() as session:
        held = waiting_places(session, ["job-big"])["job-big"]
    assert (held.reserved_hosts, held.reserved_start) == (("sim/h1",), None)
    assert reserved_text(job_record(_row("big"), held)) == "reserves h1 (start unknown)"
