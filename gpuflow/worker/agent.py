"""The host agent: a Temporal worker on the host's own task queue.

python -m gpuflow.worker.agent --host-id FLEET/HOST --temporal-address ADDR --state-dir DIR
python -m gpuflow.worker.agent --facts      # print this machine's HostFacts as JSON
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path

from temporalio.client import Client
from temporalio.worker import Worker

from gpuflow.activities.host import HostAgent
from gpuflow.config import TemporalConfig, connect_temporal
from gpuflow.errors import GpuflowError
from gpuflow.naming import host_task_queue
from gpuflow.worker.facts import collect_host_facts
from gpuflow.worker.samplers import NvmlGpuSampler, sampler_for_host

log = logging.getLogger("gpuflow.agent")


def agent_state_dir(home: Path, host_id: str) -> Path:
    return home / "agents" / host_id.replace("/", "_")


def make_agent_worker(client: Client, agent: HostAgent, task_queue: str) -> Worker:
    return Worker(
        client,
        task_queue=task_queue,
        activities=agent.activities(),
        max_concurrent_activities=64,
    )


async def run_agent(
    *,
    host_id: str,
    task_queue: str,
    config: TemporalConfig,
    state_dir: Path,
    simulated: dict[str, object] | None = None,
    secrets_path: Path | None = None,
) -> None:
    client = await connect_temporal(config)
    sampler = sampler_for_host(simulated) if simulated is not None else NvmlGpuSampler()
    agent = HostAgent(
        host_id=host_id,
        state_dir=state_dir,
        sampler=sampler,
        secrets_path=secrets_path or state_dir / "secrets.json",
    )
    worker = make_agent_worker(client, agent, task_queue)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    log.info("agent for %s polling %s at %s", host_id, task_queue, config.address)
    async with worker:
        await stop.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpuflow-agent", description=__doc__)
    parser.add_argument("--facts", action="store_true", help="print HostFacts as JSON and exit")
    parser.add_argument("--host-id")
    parser.add_argument("--task-queue")
    parser.add_argument("--temporal-address")
    parser.add_argument("--namespace", default="default")
    parser.add_argument("--state-dir")
    parser.add_argument(
        "--secrets-file", help="secrets this host resolves (default: STATE_DIR/secrets.json)"
    )
    args = parser.parse_args(argv)
    if args.facts:
        print(collect_host_facts().model_dump_json())
        return 0
    if not (args.host_id and args.temporal_address and args.state_dir):
        parser.error("--host-id, --temporal-address and --state-dir are required")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    config = TemporalConfig(address=args.temporal_address, namespace=args.namespace, embedded=False)
    try:
        asyncio.run(
            run_agent(
                host_id=args.host_id,
                task_queue=args.task_queue or host_task_queue(args.host_id),
                config=config,
                state_dir=Path(args.state_dir),
                secrets_path=Path(args.secrets_file) if args.secrets_file else None,
            )
        )
    except GpuflowError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
