"""A control worker's process takes the collector settings of gpuflow/control/collector.py:
what is alive at start is frozen, young collections are far apart, middle ones come every
`MIDDLE` + 1 young ones and full ones only after `OLD` middle ones; both entry points apply
them first."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator
from pathlib import Path

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
    collector.settle()
    assert gc.get_freeze_count() >= len(kept)
    assert gc.get_threshold() == (collector.YOUNG, collector.MIDDLE, collector.OLD)
    collected = {id(o) for o in gc.get_objects()}  # the permanent generation is not listed
    assert all(gc.is_tracked(x) for x in kept) and not any(id(x) in collected for x in kept)
    collector.settle()  # again: the same settings
    assert gc.get_threshold() == (collector.YOUNG, collector.MIDDLE, collector.OLD)


def _growing_table(middles: int) -> list[int]:
    """The generations collected while a long-lived table grows through `middles` middle
    collections."""
    runs: list[int] = []

    def counted(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            runs.append(info["generation"])

    gc.callbacks.append(counted)
    table: list[list[int]] = []
    try:
        # at most four times what `middles` middle collections need (a few hundred MB at most)
        while runs.count(1) < middles and len(table) < 4 * middles * (collector.MIDDLE + 1) * (
            collector.YOUNG
        ):
            table.extend([n] for n in range(collector.YOUNG))
    finally:
        gc.callbacks.remove(counted)
    return runs


def test_memo_tables_growing_run_middle_collections_but_no_full_one(restored: None) -> None:
    """A long-lived table that keeps growing (the scheduler's memo tables) is walked by young
    and middle collections as it grows; a full collection, which would walk all of it, waits
    for `OLD` middle ones. With CPython's 10 one runs in the same growth."""
    middles = 20
    assert 10 < middles < collector.OLD
    collector.settle()
    runs = _growing_table(middles)
    assert runs.count(1) >= middles and runs.count(2) == 0
    gc.set_threshold(collector.YOUNG, collector.MIDDLE, 10)
    runs = _growing_table(middles)
    assert runs.count(1) >= middles and runs.count(2) >= 1


class _Stop(Exception):
    pass


@pytest.mark.parametrize(("entry", "config"), [("control", "from_env"), ("embedded", "to_serve")])
def test_both_entry_points_settle_first(
    entry: str, config: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # were the config not stopped, a stack would start: in a home of its own, at least
    monkeypatch.setenv("GPUFLOW_HOME", str(tmp_path / "home"))
    calls: list[str] = []

    def settle() -> None:
        calls.append("settle")

    def stop(*args: object, **kwargs: object) -> object:
        calls.append("config")
        raise _Stop

    monkeypatch.setattr(collector, "settle", settle)
    module = main if entry == "control" else embedded
    monkeypatch.setattr(module.TemporalConfig, config, stop)
    run = main.run_control() if entry == "control" else embedded.serve()
    with pytest.raises(_Stop):
        asyncio.run(run)
    assert calls == ["settle", "config"]
