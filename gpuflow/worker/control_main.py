"""The control worker alone, for production: no dev server and no local agent.

    python -m gpuflow.worker.control_main

Reads GPUFLOW_TEMPORAL_ADDRESS, GPUFLOW_TEMPORAL_NAMESPACE, GPUFLOW_DATABASE_URL and
GPUFLOW_HOME; runs until SIGTERM or SIGINT. Several can run side by side on one cluster.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

from gpuflow.config import TemporalConfig, connect_temporal
from gpuflow.errors import GpuflowError
from gpuflow.store.db import Store, gpuflow_home
from gpuflow.worker.control import ControlWorker

log = logging.getLogger("gpuflow.control")


async def run_control() -> None:
    config = TemporalConfig.from_env()
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
