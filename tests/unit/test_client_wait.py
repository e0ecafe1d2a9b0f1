"""`Client.wait` with a timeout: a gpuflow error that says what happened, and a TimeoutError
for callers that catch that."""

from __future__ import annotations

import asyncio

import pytest

from gpuflow import Client, GpuflowError, WaitTimeout


async def test_a_wait_that_times_out_says_so_and_stops_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def never(self: Client, job: str) -> None:
        await asyncio.sleep(3600)

    monkeypatch.setattr(Client, "_ended", never)
    client = Client(temporal=None, api=None)  # type: ignore[arg-type]
    with pytest.raises(WaitTimeout) as waited:
        await client.wait("train", timeout_s=0.05)
    assert str(waited.value) == "job train did not end within 0.05s; it was not stopped"
    assert isinstance(waited.value, GpuflowError) and isinstance(waited.value, TimeoutError)
