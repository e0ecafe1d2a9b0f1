"""A request the client gave up on is never carried out.

The client waits `API_TIMEOUT_S` for the control plane's answer. With no control worker
running, Temporal keeps the request (an update of the API workflow) until one starts, and that
worker used to carry it out: a submit reported as failed ran later, and a user who tried again
got two jobs. So the client names each request with the moment it stops counting on it
(`call_id`), and every validator of the API workflow refuses a request past that moment
(`refuse_if_given_up`). A validator's refusal leaves nothing in the history, so replay is
untouched.

The moment is read on the client's clock and compared with the control worker's, and it lies
`EXPIRY_MARGIN_S` before the client stops waiting: a request a worker takes up at the last
moment still has that long to be answered. Clocks apart by more than that margin would refuse
requests early or carry them out late; hosts of one cluster keep theirs within milliseconds.
"""

from __future__ import annotations

import secrets

from temporalio import workflow
from temporalio.exceptions import ApplicationError

CALL_PREFIX = "gpuflow-call-"
EXPIRY_MARGIN_S = 15.0
"""How long before the client stops waiting a request stops being carried out."""


def call_id(expires_at: float) -> str:
    """The update id of a request that no worker may take up after `expires_at` (epoch
    seconds, the client's clock); unique, as Temporal dedups updates by id."""
    return f"{CALL_PREFIX}{int(expires_at * 1000)}-{secrets.token_hex(8)}"


def expiry_of(update_id: str) -> float | None:
    """When the request named `update_id` expires; None for an id without one (a client of an
    older gpuflow, or Temporal's own)."""
    if not update_id.startswith(CALL_PREFIX):
        return None
    millis, _, _ = update_id.removeprefix(CALL_PREFIX).partition("-")
    return int(millis) / 1000 if millis.isdigit() else None


def refuse_if_given_up() -> None:
    """In a validator of the API workflow: refuse the request if its client gave up on it."""
    info = workflow.current_update_info()
    expires = expiry_of(info.id) if info is not None else None
    if expires is not None and workflow.now().timestamp() > expires:
        raise ApplicationError(
            f"{info.name if info else 'request'}: its client stopped counting on an answer "
            "before a control worker took it up (or its clock is behind this worker's); not "
            "carried out",
            type="GpuflowError",
            non_retryable=True,
        )


__all__ = ["CALL_PREFIX", "EXPIRY_MARGIN_S", "call_id", "expiry_of", "refuse_if_given_up"]
