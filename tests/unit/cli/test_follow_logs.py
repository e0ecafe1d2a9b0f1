"""The output `gpuflow apply` prints of the jobs it follows (gpuflow/cli/follow_logs.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from rich.console import Console

from gpuflow.cli import follow_logs
from gpuflow.cli.follow_logs import JobOutput
from gpuflow.errors import NotFoundError


class FakeLogs:
    """A client whose jobs wrote `chunks` (split anywhere, not only at line ends)."""

    def __init__(self, chunks: dict[str, list[str]]) -> None:
        self.chunks = chunks
        self.closed: list[str] = []

    async def logs(self, job_id: str, *, follow: bool) -> AsyncIterator[str]:
        assert follow
        try:
            if job_id not in self.chunks:
                raise NotFoundError(f"job {job_id} has no node 0")
            for chunk in self.chunks[job_id]:
                await asyncio.sleep(0)
                yield chunk
        finally:
            self.closed.append(job_id)


def _run(client: FakeLogs, started: list[tuple[str, str]], *, prefixed: bool) -> list[str]:
    console = Console(record=True, width=80)

    async def main() -> None:
        output = JobOutput(console, client, prefixed=prefixed)
        for job_id, name in started:
            output.started(job_id, name)
            output.started(job_id, name)  # seen running again: one stream still
        await output.finish()

    asyncio.run(main())
    return console.export_text().splitlines()


def test_one_job_prints_its_lines_as_written() -> None:
    client = FakeLogs({"job-a-1": ["hel", "lo\nwor", "ld\nno newline at the end"]})
    assert _run(client, [("job-a-1", "a")], prefixed=False) == [
        "hello",
        "world",
        "no newline at the end",
    ]
    assert client.closed == ["job-a-1"]  # its log reader ended


def test_several_jobs_prefix_each_line_with_the_name() -> None:
    client = FakeLogs({"job-a-1": ["x\n"], "job-b-2": ["y\n", "z\n"]})
    lines = _run(client, [("job-a-1", "a"), ("job-b-2", "b")], prefixed=True)
    assert sorted(lines) == ["a | x", "b | y", "b | z"]


def test_a_job_without_output_says_so_and_the_rest_go_on() -> None:
    client = FakeLogs({"job-b-2": ["y\n"]})
    lines = _run(client, [("job-a-1", "a"), ("job-b-2", "b")], prefixed=True)
    assert "a: output unavailable: job job-a-1 has no node 0" in lines
    assert "b | y" in lines


def test_past_the_most_streams_the_rest_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(follow_logs, "MOST_STREAMS", 2)
    client = FakeLogs({f"job-{k}": [f"{k}\n"] for k in "abc"})
    lines = _run(client, [(f"job-{k}", k) for k in "abc"], prefixed=True)
    assert sorted(line for line in lines if "|" in line) == ["a | a", "b | b"]
    assert lines[-1] == "output not shown for c (more than 2 jobs): gpuflow logs NAME"
    assert sorted(client.closed) == ["job-a", "job-b"]
