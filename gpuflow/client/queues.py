"""The client's queue calls: apply, delete and list queues. Each is one update of the control
plane's API workflow (gpuflow/workflows/api.py); `Client` has them all."""

from __future__ import annotations

from pathlib import Path

from gpuflow.client.api import Api
from gpuflow.client.models import AppliedQueue, QueueInfo
from gpuflow.specs.load import load_queue
from gpuflow.specs.queue import QueueSpec
from gpuflow.workflows.api import Empty, QueueApplied, QueueRecord, QueueRef


class QueueCalls:
    _api: Api

    async def apply_queue(self, spec: QueueSpec | str | Path) -> AppliedQueue:
        """Create or update a queue, from a spec or a queue file (`type: queue`). Waiting jobs
        are looked at again at once: a larger quota may start some; a smaller one is taken back
        from borrowers by preempting their preemptible jobs, never from the queue's own."""
        if not isinstance(spec, QueueSpec):
            spec = load_queue(spec)
        return AppliedQueue.from_record(await self._api.call("apply_queue", spec, QueueApplied))

    async def delete_queue(self, name: str) -> None:
        """Delete a queue that holds no job, waiting or admitted. Deleting an applied `default`
        brings back the built-in one; the built-in one cannot be deleted."""
        await self._api.call("delete_queue", QueueRef(name=name), type(None))

    async def list_queues(self) -> list[QueueInfo]:
        """Every queue, by name (the `default` queue included), with what it uses now."""
        records = await self._api.call("queues", Empty(), list[QueueRecord])
        return [QueueInfo.from_record(record) for record in records]
