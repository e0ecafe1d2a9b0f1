"""benchmarks/fleet_scale.py on a small slice of openb: the protocol's JSON, and an
over-allocation count that can see one."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from gpuflow.store.db import Store
from gpuflow.store.tables import AllocationRow

ROOT = Path(__file__).resolve().parents[2]
TRACE = next(
    (d for d in (ROOT.parent / "shared/data/openb", Path("/work/shared/data/openb")) if d.exists()),
    None,
)
pytestmark = pytest.mark.skipif(TRACE is None, reason="the openb trace is not here")
sys.path.insert(0, str(ROOT / "benchmarks"))

import fleet_scale  # noqa: E402


def test_a_small_run_writes_the_protocol_s_json(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    argv = ["--db", "sqlite", "--hosts", "30", "--cold", "2", "--no-two-workers"]
    assert fleet_scale.main([*argv, "--trace-dir", str(TRACE), "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    sqlite = result["sqlite"]
    assert {"placements_per_s", "p50_ms", "p99_ms", "unallocated_pct_at_100"} <= set(sqlite)
    assert sqlite["placements"] + sqlite["unschedulable"] == result["arrivals"] > 0
    assert sqlite["placements"] > 0
    assert sqlite["over_allocations"] == 0
    assert 0 <= sqlite["unallocated_pct_at_100"] <= 100
    assert sqlite["cold"]["transactions"] == 2
    # releases were made, those due together in one transaction (7 in 3 on these 30 hosts)
    assert 0 < sqlite["release_transactions"] < sqlite["releases"]
    assert sqlite["releases_per_s"] > 0


def test_a_run_on_a_shape_of_our_own_places_that_shape(tmp_path: Path) -> None:
    """`--fleet 1gpu`: openb's first nodes cut into hosts of one GPU. Forty of them hold forty
    GPUs (forty of openb's own nodes hold over a hundred), and of the `multigpu50` pods only
    those asking one GPU or less find a host."""
    found = {}
    for fleet in ("openb", "1gpu"):
        out = tmp_path / f"{fleet}.json"
        argv = ["--db", "sqlite", "--hosts", "40", "--cold", "0", "--no-two-workers"]
        argv += ["--fleet", fleet, "--trace", "multigpu50", "--trace-dir", str(TRACE)]
        assert fleet_scale.main([*argv, "--json", str(out)]) == 0
        found[fleet] = json.loads(out.read_text())
    one = found["1gpu"]
    assert (one["fleet"], one["trace"], one["hosts"]) == ("1gpu", "multigpu50", 40)
    assert one["arrivals"] * 3 < found["openb"]["arrivals"]
    sqlite = one["sqlite"]
    assert sqlite["placements"] > 0
    assert sqlite["placements"] + sqlite["unschedulable"] == one["arrivals"]
    # the multi-GPU pods: a tenth or more of the arrivals here, next to none on openb's nodes
    assert sqlite["unschedulable"] * 10 >= one["arrivals"]
    assert found["openb"]["sqlite"]["unschedulable"] * 10 < found["openb"]["arrivals"]
    assert sqlite["over_allocations"] == 0


def test_release_plan_releases_every_tenth_arrival_later() -> None:
    sequence = list(range(95))
    plan = fleet_scale.release_plan(sequence, 42)  # type: ignore[arg-type]
    assert sorted(plan) == list(range(9, 95, 10))
    assert all(i < when <= len(sequence) for i, when in plan.items())
    assert plan == fleet_scale.release_plan(sequence, 42)  # type: ignore[arg-type]


def test_over_allocations_counts_a_gpu_given_twice(sqlite_store: Store) -> None:
    nodes = fleet_scale.load_nodes(TRACE / "openb_node_list_gpu_node.csv")[:1]  # type: ignore[operator]
    fleet_scale.apply_fleet(sqlite_store, fleet_scale.fleet_spec(nodes))
    host = f"openb/{nodes[0].name}"
    with sqlite_store.session() as session:
        for job in ("a", "b"):
            session.add(
                AllocationRow(
                    job_id=job, attempt=1, rank=0, fleet="openb", host_id=host, gpu_indices=[0]
                )
            )
        session.commit()
    assert fleet_scale.over_allocations(sqlite_store) == 1


def test_a_trace_the_folder_lacks_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    """`--trace` takes any openb_pod_list_NAME.csv of the folder; one it lacks is named, with
    those it has, before any database is made."""
    with pytest.raises(SystemExit) as exit_info:
        fleet_scale.main(["--db", "sqlite", "--trace", "nonesuch", "--trace-dir", str(TRACE)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "no openb_pod_list_nonesuch.csv" in err and "default" in err
    with pytest.raises(SystemExit):  # no fleet of no hosts (a traceback from the fleet spec before)
        fleet_scale.main(["--db", "sqlite", "--hosts", "0", "--trace-dir", str(TRACE)])
    assert "--hosts: at least 1" in capsys.readouterr().err
