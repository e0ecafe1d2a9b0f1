"""The placement benchmark's code path on a tiny synthetic trace (results, not timings)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

from gpuflow.scheduler.frag import DEFAULT_MIX
from gpuflow.scheduler.mix import kind_of

ROOT = Path(__file__).resolve().parents[3]

NODES = """sn,cpu_milli,memory_mib,gpu,model
n-0,32000,131072,4,V100M16
n-1,32000,131072,4,V100M16
n-2,64000,262144,8,G2
n-3,16000,65536,2,T4
"""

HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
    "creation_time,deletion_time,scheduled_time\n"
)
PODS = (
    HEADER
    + """p-00,4000,16384,1,1000,,LS,Running,0,1,0
p-01,2000,8192,1,500,,LS,Running,0,1,0
p-02,2000,8192,1,250,,LS,Running,0,1,0
p-03,8000,32768,4,1000,,LS,Running,0,1,0
p-04,8000,16384,0,0,,BE,Running,0,1,0
p-05,4000,16384,1,1000,T4,LS,Running,0,1,0
p-06,2000,4096,1,810,,LS,Running,0,1,0
p-07,32000,131072,8,1000,,LS,Running,0,1,0
p-08,4000,16384,2,1000,V100M16|G2,LS,Running,0,1,0
p-09,1000,2048,1,160,,LS,Running,0,1,0
"""
)


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    path = ROOT / "benchmarks" / "placement.py"
    spec = importlib.util.spec_from_file_location("placement_bench", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["placement_bench"] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def trace_dir(tmp_path: Path) -> Path:
    (tmp_path / "openb_node_list_gpu_node.csv").write_text(NODES)
    (tmp_path / "openb_pod_list_tiny.csv").write_text(PODS)
    return tmp_path


def test_pods_become_jobs_with_the_trace_request(bench: ModuleType, trace_dir: Path) -> None:
    pods = {p.name: p for p in bench.load_pods(trace_dir / "openb_pod_list_tiny.csv")}
    shared = bench.job_of(pods["p-01"]).resources
    assert shared.gpu is not None and shared.gpu.fraction == 0.5
    assert shared.cpu.min == 2 and shared.memory.min == 8192
    picky = bench.job_of(pods["p-08"]).resources.gpu
    assert picky is not None and picky.names == ["V100M16", "G2"] and picky.count.min == 2
    assert bench.job_of(pods["p-04"]).resources.gpu is None


def test_arrivals_are_tuned_to_130_percent_of_capacity(bench: ModuleType, trace_dir: Path) -> None:
    pods = bench.load_pods(trace_dir / "openb_pod_list_tiny.csv")
    capacity = 18 * 1000
    sequence = bench.arrivals(pods, capacity, seed=7)
    demand = sum(p.gpu_milli_total for p in sequence)
    assert demand <= 1.3 * capacity
    assert demand > 1.3 * capacity - 8000  # stopped only when the next copy would overshoot
    assert sequence[: len(pods)] != sorted(pods, key=lambda p: p.name)  # shuffled
    assert bench.arrivals(pods, capacity, seed=7) == sequence  # reproducible
    small = bench.arrivals(pods * 10, capacity, seed=7)  # too much demand: pods are removed
    assert sum(p.gpu_milli_total for p in small) <= 1.3 * capacity


def test_run_places_through_the_scheduler_and_reports(
    bench: ModuleType, trace_dir: Path, tmp_path: Path
) -> None:
    nodes = bench.load_nodes(trace_dir / "openb_node_list_gpu_node.csv")
    pods = bench.load_pods(trace_dir / "openb_pod_list_tiny.csv")
    result = bench.run(nodes, pods, seed=3, scorer="binpack")
    assert 0 <= result.unallocated_at_130 <= result.unallocated_at_100 <= 100
    assert 0 < result.failed < result.placements
    out = tmp_path / "out.json"
    bench.main(
        [
            "--trace-dir",
            str(trace_dir),
            "--traces",
            "tiny",
            "--seeds",
            "1,2",
            "--scorers",
            "fragmentation,fgd,binpack,spread,random",
            "--mix",
            "learned,true",
            "--json",
            str(out),
        ]
    )
    report = json.loads(out.read_text())
    assert set(report) == {"tiny"}
    assert set(report["tiny"]) == {"fragmentation", "fgd", "binpack", "spread", "random"}
    for by_mix in report["tiny"].values():
        assert set(by_mix) == {"learned", "true"}
        for row in by_mix.values():
            assert 0 <= row["unallocated_pct_at_130"] <= row["unallocated_pct_at_100"] <= 100
            assert row["placements_per_s"] > 0


def test_learned_mix_is_learned_from_arrived_pods_only(
    bench: ModuleType, trace_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scheduler is never handed the trace's mix: each mix it scores with is the one the
    product's learner makes from the pods that arrived before (and including) the one placed."""
    nodes = bench.load_nodes(trace_dir / "openb_node_list_gpu_node.csv")
    pods = bench.load_pods(trace_dir / "openb_pod_list_tiny.csv")
    seen: list[tuple[int, int]] = []
    placed = bench.place

    def spy(job: object, snapshot: object) -> object:
        fleet = snapshot.fleets[0]  # type: ignore[attr-defined]
        pinned = sum(1 for r in fleet.workload if r.gpu_names)
        seen.append((len(fleet.workload), pinned))
        return placed(job, snapshot)

    monkeypatch.setattr(bench, "place", spy)
    sequence = bench.arrivals(pods, 18 * 1000, seed=3)
    bench.run(nodes, pods, seed=3, scorer="fragmentation", mix="learned")
    first = bench.job_of(sequence[0])
    # the first placement scores with the first pod's kind blended into the built-in mix
    built_in = {
        (r.gpus, r.gpu_fraction, float(r.cpus), r.memory_mib, r.gpu_names) for r in DEFAULT_MIX
    }
    assert seen[0][0] == len(built_in | {kind_of(first)[0]})
    assert len(seen) == len(sequence)
    assert seen[0][1] == (1 if sequence[0].gpu_spec else 0)
    seen.clear()
    bench.run(nodes, pods, seed=3, scorer="fragmentation", mix="true")
    assert seen[0][0] == len(bench.workload_of(pods))  # the idealised mode: the whole trace's


