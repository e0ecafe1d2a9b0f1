"""The control plane's API answered in-process by its activities (gpuflow/control/api.py), for
tests of the client and the CLI that run without a Temporal server."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from temporalio.exceptions import ApplicationError

from gpuflow.client.api import error_from
from gpuflow.control.api import ApiActivities


@dataclass
class LocalApi:
    activities: ApiActivities

    async def call(self, update: str, arg: Any, result_type: Any, **_: Any) -> Any:
        # Each update of ControlApiWorkflow runs the activity of the same name.
        try:
            return await getattr(self.activities, update)(arg)
        except ApplicationError as exc:
            raise error_from(exc) from None
