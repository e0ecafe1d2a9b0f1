"""The queue benchmark's code path (benchmarks/queueing.py) on a tiny synthetic trace."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]

NODES = """sn,cpu_milli,memory_mib,gpu,model
n-0,32000,131072,4,V100M16
n-1,32000,131072,4,V100M16
"""
HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
    "creation_time,deletion_time,scheduled_time\n"
)
PODS = (
    HEADER
    + "\n".join(
        [
            "p-00,4000,16384,4,1000,,BE,Running,0,1000,0",
            "p-01,4000,16384,2,1000,,BE,Running,10,900,10",
            "p-02,4000,16384,4,1000,,Burstable,Running,20,600,25",
            "p-03,2000,8192,1,1000,,LS,Running,30,400,30",
            "p-04,2000,8192,1,500,,LS,Pending,40,300,",
            "p-05,2000,8192,1,1000,,BE,Failed,50,100,50",
            "p-06,8000,16384,8,1000,,LS,Running,60,200,60",
            "p-07,2000,8192,2,1000,,Guaranteed,Running,70,500,70",
        ]
    )
    + "\n"
)


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "queue_bench", ROOT / "benchmarks" / "queueing.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["queue_bench"] = module
    spec.loader.exec_module(module)
    return module


def _trace(directory: Path) -> None:
    """The small trace of this file, as the benchmark reads one from `--trace-dir`."""
    (directory / "openb_node_list_gpu_node.csv").write_text(NODES)
    (directory / "openb_pod_list_default.csv").write_text(PODS)


def test_every_policy_runs_the_trace_and_writes_json(
    bench: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _trace(tmp_path)
    out = tmp_path / "out.json"
    argv = ["trace", "--every", "1", "--trace-dir", str(tmp_path), "--json", str(out)]
    assert bench.main(argv) == 0
    printed = capsys.readouterr().out
    assert all(len(line) <= 80 for line in printed.splitlines())
    results = json.loads(out.read_text())["trace"]
    assert list(results) == ["today", "fifo", "queue", "queue+limits"]
    for report in results.values():
        assert report["pods_left_out"] == 1  # p-06: 8 GPUs, no node has them
        assert report["never_started"] == 0
    # the LS pods wait for nobody once they may preempt BE pods
    assert results["queue"]["wait_s"]["100"]["mean"] <= results["fifo"]["wait_s"]["100"]["mean"]
    assert results["queue"]["preemptions"] >= 1  # the LS pod took a BE pod's GPUs


BORROWED = (
    HEADER
    + "\n".join(
        [  # queue b borrows all of a's quota with pods that may not be preempted, a is idle
            *(f"p-0{i},2000,8192,2,1000,,Burstable,Running,0,1000,0" for i in (4, 5, 6, 7)),
            "p-00,2000,8192,2,1000,,LS,Running,10,500,10",  # then a wants 2 GPUs
            "p-10,2000,8192,2,1000,,Burstable,Running,10,500,10",  # and b 2 more
        ]
    )
    + "\n"
)


def test_the_quota_gap_counts_what_the_queue_below_its_quota_waits_for(
    bench: ModuleType, tmp_path: Path
) -> None:
    """Both queues wait from t=10 to 1000 with b holding all 8 GPUs (its 4 and a's 4): the
    share gap is 50 points; a waits for 2 GPUs, so it is kept from 2 of the 8 allocated."""
    (tmp_path / "openb_node_list_gpu_node.csv").write_text(NODES)
    (tmp_path / "openb_pod_list_default.csv").write_text(BORROWED)
    out = tmp_path / "out.json"
    argv = ["trace", "--every", "1", "--trace-dir", str(tmp_path), "--json", str(out)]
    assert bench.main([*argv, "--policies", "queue"]) == 0
    report = json.loads(out.read_text())["trace"]["queue"]
    assert report["preemptions"] == 0
    assert report["both_waiting_s"] == 990
    assert report["max_share_gap_pct"] == 50
    assert report["max_quota_gap_pct"] == 25
    assert report["mean_quota_gap_pct"] == 25


def test_the_trace_runs_on_a_fleet_cut_into_one_gpu_nodes(
    bench: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _trace(tmp_path)
    out = tmp_path / "out.json"
    argv = ["trace", "--every", "1", "--fleet", "1gpu", "--trace-dir", str(tmp_path)]
    assert bench.main([*argv, "--json", str(out), "--policies", "fifo,queue"]) == 0
    assert all(len(line) <= 80 for line in capsys.readouterr().out.splitlines())
    for report in json.loads(out.read_text())["trace"].values():
        assert report["pods_left_out"] == 5  # p-00, p-01, p-02, p-06, p-07 ask more than 1 GPU
        assert report["never_started"] == 0


def test_another_trace_of_the_folder_is_replayed_by_name(
    bench: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--trace NAME` replays openb_pod_list_NAME.csv (the openb release has 24 variants); a
    name the folder lacks, or a variant without the columns of time, is a usage error that
    names what is there."""
    _trace(tmp_path)
    (tmp_path / "openb_pod_list_shared.csv").write_text(PODS.replace(",1,1000,", ",1,500,"))
    (tmp_path / "openb_pod_list_untimed.csv").write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np-00,4000,16384,1,1000\n"
    )
    out = tmp_path / "out.json"
    argv = ["trace", "--every", "1", "--trace-dir", str(tmp_path), "--policies", "queue"]
    assert bench.main([*argv, "--trace", "shared", "--json", str(out)]) == 0
    shared = json.loads(out.read_text())["trace"]["queue"]
    assert bench.main([*argv, "--json", str(out)]) == 0  # the default trace
    assert json.loads(out.read_text())["trace"]["queue"] != shared
    capsys.readouterr()
    for name, said in [
        ("nonesuch", "traces there: default, shared, untimed"),
        ("untimed", "has no qos, creation_time, deletion_time, scheduled_time"),
    ]:
        with pytest.raises(SystemExit) as exit_info:
            bench.main([*argv, "--trace", name])
        assert exit_info.value.code == 2
        assert said in capsys.readouterr().err


