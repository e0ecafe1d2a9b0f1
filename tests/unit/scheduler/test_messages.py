"""The exact words a user reads when a host cannot take a job (`gpuflow offers`, the job's
failure, the client's exception): one line per host, from the first filter that rejects it."""

from __future__ import annotations

import pytest

from gpuflow.scheduler import Placement, Unschedulable, explain, place
from gpuflow.status import HostState
from tests.unit.scheduler.conftest import HostLoader, JobBuilder, SnapshotBuilder


def reasons(result: Placement | Unschedulable) -> list[str]:
    assert isinstance(result, Unschedulable), f"expected no fit, got {result}"
    return result.lines


def test_not_ready_host_says_when_it_was_last_heard(
    host: HostLoader, snapshot: SnapshotBuilder, job: JobBuilder
) -> None:
    result = place(job({"gpu": "A100:1"}), snapshot(host("not-ready")))
    assert reasons(result) == ["gpu-2: not ready (last heartbeat 3m ago)"]


@pytest.mark.parametrize(
    ("state", "detail", "line"),
    [
        (HostState.UNREACHABLE, None, "gpu-1: unreachable"),
        (HostState.UNREACHABLE, "no answer for 5m", "gpu-1: unreachable (no answer for 5m)"),
        (HostState.MAINTENANCE, None, "gpu-1: in maintenance"),
        (HostState.PROVISIONING, None, "gpu-1: provisioning"),
        (HostState.NOT_READY, None, "gpu-1: not ready"),
    ],
)
def test_every_state_but_ready_is_explained(
    host: HostLoader,
    snapshot: SnapshotBuilder,
    job: JobBuilder,
    state: HostState,
    detail: str | None,
    line: str,
) -> None:
    snap = snapshot(host("h100x8", state=state, state_detail=detail))
    assert reasons(place(job({"gpu": 1}), snap)) == [line]


def test_cuda_job_on_a_mac_names_both_runtimes(
    host: HostLoader, snapshot: SnapshotBuilder, job: JobBuilder
) -> None:
    result = place(job({"gpu": "nvidia:1"}), snapshot(host("mac-m2-ultra")))
    assert reasons(result) == ["mac-1: needs CUDA, host has Metal"]


def test_too_few_free_gpus_counts_them(
    host: HostLoader, snapshot: SnapshotBuilder, job: JobBuilder
) -> None:
    node = host("h100x8", name="node-4")
    for gpu in node.gpus[:6]:
        gpu.used = 1.0
    result = place(job({"gpu": "H100:4"}), snapshot(node))
    assert reasons(result) == ["node-4: 2 of 8 GPUs free, job needs 4"]


@pytest.mark.parametrize(
    ("resources", "line"),
    [
        ({"gpu": "A100:1"}, "gpu-1: has H100 GPUs, job needs A100"),
        ({"gpu": "A100,L40S:1"}, "gpu-1: has H100 GPUs, job needs A100 or L40S"),
        ({"gpu": "96GB..:1"}, "gpu-1: GPUs have 80GB, job needs 96GB.."),
        ({"gpu": "H100:16"}, "gpu-1: has 8 GPUs, job needs 16 GPUs"),
        ({"gpu": 1, "cpu": 256}, "gpu-1: has 192 CPUs, job needs 256"),
        ({"gpu": 1, "memory": "4TB"}, "gpu-1: has 2TB memory, job needs 4TB"),
        ({"gpu": 1, "disk": "30TB"}, "gpu-1: has 28TB disk, job needs 30TB"),
        ({"gpu": "intel:1"}, "gpu-1: needs Intel GPUs, host has NVIDIA GPUs"),
        ({"gpu": "amd:1"}, "gpu-1: needs ROCm, host has CUDA"),
        ({"gpu": 1, "os": "macos"}, "gpu-1: needs macOS, host runs Linux"),
        ({"gpu": 1, "arch": "arm64"}, "gpu-1: needs arm64, host is x86_64"),
        ({"gpu": 1, "min_driver": "560"}, "gpu-1: needs driver 560 or newer, host has 550.54.15"),
        (
            {"gpu": 1, "min_driver": "550.100"},
            "gpu-1: needs driver 550.100 or newer, host has 550.54.15",
        ),
    ],
)
def test_static_mismatches(
    host: HostLoader,
    snapshot: SnapshotBuilder,
    job: JobBuilder,
    resources: dict[str, object],
    line: str,
) -> None:
    assert reasons(place(job(resources), snapshot(host("h100x8")))) == [line]


def test_driver_versions_compare_as_numbers(
    host: HostLoader, snapshot: SnapshotBuilder, job: JobBuilder
) -> None:
    # As text "535.104.05" < "535.9"; as numbers it is newer.
    result = place(job({"gpu": 1, "min_driver": "535.9"}), snapshot(host("a100x8-blocks")))
    assert isinstance(result, Placement)


def test_compute_capability(host: HostLoader, snapshot: SnapshotBuilder, job: JobBuilder) -> None:
    resources = {"gpu": {"count": 1, "compute_capability": "9.0"}}
    assert reasons(place(job(resources), snapshot(host("a100x8-blocks")))) == [
        "node-3: needs compute capability 9.0 or higher, host GPUs have 8.0"
    ]
    assert isinstance(place(job(resources), snapshot(host("h100x8"))), Placement)


def test_cpu_only_host_for_a_gpu_job(
    host: HostLoader, snapshot: SnapshotBuilder, job: JobBuilder
) -> None:
    assert reasons(place(job({"gpu": 2}), snapshot(host("cpu-only")))) == [
        "cpu-1: has no GPUs, job needs 2 GPUs"
    ]


