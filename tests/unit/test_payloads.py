"""Values read back from Temporal are validated as recorded values: a check of user input
added to a spec after a workflow started does not refuse the workflow's own input when it
replays (gpuflow/payloads.py), nor a waiting job's stored spec."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from temporalio.contrib.pydantic import pydantic_data_converter

from gpuflow.naming import RECORDED
from gpuflow.payloads import DATA_CONVERTER
from gpuflow.specs import JobSpec
from gpuflow.workflows.models import JobInput

OLD = {"name": "old", "commands": ["true"], "env": {"TOKEN": "${{ secret.tok }}"}}
"""A spec an earlier gpuflow accepted (a misspelt secret reference, passed as text)."""


def test_user_input_is_refused_a_recorded_value_is_read() -> None:
    with pytest.raises(ValidationError, match="is not a secret reference"):
        JobSpec.model_validate(OLD)
    spec = JobSpec.model_validate(OLD, context=RECORDED)
    assert spec.env == {"TOKEN": "${{ secret.tok }}"}
    # a nested model's check too (resources.gpu, read through GPUSpec.parse)
    zero = {**OLD, "env": {}, "resources": {"gpu": {"names": ["A100"], "count": 0}}}
    with pytest.raises(ValidationError, match="asks for 0 GPUs of A100:0"):
        JobSpec.model_validate(zero)
    assert JobSpec.model_validate(zero, context=RECORDED).resources.gpu is not None


def test_a_workflow_input_recorded_before_the_check_still_decodes() -> None:
    recorded = JobInput(job_id="job-old-1", spec=JobSpec.model_validate(OLD, context=RECORDED))
    (payload,) = DATA_CONVERTER.payload_converter.to_payloads([recorded])
    (decoded,) = DATA_CONVERTER.payload_converter.from_payloads([payload], [JobInput])
    assert decoded == recorded
    # what temporalio's own converter would do on replay: refuse it, every workflow task
    with pytest.raises(ValidationError):
        pydantic_data_converter.payload_converter.from_payloads([payload], [JobInput])


def test_other_values_decode_as_before() -> None:
    values = [1, "text", {"a": [1, 2]}, None]
    payloads = DATA_CONVERTER.payload_converter.to_payloads(values)
    assert DATA_CONVERTER.payload_converter.from_payloads(payloads) == values


def test_a_jobs_ending_fails_its_workflow_without_a_stack_trace_a_bug_keeps_one() -> None:
    from temporalio.api.failure.v1 import Failure
    from temporalio.exceptions import ApplicationError

    from gpuflow.status import JobStatus, TerminationReason
    from gpuflow.workflows.models import JobResult
    from gpuflow.workflows.outcome import failure_of

    stopped = JobResult(
        job_id="job-a-1",
        status=JobStatus.STOPPED,
        reason=TerminationReason.STOPPED_BY_USER,
        message="stopped",
        attempts=1,
    )
    errors: list[BaseException] = [
        failure_of(stopped) or AssertionError("a stopped job fails its workflow"),
        # an internal error's last resort carries no result: its trace is what to look at
        ApplicationError("compensation failed", type="internal_error", non_retryable=True),
        KeyError("x"),
    ]
    traces = []
    for error in errors:
        try:
            raise error
        except BaseException as raised:
            failure = Failure()
            DATA_CONVERTER.failure_converter.to_failure(
                raised, DATA_CONVERTER.payload_converter, failure
            )
            traces.append(failure.stack_trace)
    assert traces[0] == ""
    assert all("test_payloads.py" in trace for trace in traces[1:])