@pytest.mark.parametrize(("shape", "size"), [("2gpu", 2), ("1gpu", 1)])
def test_synthetic_fleets_split_the_same_gpus(
    bench: ModuleType, trace_dir: Path, shape: str, size: int
) -> None:
    nodes = bench.load_nodes(trace_dir / "openb_node_list_gpu_node.csv")
    split = bench.fleet_of(nodes, shape)
    assert sum(n.gpus for n in split) == sum(n.gpus for n in nodes) == 18
    assert {n.gpus for n in split} == {size}
    assert sum(n.cpu_milli for n in split) == sum(n.cpu_milli for n in nodes)
    g2 = [n for n in split if n.model == "G2"]
    assert len(g2) == 8 // size and g2[0].cpu_milli == 64000 * size // 8


def test_low_cpu_fleet_keeps_four_cpus_per_gpu(bench: ModuleType, trace_dir: Path) -> None:
    nodes = bench.load_nodes(trace_dir / "openb_node_list_gpu_node.csv")
    low = bench.fleet_of(nodes, "lowcpu")
    assert [n.cpu_milli for n in low] == [16000, 16000, 32000, 8000]
    assert [n.gpus for n in low] == [n.gpus for n in nodes]


@pytest.mark.parametrize(
    ("weights", "message"),
    [("idel=0", "--weights: unknown idel; allowed: gpu,"), ("idle", "name=number pairs")],
)
def test_bad_weights_are_a_usage_error(
    bench: ModuleType,
    trace_dir: Path,
    weights: str,
    message: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--trace-dir", str(trace_dir), "--traces", "tiny", "--weights", weights])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_any_trace_of_the_folder_runs_and_a_missing_one_is_named(
    bench: ModuleType, trace_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--traces` takes any openb_pod_list_NAME.csv of `--trace-dir` (the variants nobody tuned
    on included); one it lacks is a usage error listing those it has."""
    out = tmp_path / "out.json"
    (trace_dir / "openb_pod_list_gpushare100.csv").write_text(PODS)  # a name FGD has a figure for
    argv = ["--trace-dir", str(trace_dir), "--seeds", "42", "--scorers", "fragmentation"]
    assert bench.main([*argv, "--traces", "tiny,gpushare100", "--json", str(out)]) == 0
    assert list(json.loads(out.read_text())) == ["tiny", "gpushare100"]
    printed = capsys.readouterr().out
    assert all(len(line) <= 80 for line in printed.splitlines())
    rows = [line.split() for line in printed.splitlines() if "seed" not in line]
    (row,) = [cells for cells in rows if cells[:1] == ["gpushare100"]]
    assert row[:3] == ["gpushare100", "fragmentation", "learned"]  # nothing cut
    assert "13.36%" in row  # FGD's published figure beside it
    with pytest.raises(SystemExit) as exit_info:
        bench.main([*argv, "--traces", "tiny,gpushare40"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "no openb_pod_list_gpushare40.csv" in err and "traces there: gpushare100, tiny" in err
    with pytest.raises(SystemExit):
        bench.main(["--trace-dir", str(tmp_path / "empty"), "--traces", "tiny"])
    assert "no openb_node_list_gpu_node.csv" in capsys.readouterr().err


def test_the_run_takes_a_control_worker_s_collector_unless_told(
    bench: ModuleType, trace_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`place` runs in a control worker's process, whose collector settings the benchmark's
    process takes (gpuflow/control/collector.py); `--collector cpython` keeps CPython's."""
    settled: list[bool] = []
    monkeypatch.setattr(bench.collector, "settle", lambda: settled.append(True))
    argv = ["--trace-dir", str(trace_dir), "--traces", "tiny", "--seeds", "42"]
    assert bench.main([*argv, "--scorers", "fragmentation"]) == 0
    assert settled == [True]
    assert bench.main([*argv, "--scorers", "fragmentation", "--collector", "cpython"]) == 0
    assert settled == [True]


def test_seeds_that_are_not_numbers_are_a_usage_error(
    bench: ModuleType, trace_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--trace-dir", str(trace_dir), "--traces", "tiny", "--seeds", "42,x"])
    assert exit_info.value.code == 2
    assert "--seeds: whole numbers" in capsys.readouterr().err