def test_usage_shortfalls(host: HostLoader, snapshot: SnapshotBuilder, job: JobBuilder) -> None:
    busy = host("h100x8", cpus_used=190, memory_used_mib=2 * 1024 * 1024 - 8192)
    snap = snapshot(busy)
    assert reasons(place(job({"gpu": 1, "cpu": 4}), snap)) == [
        "gpu-1: 2 of 192 CPUs free, job needs 4"
    ]
    assert reasons(place(job({"gpu": 1, "cpu": 1, "memory": "16GB"}), snap)) == [
        "gpu-1: 8GB of 2TB memory free, job needs 16GB"
    ]


def test_fraction_that_no_gpu_has_free(
    host: HostLoader, snapshot: SnapshotBuilder, job: JobBuilder
) -> None:
    node = host("h100x8")
    for gpu in node.gpus:
        gpu.used = 0.75
    assert reasons(place(job({"gpu": 0.5}), snapshot(node))) == [
        "gpu-1: no GPU has 0.5 free (most free: 0.25)"
    ]


def test_blocks(host: HostLoader, snapshot: SnapshotBuilder, job: JobBuilder) -> None:
    node = host("a100x8-blocks", blocks_used={0, 1, 2})
    assert reasons(place(job({"gpu": "A100:4"}), snapshot(node))) == [
        "node-3: 1 of 4 blocks free, job needs 2"
    ]
    assert reasons(place(job({"gpu": 0.5}), snapshot(host("a100x8-blocks")))) == [
        "node-3: split into 4 blocks; a GPU fraction needs a host that is not split"
    ]


def test_labels_and_taints(host: HostLoader, snapshot: SnapshotBuilder, job: JobBuilder) -> None:
    snap = snapshot(host("h100x8"))
    assert reasons(place(job({"gpu": 1}, labels={"zone": "b"}), snap)) == [
        "gpu-1: job requires label zone=b, host has zone=a"
    ]
    assert reasons(place(job({"gpu": 1}, labels={"team": "ml"}), snap)) == [
        "gpu-1: job requires label team=ml, host has no label team"
    ]
    tainted = snapshot(host("h100x8", taints=["dedicated=infra"]))
    assert reasons(place(job({"gpu": 1}), tainted)) == [
        "gpu-1: has taint dedicated=infra, which the job does not tolerate"
    ]
    for toleration in ("dedicated", "dedicated=infra"):
        assert isinstance(place(job({"gpu": 1}, tolerations=[toleration]), tainted), Placement)


def test_gang_explains_busy_hosts_and_the_fleet(
    host: HostLoader, snapshot: SnapshotBuilder, job: JobBuilder
) -> None:
    busy = host("h100x8", name="gpu-1")
    busy.gpus[0].used = 1.0
    snap = snapshot(busy, host("h100x8", name="gpu-3"))
    assert reasons(place(job({"gpu": 8}, nodes=2), snap)) == [
        "gpu-1: busy, and a 2-node job needs whole idle hosts",
        "fleet lab: 1 idle host fits, and a 2-node job needs 2 in one fleet",
    ]


def test_unknown_fleet_host_and_gpu(
    host: HostLoader, snapshot: SnapshotBuilder, job: JobBuilder
) -> None:
    snap = snapshot(host("h100x8"))
    assert reasons(place(job({"gpu": 1}), snap, fleets=["nope"])) == [
        "fleet nope: no such fleet (fleets: lab)"
    ]
    assert reasons(place(job({"gpu": 1}, placement={"hosts": ["gpu-9"]}), snap)) == [
        "gpu-9: no such host in fleet lab"
    ]
    assert reasons(place(job({"gpu": 1}, placement={"gpus": ["gpu-1:12"]}), snap)) == [
        "gpu-1: has no GPU 12 (it has GPUs 0-7)"
    ]
    snap.fleets[0].hosts[0].gpus[0].used = 1.0
    assert reasons(
        place(job({"gpu": 1}, placement={"gpus": ["gpu-1:0"]}), snapshot(snap.fleets[0].hosts[0]))
    ) == ["gpu-1: 0 of 1 named GPU free, job needs 1"]


def test_first_failing_filter_is_the_one_reported(
    host: HostLoader, snapshot: SnapshotBuilder, job: JobBuilder
) -> None:
    # A Mac that is also not ready: state comes before compatibility.
    mac = host("mac-m2-ultra", state=HostState.NOT_READY, state_detail="last heartbeat 9m ago")
    assert reasons(place(job({"gpu": "nvidia:1"}), snapshot(mac))) == [
        "mac-1: not ready (last heartbeat 9m ago)"
    ]


def test_unschedulable_message_lists_every_host(
    host: HostLoader, snapshot: SnapshotBuilder, job: JobBuilder
) -> None:
    snap = snapshot(host("not-ready"), host("mac-m2-ultra"), host("cpu-only"))
    result = place(job({"gpu": "nvidia:1"}), snap)
    assert isinstance(result, Unschedulable)
    assert result.message() == (
        "no host fits the job:\n"
        "  gpu-2: not ready (last heartbeat 3m ago)\n"
        "  mac-1: needs CUDA, host has Metal\n"
        "  cpu-1: needs CUDA, host has no GPU runtime"
    )
    assert [r.filter for r in result.rejections] == ["state", "compatibility", "compatibility"]
    # The dry run words the same reasons.
    assert explain(job({"gpu": "nvidia:1"}), snap).rejections == result.rejections


def test_no_fleets_at_all(snapshot: SnapshotBuilder, job: JobBuilder) -> None:
    result = place(job({"gpu": 1}), snapshot())
    assert isinstance(result, Unschedulable)
    assert result.message().startswith("no hosts to place on")
