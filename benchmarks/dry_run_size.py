"""The size of a dry run's answer on a big fleet, as Temporal would carry it (the product's
pydantic converter): `gpuflow offers` for a job of six resource options that fits and for one
refused everywhere, and the plan of three such jobs (`gpuflow apply -f -f -f`), each through the
control worker's own activity on a sim fleet of N hosts of 8 A100 in a fresh SQLite database.
Temporal refuses a payload over 2 MiB.

    python benchmarks/dry_run_size.py [HOSTS]      # default 4,096, the most a fleet file has
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

from gpuflow.control.api import ApiActivities
from gpuflow.payloads import DATA_CONVERTER
from gpuflow.services.fleets import apply_fleet
from gpuflow.specs import FleetSpec, JobSpec
from gpuflow.store.db import Store
from gpuflow.workflows.api_dry_runs import OffersRequest, PlanRequest

FITS = JobSpec(
    name="fits",
    commands=["x"],
    resources={"gpu": "A100:1"},
    alternatives=[{"gpu": f"A100:{k}"} for k in (2, 4, 8, 3, 5)],
)
REFUSED = JobSpec(
    name="refused",
    commands=["x"],
    resources={"gpu": "H100:1"},
    alternatives=[{"gpu": f"A100:{k}"} for k in (9, 10, 12, 16, 32)],
)


def _size(value: Any) -> int:
    payload = DATA_CONVERTER.payload_converter.to_payloads([value])[0]
    return len(payload.SerializeToString())


async def _measure(api: ApiActivities) -> None:
    for job in (FITS, REFUSED):
        started = time.perf_counter()
        found = await api.offers(OffersRequest(spec=job))
        took = time.perf_counter() - started
        print(f"offers, {job.name}, 6 options: {_size(found):,} bytes ({took:.1f} s)")
    jobs = [FITS, REFUSED, FITS.model_copy(update={"name": "again"})]
    started = time.perf_counter()
    plans = await api.plan(PlanRequest(specs=jobs))
    took = time.perf_counter() - started
    print(f"plan of 3 jobs of 6 options: {_size(plans):,} bytes ({took:.1f} s)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("hosts", nargs="?", type=int, default=4096)
    args = parser.parse_args(argv)
    home = Path(tempfile.mkdtemp(prefix="gpuflow-dry-run-"))
    store = Store(f"sqlite:///{home / 'gpuflow.db'}").init()
    hosts = [
        {"name": f"node-{i:05d}", "gpus": [{"name": "A100", "memory": "80GB", "count": 8}]}
        for i in range(args.hosts)
    ]
    apply_fleet(store, FleetSpec.model_validate({"name": "f", "kind": "sim", "hosts": hosts}))
    api = ApiActivities(store, None, home=home)  # type: ignore[arg-type]
    asyncio.run(_measure(api))
    store.dispose()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
