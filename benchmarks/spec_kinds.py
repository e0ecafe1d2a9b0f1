"""What reading stored job specs costs the learned mix (gpuflow/services/mix.py `_kind_of_spec`).

Protocol: the first N openb `default` pods as gpuflow jobs (`job_of`), dumped as the product
stores them (`model_dump(mode="json")`); each spec's kind read as a control worker that has not
seen them does (the per-ask memo cleared before every repetition), against validating each
whole spec (what the mix did before 7d28392), in the same process. Both must give the same
kinds; the figure is the median of `--repeat` repetitions. A control worker pays this on its
first window read of a fleet and for every job another control worker wrote.

    python benchmarks/spec_kinds.py                    # 5,000 specs, 5 repetitions
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from openb import job_of, load_pods  # noqa: E402

from gpuflow.services import mix  # noqa: E402
from gpuflow.specs import JobSpec  # noqa: E402


def _whole(spec: dict[str, object]) -> object:
    return mix._kind_of_job(JobSpec.model_validate(spec))


def _timed(
    read: Callable[[dict[str, object]], object], specs: list[dict[str, object]], n: int
) -> tuple[float, list[object]]:
    runs: list[float] = []
    kinds: list[object] = []
    for _ in range(n):
        mix._BY_ASK.clear()
        begun = time.perf_counter()
        kinds = [read(spec) for spec in specs]
        runs.append(time.perf_counter() - begun)
    return statistics.median(runs), kinds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace-dir", type=Path, default=ROOT.parent / "shared/data/openb")
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    pods = load_pods(args.trace_dir / "openb_pod_list_default.csv")[: args.jobs]
    specs = [job_of(pod).model_dump(mode="json") for pod in pods]
    asks, by_ask = _timed(mix._kind_of_spec, specs, args.repeat)
    whole, by_whole = _timed(_whole, specs, args.repeat)
    assert by_ask == by_whole, "the two reads disagree"
    print(
        f"{len(specs)} specs, {len(set(by_ask))} kinds: by ask {asks * 1e3:.0f} ms, "
        f"whole specs {whole * 1e3:.0f} ms ({whole / asks:.1f}x), median of {args.repeat}"
    )


if __name__ == "__main__":
    main()
