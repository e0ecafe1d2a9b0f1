"""How gpuflow's values travel through Temporal: pydantic models as JSON (temporalio's pydantic
converter), read back in the `RECORDED` validation context.

A payload is a value gpuflow wrote earlier: a workflow's input in its history, an activity's
result, a signal. A spec check added since it was written must not refuse it when a worker
replays or reads it, or the workflow would fail every task until someone intervenes; checks
of user input that must not apply there read the context (`specs.recorded`). Every client and
worker of gpuflow uses `DATA_CONVERTER`."""

from __future__ import annotations

from typing import Any

from pydantic import TypeAdapter
from temporalio.api.common.v1 import Payload
from temporalio.api.failure.v1 import Failure
from temporalio.contrib.pydantic import PydanticJSONPlainPayloadConverter
from temporalio.converter import (
    CompositePayloadConverter,
    DataConverter,
    DefaultFailureConverter,
    DefaultPayloadConverter,
    JSONPlainPayloadConverter,
    PayloadConverter,
)
from temporalio.exceptions import ApplicationError

from gpuflow.naming import RECORDED
from gpuflow.status import TerminationReason


class RecordedJSONConverter(PydanticJSONPlainPayloadConverter):
    """temporalio's pydantic JSON converter, validating in the `RECORDED` context."""

    def from_payload(self, payload: Payload, type_hint: type | None = None) -> Any:
        hint: Any = Any if type_hint is None else type_hint
        try:
            adapter = self._type_adapter(hint)
        except TypeError:  # an unhashable hint: not cached
            adapter = TypeAdapter(hint)
        return adapter.validate_json(payload.data, context=RECORDED)


class RecordedPayloadConverter(CompositePayloadConverter):
    """Temporal's default converters, JSON replaced by `RecordedJSONConverter`."""

    def __init__(self) -> None:
        json = RecordedJSONConverter()
        super().__init__(
            *(
                json if isinstance(c, JSONPlainPayloadConverter) else c
                for c in DefaultPayloadConverter.default_encoding_payload_converters
            )
        )


class EndingFailureConverter(DefaultFailureConverter):
    """Temporal's failure converter, without the stack trace of a job's ending: a job that did
    not end `done` fails its workflow with an ApplicationError of its termination reason that
    carries its JobResult (workflows/outcome.py). That is how the job ended (stopped, preempted,
    its command failed), not where gpuflow's code broke, and the Temporal UI showed the
    workflow's Python frames under it. Any other failure keeps its trace."""

    def to_failure(
        self, exception: BaseException, payload_converter: PayloadConverter, failure: Failure
    ) -> None:
        super().to_failure(exception, payload_converter, failure)
        if is_job_ending(exception):
            failure.stack_trace = ""


def is_job_ending(exception: BaseException) -> bool:
    """Whether the exception is how a job's workflow ends other than `done` (it carries the
    job's result; workflows/outcome.py raises and reads it), not a failure of gpuflow's code."""
    reasons = {reason.value for reason in TerminationReason}
    return (
        isinstance(exception, ApplicationError)
        and exception.type in reasons
        and bool(exception.details)
    )


DATA_CONVERTER = DataConverter(
    payload_converter_class=RecordedPayloadConverter,
    failure_converter_class=EndingFailureConverter,
)
