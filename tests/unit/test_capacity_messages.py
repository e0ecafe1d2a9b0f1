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
