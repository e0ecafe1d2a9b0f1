"""The control worker alone, for production: no dev server and no local agent.

    python -m gpuflow.control.main

Reads GPUFLOW_TEMPORAL_ADDRESS, GPUFLOW_TEMPORAL_NAMESPACE, GPUFLOW_DATABASE_URL,
GPUFLOW_HOME and GPUFLOW_METRICS_ADDRESS (default 127.0.0.1:9464; `off` to disable); runs
until SIGTERM or SIGINT. Several can run side by side on one cluster (one metrics address
each).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

from gpuflow.config import TemporalConfig, connect_temporal
from gpuflow.control import collector
from gpuflow.control.worker import ControlWorker
from gpuflow.errors import GpuflowError
from gpuflow.metrics import metrics_address, serve_metrics
from gpuflow.store.db import Store, gpuflow_home

log = logging.getLogger("gpuflow.control")


async def run_control() -> None:
    collector.settle()
    config = TemporalConfig.from_env()
    serve_metrics(metrics_address())  # before connecting: the client's runtime reports into it
    client = await connect_temporal(config)
    store = await asyncio.to_thread(lambda: Store().init())
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        async with ControlWorker(client, store, home=gpuflow_home()):
            log.info(
                "control worker polling at %s (namespace %s)", config.address, config.namespace
            )
            await stop.wait()
    finally:
        store.dispose()


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        asyncio.run(run_control())
    except GpuflowError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
