"""Every request of the API workflow expires with its client's wait (gpuflow/workflows/
api_expiry.py); the dev-server test is tests/integration/test_api_visibility.py."""

from __future__ import annotations

from temporalio import workflow

from gpuflow.workflows.api import ControlApiWorkflow
from gpuflow.workflows.api_expiry import CALL_PREFIX, call_id, expiry_of


def test_a_call_id_carries_when_it_expires_and_is_unique() -> None:
    first, second = call_id(1_800_000_000.25), call_id(1_800_000_000.25)
    assert first != second and first.startswith(CALL_PREFIX)
    assert expiry_of(first) == 1_800_000_000.25
    assert expiry_of("0c7e2b1c-uuid-of-another-client") is None
    assert expiry_of(f"{CALL_PREFIX}soon-abc") is None


def test_every_update_of_the_api_has_a_validator() -> None:
    """Only a validator can refuse an expired request without a trace in the history: an
    update without one would be carried out whenever a worker takes it up."""
    definition = workflow._Definition.from_class(ControlApiWorkflow)
    assert definition is not None and definition.updates
    without = sorted(name or "" for name, d in definition.updates.items() if d.validator is None)
    assert without == []
