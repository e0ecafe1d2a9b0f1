"""A queue without a quota limit (the built-in default, or one applied as such) shows its quota
as null in `queue list --json` and None in the client's QueueInfo, as the table says `no limit`;
not as the most a quota may be (`{"*": 1000000}`), which reads as a real quota."""

from __future__ import annotations

import json

from gpuflow.client import QueueInfo
from gpuflow.specs.queue import MAX_QUOTA_GPUS
from gpuflow.workflows.api_queues import QueueRecord
from tests.unit.cli.conftest import Cli, lines_fit


def test_no_limit_is_null_in_json_as_in_the_table(cli: Cli) -> None:
    cli("queue", "apply", "-f", cli.write("r.yaml", "type: queue\nname: research\ngpus: 4\n"))
    endless = f"type: queue\nname: endless\ngpus: {MAX_QUOTA_GPUS}\n"
    cli("queue", "apply", "-f", cli.write("e.yaml", endless))
    data = {q["name"]: q for q in json.loads(cli("queue", "list", "--json"))}
    assert data["default"]["quota"] is None and data["default"]["built_in"] is True
    assert data["endless"]["quota"] is None and data["endless"]["built_in"] is False
    assert data["research"]["quota"] == {"*": 4}
    rows = {line.split()[0]: line.split()[1:4] for line in lines_fit(cli("queue", "list"))[1:]}
    assert rows["default"] == rows["endless"] == ["-", "no", "limit"]
    assert rows["research"][:2] == ["-", "4"]
    applied = json.loads(cli("queue", "apply", "-f", cli.write("d.yaml", endless), "--json"))
    assert applied["queue"]["quota"] is None


def test_a_record_of_an_older_control_worker_still_reads() -> None:
    """One without `unlimited`: its built-in default says so by `built_in`."""
    old = {"name": "default", "quota": {"*": MAX_QUOTA_GPUS}, "built_in": True}
    assert QueueInfo.from_record(QueueRecord.model_validate(old)).quota is None
    research = {"name": "research", "quota": {"A100": 2}}
    assert QueueInfo.from_record(QueueRecord.model_validate(research)).quota == {"A100": 2}
    # what `queue list --json` printed before reads back too
    assert QueueInfo.model_validate(old).quota == {"*": MAX_QUOTA_GPUS}
