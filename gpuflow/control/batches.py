"""Calls of one control worker served in batches: those that arrive while a batch runs are the
next batch (at most `most`, in arrival order), served by one call in a thread. Alone, a call is
served at once; under load the fixed cost of a batch (a transaction, a lock, a thread hop) is
paid once per batch, not per call. The API's group commit of submits and the first steps' reads
of their verdicts are batched so (gpuflow/control/admission.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")


class Batches(Generic[Item, Result]):
    """`serve` answers a batch's items in their order, each with its result or its own error."""

    def __init__(
        self, serve: Callable[[Sequence[Item]], Sequence[Result | Exception]], most: int
    ) -> None:
        self.serve = serve
        self.most = most
        self.batches = 0
        """Batches served (for tests and the benchmarks)."""
        self._waiting: list[tuple[Item, asyncio.Future[Result]]] = []
        self._drain: asyncio.Task[None] | None = None

    def submit(self, item: Item) -> asyncio.Future[Result]:
        """The future of the item's result; the item is served in the next batch."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Result] = loop.create_future()
        self._waiting.append((item, future))
        if self._drain is None or self._drain.done() or self._drain.get_loop() is not loop:
            self._drain = loop.create_task(self._run())
        return future

    async def call(self, item: Item) -> Result:
        return await self.submit(item)

    async def _run(self) -> None:
        while self._waiting:
            batch = self._waiting[: self.most]
            del self._waiting[: self.most]
            self.batches += 1
            try:
                found = await asyncio.to_thread(self.serve, [item for item, _ in batch])
                for (_, future), result in zip(batch, found, strict=True):
                    if future.done():  # its caller gave up (what was served stands)
                        continue
                    if isinstance(result, Exception):
                        future.set_exception(result)
                    else:
                        future.set_result(result)
            except Exception as exc:  # each call of the batch hears of it
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
            finally:  # no call is left waiting on a batch that ended without its answer
                for _, future in batch:
                    future.cancel()
