"""How a failed step of a job reads (gpuflow/workflows/steps.py `failure_text`)."""

from __future__ import annotations


def test_a_probe_no_agent_took_up_says_so_in_words() -> None:
    from temporalio.exceptions import TimeoutError as ActivityTimeout
    from temporalio.exceptions import TimeoutType

    from gpuflow.workflows.steps import failure_text

    untaken = ActivityTimeout(
        "activity ScheduleToStart timeout",
        type=TimeoutType.SCHEDULE_TO_START,
        last_heartbeat_details=[],
    )
    assert failure_text(untaken) == (
        "its agent did not take the step up in time (is the host up, its agent running?)"
    )
