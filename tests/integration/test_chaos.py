"""benchmarks/chaos.py: its detectors on made-up evidence, and a short run on a real stack
(dev server, control worker process, SQLite) with kill -9 of both."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "chaos.py"


@pytest.fixture(scope="module")
def chaos() -> ModuleType:
    spec = importlib.util.spec_from_file_location("chaos_bench", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["chaos_bench"] = module
    spec.loader.exec_module(module)
    return module


def test_a_gpu_in_two_allocations_is_a_conflict(chaos: ModuleType) -> None:
    rows = [
        ("job-a", 1, "h1", [0, 1], None, []),
        ("job-b", 1, "h1", [1], None, []),
        ("job-c", 1, "h2", [1], None, []),  # another host: no conflict
    ]
    assert chaos.table_conflicts(rows) == {("h1", "gpu", 1, (("job-a", 1), ("job-b", 1)))}


def test_fractions_conflict_only_beyond_one_gpu(chaos: ModuleType) -> None:
    halves = [("job-a", 1, "h1", [0], 0.5, []), ("job-b", 1, "h1", [0], 0.5, [])]
    assert chaos.table_conflicts(halves) == set()
    over = [*halves, ("job-c", 1, "h1", [0], 0.25, [])]
    assert len(chaos.table_conflicts(over)) == 1


def test_a_block_held_twice_is_a_conflict(chaos: ModuleType) -> None:
    rows = [("job-a", 1, "h1", [], None, [2]), ("job-b", 2, "h1", [], None, [2])]
    assert chaos.table_conflicts(rows) == {("h1", "block", 2, (("job-a", 1), ("job-b", 2)))}


def _marks(home: Path, lines: list[tuple[str, str, int, str, str, float]]) -> Path:
    marks = home / "marks"
    text = ""
    for kind, job, attempt, gpus, host, at in lines:
        cwd = home / "agents" / host / "jobs" / job / f"{attempt}-0"
        text += f"{kind};{job};{attempt};0;{gpus};{cwd};{at}\n"
    marks.write_text(text)
    return marks


def test_markers_find_a_second_start_and_an_overlap(chaos: ModuleType, tmp_path: Path) -> None:
    marks = _marks(
        tmp_path,
        [
            ("start", "job-a", 1, "0,1", "h1", 10.0),
            ("start", "job-a", 1, "0,1", "h1", 11.0),  # the same (job, attempt, rank) again
            ("start", "job-b", 1, "1", "h1", 12.0),  # GPU 1 of h1 while job-a runs there
            ("start", "job-c", 1, "1", "h2", 12.0),  # GPU 1 of another host: fine
            ("end", "job-a", 1, "0,1", "h1", 14.0),
            ("end", "job-b", 1, "1", "h1", 15.0),
            ("end", "job-c", 1, "1", "h2", 15.0),
            ("start", "job-d", 1, "0", "h1", 16.0),  # after job-a ended: fine, but no end line
        ],
    )
    assert chaos.read_markers(marks, tmp_path) == (1, 1, 1)


def test_markers_of_one_job_after_another_are_clean(chaos: ModuleType, tmp_path: Path) -> None:
    marks = _marks(
        tmp_path,
        [
            ("start", "job-a", 1, "0", "h1", 10.0),
            ("end", "job-a", 1, "0", "h1", 12.0),
            ("start", "job-a", 2, "0", "h1", 13.0),  # a retry is another attempt
            ("end", "job-a", 2, "0", "h1", 14.0),
            ("start", "job-b", 1, "0", "h1", 14.5),
            ("end", "job-b", 1, "0", "h1", 16.0),
        ],
    )
    assert chaos.read_markers(marks, tmp_path) == (0, 0, 0)


@pytest.mark.integration
def test_short_run_loses_nothing(tmp_path: Path) -> None:
    out = tmp_path / "chaos.json"
    command = [sys.executable, str(SCRIPT), "--kills", "2", "--server-kills", "1"]
    command += ["--jobs", "6", "--job-seconds", "1-3", "--seed", "7", "--json", str(out)]
    run = subprocess.run(command, capture_output=True, text=True, timeout=240, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert set(figures) == {
        "kills",
        "server_kills",
        "jobs",
        "done",
        "lost",
        "started_twice",
        "double_allocations",
        "leaked_allocations",
        "seconds",
        "details",
    }
    assert (figures["kills"], figures["server_kills"], figures["jobs"]) == (2, 1, 6)
    assert figures["done"] == 6, figures
    zeros = ("lost", "started_twice", "double_allocations", "leaked_allocations")
    assert {name: figures[name] for name in zeros} == dict.fromkeys(zeros, 0), figures
    details = figures["details"]
    assert details["allocation_samples"] > 0
    assert details["most_allocations_held"] > 0  # the sampler saw the jobs' allocations
    assert details["job_processes_left"] == 0
    assert details["worker_starts"] >= 3