HELD = (
    HEADER
    + "\n".join(
        [  # all in queue b; w-4 and l-3 below, r-2 and h-2 at priority 100
            "w-4,2000,8192,1,1000,T4,Burstable,Running,0,1000,0",  # one of the two T4s
            "l-2,2000,8192,3,1000,V100M16,Burstable,Running,0,1000,0",  # three of four V100s
            "r-2,2000,8192,2,1000,T4,LS,Running,10,500,10",  # both T4s: reserved, waits
            "h-2,2000,8192,1,1000,T4,LS,Running,20,300,20",  # fits the free T4: r-2's room
            "l-3,2000,8192,1,1000,,BE,Running,30,100,30",  # the free V100
        ]
    )
    + "\n"
)


def test_an_inversion_behind_a_reservation_of_equal_priority_is_counted_apart(
    bench: ModuleType, tmp_path: Path
) -> None:
    """h-2 (priority 100) fits only in the T4 room held for r-2, of its queue and priority,
    which came first: backfill may not delay r-2, so h-2 waits while l-3 (priority 0) starts
    on a V100 h-2 cannot use. The figure counts that as an inversion, and apart as one behind
    a reservation. `today` holds none: h-2 takes the free T4 at once, r-2 waits for both."""
    (tmp_path / "openb_node_list_gpu_node.csv").write_text(
        "sn,cpu_milli,memory_mib,gpu,model\nn-0,32000,131072,4,V100M16\nn-1,32000,131072,2,T4\n"
    )
    (tmp_path / "openb_pod_list_default.csv").write_text(HELD)
    out = tmp_path / "out.json"
    argv = ["trace", "--every", "1", "--trace-dir", str(tmp_path), "--json", str(out)]
    assert bench.main([*argv, "--policies", "queue,today"]) == 0
    results = json.loads(out.read_text())["trace"]
    queue = results["queue"]
    assert (queue["priority_inversions"], queue["inversions_behind_reservation"]) == (1, 1)
    assert queue["preemptions"] == 0 and queue["never_started"] == 0
    today = results["today"]
    assert (today["priority_inversions"], today["inversions_behind_reservation"]) == (0, 0)


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["trace", "--every", "0"], "--every and --limit: at least 1"),
        (["trace", "--limit", "0"], "--every and --limit: at least 1"),
        (["e2e", "-n", "1"], "-n: at least 10"),
    ],
)
def test_numbers_the_run_cannot_take_are_usage_errors(
    bench: ModuleType, argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        bench.main(argv)
    assert exit_info.value.code == 2
    assert said in capsys.readouterr().err


def test_the_policies_place_with_the_mix_the_arrived_pods_make(
    bench: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As the product's admission pass scores with the mix its fleet's jobs make, the trace's
    fleet scores with the mix learned from the pods that arrived: it holds p-04's kind (half a
    GPU, 2 CPUs, 8 GiB), which the built-in mix has not."""
    from benchmarks import queue_sim

    _trace(tmp_path)
    runs: list[Any] = []
    run = queue_sim.Simulation.run

    def spy(sim: Any) -> None:
        runs.append(sim)
        run(sim)

    monkeypatch.setattr(queue_sim.Simulation, "run", spy)
    queue_sim.simulate(tmp_path, 1, None, "queue")
    (sim,) = runs
    learned = sim.snapshot.fleets[0].workload
    asks = {(r.gpu_fraction, r.cpus, r.memory_mib) for r in learned}
    assert (0.5, 2, 8192) in asks
