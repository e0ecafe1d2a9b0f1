"""A host whose stored facts cannot be read (a driver '²', a compute capability 'ampere') does
not fit jobs that ask for a version, says why, and never breaks placement on the other hosts."""

from __future__ import annotations

import pytest

from gpuflow.scheduler import Placement, Unschedulable, explain, place
from tests.unit.scheduler.conftest import HostLoader, JobBuilder, SnapshotBuilder


@pytest.mark.parametrize("driver", ["²", "", "550.x", "5" * 100, "535.104.05-beta"])
def test_an_unreadable_driver_is_that_host_not_fitting(
    host: HostLoader, snapshot: SnapshotBuilder, job: JobBuilder, driver: str
) -> None:
    odd = host("h100x8", name="odd", driver_version=driver)
    good = host("h100x8", name="good")
    spec = job({"gpu": 1, "min_driver": "535.0"})
    result = place(spec, snapshot(odd, good))
    assert isinstance(result, Placement)
    assert [node.host_name for node in result.nodes] == ["good"]
    offers = explain(spec, snapshot(odd, good))
    assert [offer.host for offer in offers.fits] == ["good"]
    (line,) = [str(r) for r in offers.rejections]
    state = "unknown" if driver == "" else "unreadable"
    assert line.startswith(f"odd: needs driver 535.0 or newer, host's driver is {state}")
    assert len(line) < 200


def test_an_unreadable_compute_capability_is_that_gpu_not_fitting(
    host: HostLoader, snapshot: SnapshotBuilder, job: JobBuilder
) -> None:
    odd = host("h100x8", name="odd")
    for gpu in odd.gpus:
        gpu.compute_capability = "ampere\x00" + "x" * 500
    spec = job({"gpu": {"count": 1, "compute_capability": "8.0"}})
    result = place(spec, snapshot(odd))
    assert isinstance(result, Unschedulable)
    (line,) = result.lines
    assert line.startswith("odd: needs compute capability 8.0 or higher, host GPUs have 'ampere")
    assert "\x00" not in line and len(line) < 200
    assert isinstance(place(spec, snapshot(odd, host("h100x8", name="good"))), Placement)


def test_jobs_that_ask_no_version_still_use_the_host(
    host: HostLoader, snapshot: SnapshotBuilder, job: JobBuilder
) -> None:
    odd = host("h100x8", name="odd", driver_version="²")
    assert isinstance(place(job({"gpu": 1}), snapshot(odd)), Placement)
