"""How long a job waits before another attempt after a failure (job_state.py `retry_backoff`);
the workflow's use of it: tests/workflow/test_retry_backoff.py."""

from __future__ import annotations

from gpuflow.workflows.job_state import retry_backoff


def test_the_wait_doubles_from_10_seconds_to_5_minutes() -> None:
    waits = [retry_backoff(n).total_seconds() for n in range(8)]
    assert waits == [0, 10, 20, 40, 80, 160, 300, 300]
    assert retry_backoff(10_000).total_seconds() == 300  # no overflow however many failures
