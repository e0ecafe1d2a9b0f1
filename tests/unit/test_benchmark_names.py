"""A script in benchmarks/ runs with benchmarks/ first on sys.path: one named like a standard
module (queue.py, say) would be imported in its place by every other script there."""

from __future__ import annotations

import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def test_no_benchmark_shadows_a_standard_module() -> None:
    names = {path.stem for path in BENCHMARKS.glob("*.py")}
    assert names, BENCHMARKS
    assert sorted(names & set(sys.stdlib_module_names)) == []
