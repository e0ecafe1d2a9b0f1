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

A middle collection walks what the young collections since the last one promoted: with
CPython's default of one every 10 young collections, up to ten young collections' survivors at
once (the memo tables a placement burst fills), 140-160 ms on openb's fleet. One every `MIDDLE`
+ 1 young collections walks the same objects in all, in pieces of at most two young
collections' survivors: 37-64 ms each. More survivors reach the old generation before they
die, so full collections come a little more often and walk more (4 a run of up to 164 ms
against 3 of up to 54), and the collector's time in all is about the same (1.1-1.3 s a run
against 1.1); a submit's p99 under load (32 in flight, SQLite) is 89-122 ms instead of
148-154 (benchmarks/README.md, "Fleet scale", eighth pass).
"""

from __future__ import annotations

import gc

YOUNG = 50_000
"""New container objects between young collections (CPython's default: 700)."""
MIDDLE = 1
"""Young collections between middle collections, past which one runs (CPython's default: 10)."""


def settle() -> None:
    """Apply the settings above to this process (idempotent)."""
    gc.collect()
    gc.freeze()
    old = gc.get_threshold()[2]
    gc.set_threshold(YOUNG, MIDDLE, old)
