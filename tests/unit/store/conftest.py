"""Fixtures of the store tests."""

from __future__ import annotations

import pytest

from gpuflow.control import activities as control_activities


@pytest.fixture
def wakes(monkeypatch: pytest.MonkeyPatch) -> list[str | None]:
    """The admission loop's task queues that control activities asked for a pass, in order
    (asked of nobody: no Temporal here)."""
    asked: list[str | None] = []

    async def wake_admission(temporal: object, task_queue: str | None = None) -> bool:
        asked.append(task_queue)
        return True

    monkeypatch.setattr(control_activities, "wake_admission", wake_admission)
    return asked
