"""Queue benchmark: the openb default trace online through admission, in simulated time.

    python benchmarks/queueing.py trace [--json PATH] [--every 100] [--offset 0] [--limit N]
                                        [--fleet openb|2gpu|1gpu|lowcpu] [--trace NAME]
    python benchmarks/queueing.py e2e [--json PATH] [-n 200]   (benchmarks/queue_e2e.py)

Pods arrive at `creation_time` and, once started, hold their resources for their trace
lifetime: `deletion_time - scheduled_time`, or `deletion_time - creation_time` for the pods the
trace never scheduled (`Pending`: the time their owner wanted them). Priority from `qos`: LS and
Guaranteed 100, Burstable 50, BE 0 and preemptible (a preempted pod waits again and restarts
from the beginning). Two queues split the fleet's GPUs 50/50 in one cohort; a pod goes to the
queue picked by the CRC-32 of its name. At its real rate the trace never uses more than 66 GPUs
at once, so the fleet is every `--every`-th node of the 1,213 openb GPU nodes by name from the
`--offset`-th (100 from 0: 13 nodes, 56 GPUs), or those nodes cut into nodes of 2 or 1 GPUs
(`--fleet`, as in placement.py); pods that fit nowhere even on the empty fleet are left out (and
counted). `--trace NAME`: another pod list of the openb release with the columns of time.
Every policy places with the fragmentation scorer and the fleet's mix learned from the pods
that arrived so far, as the product scores (benchmarks/openb.py `OnlineMix`; until this was
said here, the built-in mix, which no fleet with jobs uses).

Policies, on the same arrivals: `today` (what the job workflow's place step does: each pod
retries alone, 5 s doubling to 5 min between tries, and every release wakes every waiting pod,
which then race for the freed capacity in an order nobody controls: a seeded shuffle here),
`fifo` (submission order; the first pod that does not fit blocks the rest), `queue`
(gpuflow.scheduler.admission, one pass at every instant when a pod arrives or ends; the trace
declares no durations, so backfill uses reserved hosts only beside the room the reserved pod
needs) and `queue+limits` (the same, each pod declaring its trace lifetime as max_duration: an
oracle).
Figures per policy: see README.md ("Queue").
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.openb import FLEETS, unknown_traces  # noqa: E402
from benchmarks.queue_sim import POLICIES, simulate  # noqa: E402


def _data_dir() -> Path:
    """`shared/data/openb` beside the checkout, or beside a folder above it (a git worktree)."""
    for folder in ROOT.parents:
        if (folder / "shared" / "data" / "openb").is_dir():
            return folder / "shared" / "data" / "openb"
    return ROOT.parent / "shared" / "data" / "openb"


FIGURES = (  # heading, JSON key, width, format
    ("alloc%", "gpu_alloc_pct", 7, ".2f"),
    ("busy%", "gpu_alloc_busy_pct", 7, ".1f"),
    ("invers", "priority_inversions", 7, ""),
    ("resv", "inversions_behind_reservation", 6, ""),
    ("preempt", "preemptions", 8, ""),
    ("8-GPU max s", "max_wait_8gpu_s", 12, ".0f"),
    ("unstarted", "never_started", 10, ""),
)
GAPS = (
    ("gap max", "max_share_gap_pct", 8, ".1f"),
    ("gap avg", "mean_share_gap_pct", 8, ".1f"),
    ("quota gap max", "max_quota_gap_pct", 15, ".1f"),
    ("quota gap avg", "mean_quota_gap_pct", 15, ".1f"),
    ("both wait s", "both_waiting_s", 12, ""),
)


def table(results: dict[str, dict[str, object]]) -> str:
    """Three tables under 80 columns: waits per priority class, the other figures, then the
    share gaps (percentage points, while both queues have waiting pods)."""
    lines = [f"{'wait s: mean / p95':<20}{'prio 100':>17}{'prio 50':>17}{'prio 0':>17}"]
    for policy, report in results.items():
        waits = report["wait_s"]
        assert isinstance(waits, dict)
        cells = "".join(
            f"{waits[k]['mean']:>8.0f} /{waits[k]['p95']:>7.0f}" for k in ("100", "50", "0")
        )
        lines.append(f"{policy:<20}{cells}")
    for title, columns in (("policy", FIGURES), ("share gap", GAPS)):
        lines += ["", f"{title:<13}" + "".join(f"{head:>{width}}" for head, _, width, _ in columns)]
        for policy, r in results.items():
            cells = "".join(format(r[key], f">{width}{how}") for _, key, width, how in columns)
            lines.append(f"{policy:<13}{cells}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=["trace", "e2e"])
    parser.add_argument("--json", type=Path, help="write {trace: {policy: {...}}} here")
    parser.add_argument("-n", type=int, default=200, help="e2e: jobs of `sleep 2`")
    parser.add_argument("--every", type=int, default=100, help="take every Nth openb GPU node")
    parser.add_argument("--offset", type=int, default=0, help="starting from this one")
    parser.add_argument(
        "--fleet", default="openb", choices=FLEETS, help="those nodes, or cut in 2 or 1 GPUs"
    )
    parser.add_argument("--limit", type=int, help="only the first N pods (by arrival)")
    parser.add_argument("--trace-dir", type=Path, default=_data_dir())
    parser.add_argument(
        "--trace", default="default", help="trace: openb_pod_list_NAME.csv in --trace-dir"
    )
    parser.add_argument("--policies", default=",".join(POLICIES))
    args = parser.parse_args(argv)
    if args.every < 1 or args.offset < 0 or (args.limit is not None and args.limit < 1):
        parser.error("--every and --limit: at least 1; --offset: at least 0")
    if args.mode == "e2e":
        from benchmarks.queue_e2e import BIG_AFTER, main_e2e

        if args.n < 2 * BIG_AFTER:
            parser.error(f"-n: at least {2 * BIG_AFTER} (the big job comes after the first 5)")

        main_e2e(args.n, args.json)
        return 0
    missing = unknown_traces(args.trace_dir, [args.trace])
    if missing:
        parser.error(missing)
    results: dict[str, dict[str, object]] = {}
    for policy in args.policies.split(","):
        if policy not in POLICIES:
            parser.error(f"unknown policy {policy!r}; allowed: {', '.join(POLICIES)}")
        began = time.perf_counter()
        try:
            report, left_out = simulate(
                args.trace_dir,
                args.every,
                args.limit,
                policy,
                offset=args.offset,
                shape=args.fleet,
                trace=args.trace,
            )
        except ValueError as exc:
            parser.error(str(exc))
        report["seconds"] = round(time.perf_counter() - began, 1)
        report["pods_left_out"] = left_out
        results[policy] = report
        print(f"{policy}: {report['seconds']} s", file=sys.stderr)
    print(table(results))
    if args.json:
        existing = json.loads(args.json.read_text()) if args.json.exists() else {}
        existing["trace"] = results
        args.json.write_text(json.dumps(existing, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
