"""The placement scorers users may name and the weights of their terms: the one owner of these
names and defaults (the specs validate against them, the scheduler scores with them)."""

from __future__ import annotations

SCORERS = ("fragmentation", "binpack", "spread")
"""Placement scorers a fleet or a job may choose."""

DEFAULT_SCORER = "fragmentation"

DEFAULT_WEIGHTS = {
    "gpu": 1.0,
    "cpu": 0.25,
    "memory": 0.25,
    "fragmentation": 1.0,
    "binpack": 0.05,
    "capacity": 1.0,
    "capacity_whole": 0.1,
    "scarcity": 1.0,
    "idle": 1.0,
}
"""Weights of the scorer terms; a fleet's `scorer_weights` overrides some of them."""
