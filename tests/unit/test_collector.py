"""A control worker's collector settings (gpuflow/control/collector.py): what is alive at
settling is frozen, young collections are spaced by YOUNG and middle ones by MIDDLE, the old
generation's threshold is CPython's; settling twice changes nothing more."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from gpuflow.control import collector


@pytest.fixture
def restored() -> Iterator[None]:
    before = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*before)


def test_settle_freezes_and_spaces_the_collections(restored: None) -> None:
    old = gc.get_threshold()[2]
    collector.settle()
    frozen = gc.get_freeze_count()
    assert frozen > 0
    assert gc.get_threshold() == (collector.YOUNG, collector.MIDDLE, old)
    collector.settle()
    assert gc.get_threshold() == (collector.YOUNG, collector.MIDDLE, old)
    assert gc.get_freeze_count() >= frozen
