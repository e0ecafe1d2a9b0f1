"""The garbage collector's settings for a control worker's process (`gpuflow.control.main`,
and the embedded stack's `gpuflow up`).

A control worker keeps the fleets, the scheduler's memo tables and rankings, and the fleets'
job kinds in memory for its whole life: at openb's 1,213 hosts, some 400,000 objects the cycle
collector must walk in a full collection. With CPython's default thresholds (a young
collection every 700 new container objects) a placement burst allocates enough that a full
collection runs every few seconds, 100-250 ms each; a submit that meets one waits for it
(benchmarks/README.md, "Fleet scale": the p99 of a submit under load was mostly these).

So, once the process has imported what it runs, what is alive then (modules, classes,
functions: about 100,000 objects) is frozen out of every later collection (`gc.freeze`), and a
young collection runs every `YOUNG` new container objects: the long-lived ones are promoted, and
so walked by full collections, 70 times less often. Memory freed by reference counting, nearly
all of it, is freed as before; only garbage cycles wait longer.
"""

from __future__ import annotations

import gc

YOUNG = 50_000
"""New container objects between young collections (CPython's default: 700)."""


def settle() -> None:
    """Apply the settings above to this process (idempotent)."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG, middle, old)
