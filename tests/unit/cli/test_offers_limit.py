"""`gpuflow offers` on a fleet of many hosts: the best `--limit` hosts that fit (20 unless
asked), saying how many fit in all, and rejections grouped by reason past an answer's lines."""

from __future__ import annotations

import json

import pytest

from gpuflow.workflows import api_dry_runs
from gpuflow.workflows.api_dry_runs import (
    answer_lines,
)
from tests.unit.cli.conftest import Cli, lines_fit


def _fleet(hosts: int) -> str:
    lines = ["type: fleet", "name: wide", "kind: sim", "hosts:"]
    for i in range(hosts):
        count = 2 if i % 2 else 8
        gpus = f"[{{name: A100, memory: 80GB, count: {count}}}]"
        lines.append(f"  - {{name: n{i:04d}, gpus: {gpus}}}")
    return "\n".join(lines) + "\n"


def _rows(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.strip().split(" ")[0].isdigit()]


def test_offers_show_the_best_hosts_and_how_many_fit(cli: Cli) -> None:
    cli.fleet(_fleet(30))
    job = cli.write("j.yaml", "name: j\ncommands: [x]\nresources: {gpu: A100:1}\n")

    out = cli("offers", "-f", job)
    lines_fit(out)
    assert len(_rows(out)) == 20
    assert "the best 20 of 30 hosts that fit (--limit shows more)" in out

    out = cli("offers", "-f", job, "--limit", "3")
    assert len(_rows(out)) == 3
    assert "the best 3 of 30 hosts that fit" in out
    found = json.loads(cli("offers", "-f", job, "--limit", "3", "--json"))
    assert len(found["fits"]) == 3 and found["fits_total"] == 30
    assert [f["host"] for f in found["fits"]] == [r.split()[2] for r in _rows(out)]

    out = cli("offers", "-f", job, "--limit", "30")
    assert len(_rows(out)) == 30 and "hosts that fit (" not in out
    out = cli("offers", "-f", job, "--limit", "0")  # as ps's: every one an answer holds
    assert len(_rows(out)) == 30 and "hosts that fit (" not in out
    assert "--limit" in cli("offers", "-f", job, "--limit", "-1", code=2)


def test_offers_group_rejections_past_the_answer_s_lines(
    cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(api_dry_runs, "ANSWER_LINES", 40)  # 1,000 in the product
    hosts = answer_lines(1) + 2  # more refused hosts than one option's answer names
    cli.fleet(_fleet(2 * hosts))
    job = cli.write("j.yaml", "name: j\ncommands: [x]\nresources: {gpu: A100:4}\n")

    out = cli("offers", "-f", job)
    lines_fit(out)
    assert f"does not fit ({hosts:,} hosts, grouped by reason)" in out
    assert f"{hosts:,} hosts (n0001, n0003, n0005, ...):" in out
    found = json.loads(cli("offers", "-f", job, "--json"))
    assert found["rejections_total"] == hosts
    assert [r["hosts"] for r in found["rejections"]] == [hosts]
