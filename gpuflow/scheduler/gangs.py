"""Gangs: a job with `nodes: N > 1` takes N whole, idle hosts of one fleet, or nothing.

The resource filter already drops hosts that are not idle (a host split into blocks counts as
idle only with every block free) and seats a gang node on all blocks of a split host. What is
left here is choosing: the N best-scored hosts, or an explanation of why a fleet has too few.
"""

from __future__ import annotations

from typing import TypeVar

T = TypeVar("T")


def choose_gang(ranked: list[T], nodes: int) -> list[T] | None:
    """The first `nodes` of the best-first candidates, or None when there are too few."""
    if len(ranked) < nodes:
        return None
    return ranked[:nodes]


def gang_shortfall(fitting: int, nodes: int) -> str:
    host_word = "host fits" if fitting == 1 else "hosts fit"
    return f"{fitting} idle {host_word}, and a {nodes}-node job needs {nodes} in one fleet"
