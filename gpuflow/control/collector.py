"""The garbage collector's settings for a control worker's process (`gpuflow.control.main`,
and the embedded stack's `gpuflow up`).

A control worker keeps the fleets, the scheduler's memo tables and rankings, and the fleets'
job kinds in memory for its whole life: at openb's 1,213 hosts, some 400,000 objects the cycle
collector must walk in a full collection. With CPython's default thresholds (a young
collection every 700 new container objects) a placement burst allocates enough that a full
collection runs every few seconds, 100-250 ms each; a submit that meets one waits for it
(benchmarks/README.md, "Fleet scale": the p99 of a submit under load was mostly these).

So, once the process has imported what it runs, what is alive then (modules, classes,
functions: about 100,000 objects) is frozen out of every later collection (`gc.freeze`), and
collections are spaced by three thresholds, each for the pause it bounds:

- `YOUNG`: a young collection walks the new container objects still alive, at most this many.
  At 15,000 the longest took 7-10 ms in a run here; at 50,000 (this module's value before),
  21-25 ms.
- `MIDDLE`: a middle collection runs after `MIDDLE` + 1 young ones, so it walks at most two
  young collections' survivors (the longest 12-19 ms a run here; at 50,000 young, 43-70 ms).
  CPython's default, one every 10, walked ten at once: 140-160 ms on openb's fleet.
- `OLD`: a full collection walks every long-lived object, the warm state and the scheduler's
  memo tables: about 450,000 on openb's 1,213 hosts, 150-230 ms. CPython runs one after 10
  middle collections once the survivors since the last are a quarter of the long-lived; the
  memo tables are rebuilt whenever a fleet's mix in use changes, so that quarter came every few
  seconds under load, and each full collection found almost nothing to free (475 objects in
  the 4 of a `fleet_scale.py` run, against 15,000 freed by the young and middle ones). Now at
  least `OLD` middle collections come between two full ones (the quarter rule still applies):
  3 million new containers (a `fleet_scale.py` run, 8,552 placements and the pure function's
  beside them, makes about 87 middle collections). Garbage cycles that outlive two collections
  wait that long; the process's peak memory in that run did not move (212-224 MB either way).

`python benchmarks/fleet_scale.py --no-two-workers --cold 0` (SQLite, one run each, the same
hour; benchmarks/README.md, "Fleet scale", fifteenth pass): with 32 submits in flight, p99
81.4 ms at (50,000, 1, 10) against 59.9 at (15,000, 1, 100); with 8 in flight, 35.3 against
20.8 ms; PostgreSQL with 32 in flight 93.5 against 57.8 ms. Placements a second did not drop
(1,515 against 1,598; 1,280 against 1,307 on PostgreSQL), and the collector's time in all fell
from 1.1 s a run to 0.7-0.9 s. Memory freed by reference counting, nearly all of it, is
freed as before; only garbage cycles wait longer.
"""

from __future__ import annotations

import gc

YOUNG = 15_000
"""New container objects between young collections (CPython's default: 700)."""
MIDDLE = 1
"""Young collections between middle collections, past which one runs (CPython's default: 10)."""
OLD = 100
"""Middle collections between full collections, past which one may run (CPython's default: 10)."""


def settle() -> None:
    """Apply the settings above to this process (idempotent)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG, MIDDLE, OLD)
