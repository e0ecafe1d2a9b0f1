"""`gpuflow ps --limit`: the newest N jobs (200 unless asked), saying when there are more."""

from __future__ import annotations

import json

from gpuflow.status import JobStatus
from tests.unit.cli.conftest import Cli, lines_fit


def test_ps_shows_the_newest_jobs_and_says_when_there_are_more(cli: Cli) -> None:
    for k in range(12):
        cli.job(f"j{k:02d}", JobStatus.RUNNING, suffix=f"{k:06d}", minutes_ago=20 - k, hosts=["b"])

    out = cli("ps", "--limit", "5")
    lines_fit(out)
    assert [name for name in (f"j{k:02d}" for k in range(12)) if name in out] == [
        "j07",
        "j08",
        "j09",
        "j10",
        "j11",
    ]
    assert "the newest 5 jobs; more exist (--limit N, or 0 for all)" in out
    out, notice = cli.streams("ps", "--limit", "5", "--json")
    assert [job["name"] for job in json.loads(out)] == ["j11", "j10", "j09", "j08", "j07"]
    assert "the newest 5 jobs; more exist" in notice  # a script reading stdout is told too
    out, notice = cli.streams("ps", "--limit", "12", "--json")
    assert len(json.loads(out)) == 12 and "more exist" not in notice

    for limit in ("0", "12", "200"):
        out = cli("ps", "--limit", limit)
        assert all(f"j{k:02d}" in out for k in range(12)) and "more exist" not in out
    assert "--limit" in cli("ps", "--limit", "-1", code=2)
