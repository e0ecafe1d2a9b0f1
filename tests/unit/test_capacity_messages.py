"""The no-capacity and waiting messages the place step writes, and the reasons read back from
them by the client (UnschedulableError) and `ps` (why a job waits): one owner, gpuflow.status."""

from __future__ import annotations

from types import SimpleNamespace

from gpuflow.cli.waiting import why_waiting
from gpuflow.status import NO_CAPACITY_PREFIX, WAITING_PREFIX, JobStatus, capacity_reasons


def test_reasons_come_back_from_either_message() -> None:
    reasons = ["h1: has A100 GPUs, job needs H100", "h2: not ready (declared)"]
    assert capacity_reasons(NO_CAPACITY_PREFIX + "; ".join(reasons)) == reasons
    assert capacity_reasons(WAITING_PREFIX + "; ".join(reasons)) == reasons
    assert capacity_reasons("no capacity") == []
    assert capacity_reasons("running on 1 node(s)") == []


def test_ps_says_why_from_the_waiting_message() -> None:
    job = SimpleNamespace(
        status=JobStatus.PENDING,
        message=WAITING_PREFIX + "h1: has A100 GPUs, job needs H100",
        hosts=[],
    )
    why = why_waiting(job)
    assert why.startswith(NO_CAPACITY_PREFIX) and "h1" in why


def test_a_reason_whose_state_detail_holds_semicolons_is_not_cut_inside_it() -> None:
    """`ps` read `no capacity: fbox: not ready (agent not answering (+1 more)`: the reasons
    were split inside a host's state detail."""
    from gpuflow.cli.waiting import short_reasons
    from gpuflow.status import capacity_reasons

    message = (
        "waiting for capacity: fbox: not ready (agent not answering; last heartbeat 46s ago); "
        "sim-a100: in maintenance (removed from the fleet spec; draining 1 job)"
    )
    assert capacity_reasons(message) == [
        "fbox: not ready (agent not answering; last heartbeat 46s ago)",
        "sim-a100: in maintenance (removed from the fleet spec; draining 1 job)",
    ]
    assert short_reasons(message.removeprefix("waiting for capacity: ")) == (
        "fbox: not ready (agent not answering; last heartbeat 46s ago) (+1 more)"
    )
