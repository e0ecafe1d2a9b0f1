"""A request the control plane refuses (the user's error) fails its activity as a benign
error: one line for the client, and no failure with a traceback in the worker's log (temporalio
logs a benign error at debug level)."""

from __future__ import annotations

import pytest
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory

from gpuflow.control.api_common import one_line
from gpuflow.errors import NotFoundError

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_a_refused_request_is_benign() -> None:
    @one_line
    async def refuses() -> None:
        raise NotFoundError("no fleet named 'nope'")

    with pytest.raises(ApplicationError) as refused:
        await refuses()
    assert (refused.value.type, refused.value.message) == ("NotFoundError", "no fleet named 'nope'")
    assert refused.value.category == ApplicationErrorCategory.BENIGN
    assert refused.value.non_retryable
