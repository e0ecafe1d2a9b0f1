"""How benchmarks/fleet_scale.py reports: percentiles of a list of call times, and the line a
database's run prints."""

from __future__ import annotations

import statistics
from typing import Any


def ms_of(prefix: str, values: list[float]) -> dict[str, float]:
    """`{prefix}p50_ms` and `{prefix}p99_ms` of call times in seconds (nothing when none)."""
    if not values:
        return {}
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {f"{prefix}p50_ms": statistics.median(ordered) * 1000, f"{prefix}p99_ms": p99 * 1000}


def print_result(kind: str, r: dict[str, Any]) -> None:
    print(
        f"{kind}: {r['placements']} placements, {r['placements_per_s']:.1f}/s, "
        f"p50 {r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms; releases "
        f"{r.get('releases_per_s', 0):.1f}/s, p50 {r.get('release_p50_ms', 0):.1f} / "
        f"p99 {r.get('release_p99_ms', 0):.1f} ms in {r.get('release_transactions')} "
        "transactions; "
        f"unallocated at 100% {r['unallocated_pct_at_100']:.2f}% "
        f"(pure function {r['pure_unallocated_pct_at_100']:.2f}%), "
        f"{r['unschedulable']} unschedulable, {r['over_allocations']} over-allocations"
    )
    if "cold" in r:
        print(f"  cold path: p50 {r['cold']['p50_ms']:.1f} ms, p99 {r['cold']['p99_ms']:.1f} ms")
