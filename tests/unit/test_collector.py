"""A control worker's process takes the collector settings of gpuflow/control/collector.py:
what is alive at start is frozen, young collections are far apart and middle ones come every
`MIDDLE` + 1 young ones; both entry points apply them first."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator

import pytest

from gpuflow.control import collector, embedded, main


@pytest.fixture
def restored() -> Iterator[None]:
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


def test_settle_freezes_what_is_alive_and_spaces_the_collections(restored: None) -> None:
    gc.unfreeze()
    kept = [[n] for n in range(1000)]  # alive when the process settles
    old = gc.get_threshold()[2]
    collector.settle()
    assert gc.get_freeze_count() >= len(kept)
    assert gc.get_threshold() == (collector.YOUNG, collector.MIDDLE, old)
    collected = {id(o) for o in gc.get_objects()}  # the permanent generation is not listed
    assert all(gc.is_tracked(x) for x in kept) and not any(id(x) in collected for x in kept)
    collector.settle()  # again: the same settings
    assert gc.get_threshold() == (collector.YOUNG, collector.MIDDLE, old)


class _Stop(Exception):
    pass


@pytest.mark.parametrize("entry", ["control", "embedded"])
def test_both_entry_points_settle_first(entry: str, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    def settle() -> None:
        calls.append("settle")

    def stop(*args: object, **kwargs: object) -> object:
        calls.append("config")
        raise _Stop

    monkeypatch.setattr(collector, "settle", settle)
    module = main if entry == "control" else embedded
    monkeypatch.setattr(module.TemporalConfig, "from_env", stop)
    run = main.run_control() if entry == "control" else embedded.serve()
    with pytest.raises(_Stop):
        asyncio.run(run)
    assert calls == ["settle", "config"]
