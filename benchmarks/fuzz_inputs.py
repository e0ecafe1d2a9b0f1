"""Feed generated job and fleet files through the loaders and count what went wrong.

    PYTHONPATH=$PWD python benchmarks/fuzz_inputs.py --jobs 2000 --fleets 1000 [--json PATH]

Inputs, from a seeded generator: the known-bad corpus (tests/unit/input_corpus.py; each must be
refused), the known-good corpus (each must be accepted), nasty values put into random fields,
random edits of examples/*.yaml, and random bytes. Counted per loader: tracebacks (any exception
that is not a gpuflow error), inputs over 1 s, hangs (over 10 s, interrupted), known-bad files
accepted, known-good files refused, and refusals that are not one line of at most 400 characters.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpuflow.errors import MAX_MESSAGE, GpuflowError
from gpuflow.specs import load_fleet, load_job
from tests.unit import input_corpus as corpus
from tests.unit.input_corpus import FLEET_HOST_FIELDS, JOB_FIELDS, NASTY

SLOW_S = 1.0
HANG_S = 10.0


class Hang(Exception):
    pass


def _alarm(signum: int, frame: Any) -> None:
    raise Hang


def _mutate(rng: random.Random, text: str) -> bytes:
    data = bytearray(text.encode())
    for _ in range(rng.randint(1, 4)):
        where = rng.randrange(len(data) + 1)
        kind = rng.randrange(4)
        if kind == 0:
            data[where:where] = rng.choice(NASTY).encode()
        elif kind == 1:
            data[where : where + rng.randint(1, 8)] = b""
        elif kind == 2:
            data[where:where] = bytes([rng.randrange(256)])
        else:
            line_end = data.find(b"\n", where)
            colon = data.rfind(b":", 0, line_end if line_end >= 0 else len(data))
            if colon >= 0:
                end = line_end if line_end >= 0 else len(data)
                data[colon + 1 : end] = b" " + rng.choice(NASTY).encode()
    return bytes(data)


def generate(rng: random.Random, kind: str) -> tuple[bytes, str]:
    """One file's bytes and what it must give: 'bad', 'good' or '' (either is fine)."""
    bad = corpus.BAD_JOBS if kind == "job" else corpus.BAD_FLEETS
    good = corpus.GOOD_JOBS if kind == "job" else corpus.GOOD_FLEETS
    examples = [
        p.read_text()
        for p in corpus.example_files()
        if ("type: fleet" in p.read_text()) == (kind == "fleet")
    ]
    roll = rng.random()
    if roll < 0.25:
        _, data, _ = rng.choice(bad)
        return b"# generated\n" + data, "bad"
    if roll < 0.35:
        return rng.choice(good)[1], "good"
    if roll < 0.6:
        value = rng.choice(NASTY)
        if kind == "job":
            field = rng.choice(JOB_FIELDS)
            return (corpus.JOB + f"{field}: {value}\n").encode(), ""
        return (corpus.SSH_FLEET + f"    {rng.choice(FLEET_HOST_FIELDS)}: {value}\n").encode(), ""
    if roll < 0.9:
        return _mutate(rng, rng.choice(examples)), ""
    return bytes(rng.randrange(256) for _ in range(rng.randint(0, 400))), ""


def run(kind: str, count: int, seed: int, workdir: Path) -> dict[str, Any]:
    rng = random.Random(f"{seed}-{kind}")
    load = load_job if kind == "job" else load_fleet
    (workdir / "profile.yaml").write_text((corpus.EXAMPLES / "profile.yaml").read_text())
    counts: Counter[str] = Counter()
    slowest = 0.0
    examples: dict[str, str] = {}
    for i in range(count):
        data, expected = generate(rng, kind)
        path = workdir / f"{kind}.yaml"
        path.write_bytes(data)
        signal.setitimer(signal.ITIMER_REAL, HANG_S)
        start = time.perf_counter()
        outcome = "accepted"
        try:
            load(path)
        except GpuflowError as exc:
            outcome = "refused"
            message = str(exc)
            if "\n" in message or len(message) > MAX_MESSAGE:
                counts["long or multi-line message"] += 1
        except Hang:
            outcome = "hang"
        except Exception as exc:  # what this script counts
            outcome = "traceback"
            examples.setdefault(f"traceback {type(exc).__name__}", repr(data[:160]))
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        elapsed = time.perf_counter() - start
        slowest = max(slowest, elapsed)
        counts[outcome] += 1
        if elapsed > SLOW_S:
            counts["over 1 s"] += 1
        if expected == "bad" and outcome == "accepted":
            counts["known-bad accepted"] += 1
            examples.setdefault(f"accepted #{i}", repr(data[:160]))
        if expected == "good" and outcome != "accepted":
            counts["known-good refused"] += 1
        counts[f"expected {expected or 'either'}"] += 1
    return {
        "inputs": count,
        "counts": dict(sorted(counts.items())),
        "slowest_s": round(slowest, 3),
        "examples": examples,
    }


def megabyte(workdir: Path) -> dict[str, Any]:
    """The densest 1 MB fleet file (one host a line, every line many values): seconds of
    CPU to read or refuse it, best and worst of 5."""
    host = "  - {name: h%d, cpus: 8, gpus: [{name: A100, memory: 80GB}], labels: {a: b}}\n"
    text = "type: fleet\nname: f\nkind: sim\nhosts:\n" + "".join(host % i for i in range(14_000))
    path = workdir / "dense.yaml"
    path.write_text(text[: text.rindex("\n", 0, 1024 * 1024 - 1) + 1])
    times, outcome = [], ""
    for _ in range(5):
        start = time.process_time()
        try:
            load_fleet(path)
            outcome = "accepted"
        except GpuflowError as exc:
            outcome = f"refused: {str(exc).split(': ', 1)[1]}"
        times.append(time.process_time() - start)
    return {
        "bytes": path.stat().st_size,
        "outcome": outcome,
        "cpu_s_best": round(min(times), 3),
        "cpu_s_worst": round(max(times), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--fleets", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    if args.jobs < 0 or args.fleets < 0:
        parser.error("--jobs and --fleets must be 0 or more")
    signal.signal(signal.SIGALRM, _alarm)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        result: dict[str, Any] = {
            "job files": run("job", args.jobs, args.seed, Path(tmp)),
            "fleet files": run("fleet", args.fleets, args.seed, Path(tmp)),
            "1 MB fleet file": megabyte(Path(tmp)),
        }
    result["seconds"] = round(time.perf_counter() - started, 1)
    for name, figures in result.items():
        if isinstance(figures, dict) and "counts" not in figures:
            print(
                f"{name}: {figures['bytes']} bytes, {figures['outcome']}, "
                f"{figures['cpu_s_best']}-{figures['cpu_s_worst']} s of CPU"
            )
        elif isinstance(figures, dict):
            counts = figures["counts"]
            print(
                f"{name}: {figures['inputs']} inputs, "
                f"{counts.get('traceback', 0)} tracebacks, {counts.get('hang', 0)} hangs, "
                f"{counts.get('over 1 s', 0)} over 1 s (slowest {figures['slowest_s']} s), "
                f"{counts.get('known-bad accepted', 0)} of {counts.get('expected bad', 0)} "
                f"known-bad accepted, {counts.get('known-good refused', 0)} of "
                f"{counts.get('expected good', 0)} known-good refused, "
                f"{counts.get('refused', 0)} refused, {counts.get('accepted', 0)} accepted"
            )
    print(f"{result['seconds']} s in all")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
