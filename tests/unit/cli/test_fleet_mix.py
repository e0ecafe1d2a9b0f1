"""`gpuflow fleet list --json` shows the request mix each fleet's scorer uses."""

from __future__ import annotations

import json

from gpuflow.status import JobStatus
from tests.unit.cli.conftest import Cli

FLEET = """
type: fleet
name: sim
kind: sim
hosts:
  - name: sim-a
    cpus: 16
    gpus: [{name: A100, memory: 80GB, count: 4}]
"""


def test_fleet_list_json_shows_the_built_in_then_the_learned_mix(cli: Cli) -> None:
    cli.fleet(FLEET)
    (fleet,) = json.loads(cli("fleet", "list", "--json"))
    assert fleet["workload"]["source"] == "built-in"
    assert fleet["workload"]["jobs"] == 0
    assert len(fleet["workload"]["requests"]) == 7
    cli.job("train", JobStatus.RUNNING, hosts=["sim-a"])  # placed on sim: 1 CPU, no GPU
    (fleet,) = json.loads(cli("fleet", "list", "--json"))
    mix = fleet["workload"]
    assert mix["source"] == "learned" and mix["jobs"] == 1
    cpu_only = [r for r in mix["requests"] if r["cpus"] == 1 and r["gpus"] == 0]
    assert cpu_only == [
        {
            "weight": round(1 / 9, 4),  # one job against the built-in mix worth 8
            "gpus": 0,
            "gpu_fraction": None,
            "cpus": 1.0,
            "memory_mib": 0,
            "gpu_names": [],
        }
    ]
    out = cli("fleet", "list")
    assert "sim-a" in out  # the table is unchanged
