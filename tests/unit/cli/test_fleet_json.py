"""`gpuflow fleet list --json` and `fleet apply --json` show every host's field, the labels and
taints that decide placement first, and the table still fits 80 columns."""

from __future__ import annotations

import json

import pytest

from gpuflow.control import api as control_api
from tests.unit.cli.conftest import Cli, lines_fit

FLEET = """
type: fleet
name: sim
kind: sim
labels: {team: research, zone: eu-1}
utilization: {source: constant, value: 75}
hosts:
  - name: sim-a100
    gpus: [{name: A100, memory: 80GB, count: 2, compute_capability: "8.0"}]
    driver_version: "550.54"
    disk: 2TB
    labels: {zone: eu-2, rack: r7}
    taints: [gpu-only, owner=ml]
  - name: sim-cpu
    cpus: 4
"""


def _hosts(fleets: list[dict[str, object]]) -> dict[str, dict[str, object]]:
    (fleet,) = fleets
    assert isinstance(fleet["hosts"], list)
    return {host["name"]: host for host in fleet["hosts"]}


def _check(hosts: dict[str, dict[str, object]]) -> None:
    a100 = hosts["sim-a100"]
    assert a100["labels"] == {"team": "research", "zone": "eu-2", "rack": "r7"}
    assert a100["taints"] == ["gpu-only", "owner=ml"]
    assert a100["disk_mib"] == 2 * 1024 * 1024
    assert a100["disk_used_mib"] == 0
    assert a100["driver_version"] == "550.54"
    assert [gpu["compute_capability"] for gpu in a100["gpus"]] == ["8.0", "8.0"]  # type: ignore[attr-defined]
    assert a100["utilization"] == {"source": "constant", "value": 75.0}
    assert "other_labels" not in a100  # the API's compact form, put back together
    cpu = hosts["sim-cpu"]
    assert cpu["labels"] == {"team": "research", "zone": "eu-1"}
    assert cpu["taints"] == []
    assert cpu["driver_version"] is None


def test_fleet_list_json_has_labels_taints_disk_driver_and_capability(cli: Cli) -> None:
    cli.fleet(FLEET)
    _check(_hosts(json.loads(cli("fleet", "list", "--json"))))
    lines_fit(cli("fleet", "list"))


def test_fleet_apply_json_has_them_too(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the control plane's apply (its fleet's health checks are not started here)."""

    async def no_health_checks(*_: object) -> None:
        return None

    monkeypatch.setattr(control_api, "watch_fleet", no_health_checks)
    path = cli.write("fleet.yaml", FLEET)
    _check(_hosts([json.loads(cli("fleet", "apply", "-f", path, "--json"))]))


def test_a_sim_host_without_a_declared_source_says_process_cpu(cli: Cli) -> None:
    cli.fleet(FLEET.replace("utilization: {source: constant, value: 75}\n", ""))
    hosts = _hosts(json.loads(cli("fleet", "list", "--json")))
    assert hosts["sim-a100"]["utilization"] == {"source": "process_cpu", "value": 0.0}
