"""What a chaos run (chaos.py) reads to judge it: the allocation and job tables through a
read-only connection, sampled on a thread while the kills go on, and the start and end lines the
job processes themselves append to a marker file.
"""

from __future__ import annotations

import json
import threading
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# ---- the tables, read-only ----------------------------------------------------------------


def read_only_engine(database_url: str) -> Any:
    from sqlalchemy import create_engine

    if database_url.startswith("sqlite:///"):
        path = database_url.removeprefix("sqlite:///")
        return create_engine(f"sqlite:///file:{path}?mode=ro&uri=true")
    url = database_url.replace("postgresql://", "postgresql+psycopg://", 1)
    return create_engine(url, connect_args={"options": "-c default_transaction_read_only=on"})


def _json_list(value: Any) -> list[int]:
    return list(json.loads(value) if isinstance(value, str) else value or [])


def read_allocations(engine: Any) -> list[tuple[str, int, str, list[int], float | None, list[int]]]:
    from sqlalchemy import text

    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT job_id, attempt, host_id, gpu_indices, gpu_fraction, blocks "
                "FROM allocations"
            )
        ).all()
    return [(r[0], r[1], r[2], _json_list(r[3]), r[4], _json_list(r[5])) for r in rows]


def read_statuses(engine: Any) -> dict[str, tuple[str, int]]:
    from sqlalchemy import text

    with engine.connect() as conn:
        rows = conn.execute(text("SELECT id, status, attempt FROM jobs")).all()
    return {r[0]: (r[1], r[2]) for r in rows}


def table_conflicts(
    rows: list[tuple[str, int, str, list[int], float | None, list[int]]],
) -> set[tuple[Any, ...]]:
    """(host, kind, index, holders) for every GPU or block held beyond its capacity."""
    held: dict[tuple[str, str, int], list[tuple[tuple[str, int], float]]] = defaultdict(list)
    for job, attempt, host, gpus, fraction, blocks in rows:
        for index in gpus:
            held[(host, "gpu", index)].append(((job, attempt), fraction or 1.0))
        for block in blocks:
            held[(host, "block", block)].append(((job, attempt), 1.0))
    return {
        (*key, tuple(sorted(holder for holder, _ in holders)))
        for key, holders in held.items()
        if sum(share for _, share in holders) > 1 + 1e-9
    }


@dataclass
class Sampler:
    """Reads the allocation table every `interval` s on its own thread; keeps every conflict."""

    engine: Any
    interval: float
    samples: int = 0
    errors: int = 0
    conflicts: set[tuple[Any, ...]] = field(default_factory=set)
    held_now: int = 0
    held_most: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="allocation-sampler", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                rows = read_allocations(self.engine)
            except Exception:  # a locked or restarting database: the next sample reads it
                self.errors += 1
                continue
            self.samples += 1
            self.held_now = len(rows)
            self.held_most = max(self.held_most, len(rows))
            self.conflicts |= table_conflicts(rows)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


# ---- markers: what the job processes themselves wrote --------------------------------------


def job_commands(marks: Path, seconds: float) -> list[str]:
    line = "$GPUFLOW_JOB_ID;$GPUFLOW_ATTEMPT;$GPUFLOW_NODE_RANK;$CUDA_VISIBLE_DEVICES;$PWD"
    return [
        f'echo "start;{line};$(date +%s.%N)" >> {marks}',
        f"sleep {seconds:.1f}",
        f'echo "end;{line};$(date +%s.%N)" >> {marks}',
    ]


def read_markers(marks: Path, home: Path) -> tuple[int, int, int]:
    """(started_twice, overlapping pairs on one GPU, runs without an end line)."""
    starts: Counter[tuple[str, str, str]] = Counter()
    spans: dict[tuple[str, str, str], dict[str, Any]] = {}
    text = marks.read_text() if marks.exists() else ""
    for line in text.splitlines():
        kind, job, attempt, rank, gpus, cwd, at = line.split(";")
        key = (job, attempt, rank)
        span = spans.setdefault(key, {"gpus": gpus, "cwd": cwd})
        if kind == "start":
            starts[key] += 1
            span.setdefault("start", float(at))
        else:
            span["end"] = float(at)
    by_gpu: dict[tuple[str, str], list[tuple[float, float, tuple[str, str]]]] = defaultdict(list)
    unended = 0
    for (job, attempt, _), span in spans.items():
        if "start" not in span or "end" not in span:
            unended += 1
            continue
        host = Path(span["cwd"]).relative_to(home / "agents").parts[0]
        for gpu in filter(None, span["gpus"].split(",")):
            by_gpu[(host, gpu)].append((span["start"], span["end"], (job, attempt)))
    overlaps = 0
    for runs in by_gpu.values():
        runs.sort()
        for i, (_, end, owner) in enumerate(runs):
            overlaps += sum(1 for s, _, o in runs[i + 1 :] if s < end and o != owner)
    return sum(1 for n in starts.values() if n > 1), overlaps, unended
