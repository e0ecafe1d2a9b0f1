"""The host agent: a Temporal worker on the host's own task queue.

python -m gpuflow.agent.main --host-id FLEET/HOST --temporal-address ADDR --state-dir DIR
    [--tls] [--tls-ca PEM] [--tls-cert PEM --tls-key PEM] [--tls-server-name NAME]
    [--api-key-file FILE]
python -m gpuflow.agent.main --facts      # print this machine's HostFacts as JSON

Metrics (GPU samples, Temporal worker metrics) at GPUFLOW_METRICS_ADDRESS (default
127.0.0.1:9464; `off` to disable).

There is no flag for the API key itself: a command line is visible to every user of the host
(`ps`) and is kept in the agent's pidfile. Give it as a file.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import re
import signal
import sys
from pathlib import Path

from temporalio.client import Client
from temporalio.worker import PollerBehaviorSimpleMaximum, Worker

from gpuflow.agent.activities import HostAgent
from gpuflow.agent.facts import collect_host_facts
from gpuflow.agent.samplers import NvmlGpuSampler, sampler_for_host
from gpuflow.config import TemporalConfig, cluster_address, connect_temporal
from gpuflow.errors import GpuflowError, SpecError
from gpuflow.metrics import MeteredSampler, metrics_address, serve_metrics
from gpuflow.naming import host_task_queue
from gpuflow.utilization import READING_INTERVAL_S

log = logging.getLogger("gpuflow.agent")

METRICS_READING_S = READING_INTERVAL_S
"""How often a running job's GPUs are read while its probe waits (a probe answers once a tick,
up to minutes), for the metrics and the probe's answer: Prometheus's usual scrape interval."""


def agent_state_dir(home: Path, host_id: str) -> Path:
    return home / "agents" / host_id.replace("/", "_")


AGENT_POLLS = 5
"""Long polls an agent keeps open on its host's task queue: Temporal's default. Each counts
against the namespace's limit (`frontend.namespaceCount`, 1,200 by default): a fleet of N
real hosts needs it above 5N (infra/README.md)."""
SIMULATED_AGENT_POLLS = 1
"""Long polls the agent of a simulated host keeps open. A sim fleet's agents all live in the
control worker's process and poll one server: at 5 each, 240 sim hosts would reach the limit,
and at openb's 1,213 a quarter of them could not poll and were marked not ready. One poll
takes a host's few activities a second."""


def make_agent_worker(
    client: Client, agent: HostAgent, task_queue: str, *, polls: int = AGENT_POLLS
) -> Worker:
    """The agent's worker, keeping `polls` long polls open. Every agent goes through here, so
    here its GPU samples start feeding this process's metrics."""
    if not isinstance(agent.sampler, MeteredSampler):
        agent.sampler = MeteredSampler(agent.sampler, host_id=agent.host_id)
        agent.sample_every_s = METRICS_READING_S
    return Worker(
        client,
        task_queue=task_queue,
        activities=agent.activities(),
        max_concurrent_activities=64,
        activity_task_poller_behavior=PollerBehaviorSimpleMaximum(maximum=polls),
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
    serve_metrics(metrics_address())  # before connecting: the client's runtime reports into it
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
    via = " over TLS" if config.uses_tls else ""
    log.info("agent for %s polling %s at %s%s", host_id, task_queue, config.address, via)
    async with worker:
        await stop.wait()


# TemporalConfig speaks of the variables the CLI and the control worker read; the agent's user
# wrote flags, so its errors name those instead.
_FLAG_WORDING = (
    ("the GPUFLOW_TEMPORAL_TLS_* variables", "the --tls* flags"),
    ("GPUFLOW_TEMPORAL_TLS=true", "--tls"),
    ("GPUFLOW_TEMPORAL_TLS is false", "--no-tls is given"),
)
_VARIABLE = re.compile(
    r"GPUFLOW_TEMPORAL_(ADDRESS|NAMESPACE|TLS_CERT|TLS_KEY|TLS_CA|TLS_SERVER_NAME|API_KEY_FILE)\b"
)
_VARIABLE_FLAGS = {"ADDRESS": "--temporal-address", "NAMESPACE": "--namespace"}


def _in_flags(message: str) -> str:
    """A config or connection error reworded with the agent's flags for the variables."""
    for variable_words, flag_words in _FLAG_WORDING:
        message = message.replace(variable_words, flag_words)

    def flag(match: re.Match[str]) -> str:
        name = match.group(1)
        return _VARIABLE_FLAGS.get(name, "--" + name.lower().replace("_", "-"))

    return _VARIABLE.sub(flag, message)


def _path(value: str) -> Path:
    return Path(value).expanduser()


class _RefuseApiKey(argparse.Action):
    """`--api-key VALUE` is refused without echoing VALUE, which argparse would otherwise print
    as an unrecognized argument into the agent's log."""

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        parser.error(
            "--api-key is not taken: command lines show in `ps` and in the agent's pidfile; "
            "write the key to a file only the agent's user reads and give --api-key-file"
        )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    # no abbreviations: `--api-key KEY` must not pass for `--api-key-file KEY`
    parser = argparse.ArgumentParser(prog="gpuflow-agent", description=__doc__, allow_abbrev=False)
    parser.add_argument("--facts", action="store_true", help="print HostFacts as JSON and exit")
    parser.add_argument("--host-id")
    parser.add_argument("--task-queue")
    parser.add_argument("--temporal-address")
    parser.add_argument("--namespace", default="default")
    parser.add_argument("--state-dir")
    parser.add_argument(
        "--secrets-file", help="secrets this host resolves (default: STATE_DIR/secrets.json)"
    )
    tls = parser.add_argument_group("Temporal over TLS (files are read when connecting)")
    tls.add_argument(
        "--tls",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="use TLS (default: only when one of the options below is given)",
    )
    tls.add_argument("--tls-ca", type=_path, metavar="PEM", help="CA of the server's certificate")
    tls.add_argument("--tls-cert", type=_path, metavar="PEM", help="client certificate (mTLS)")
    tls.add_argument("--tls-key", type=_path, metavar="PEM", help="private key of --tls-cert")
    tls.add_argument(
        "--tls-server-name", metavar="NAME", help="name to check the server's certificate against"
    )
    tls.add_argument(
        "--api-key-file", type=_path, metavar="FILE", help="file that holds the API key"
    )
    tls.add_argument("--api-key", nargs="?", action=_RefuseApiKey, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not args.facts and not (args.host_id and args.temporal_address and args.state_dir):
        parser.error("--host-id, --temporal-address and --state-dir are required")
    return args


def temporal_config(args: argparse.Namespace) -> TemporalConfig:
    """How the agent reaches Temporal, from its flags; a contradiction is a SpecError in the
    words of the flags."""
    try:
        return TemporalConfig(
            address=cluster_address(args.temporal_address),
            namespace=args.namespace,
            embedded=False,
            tls=args.tls,
            tls_ca=args.tls_ca,
            tls_cert=args.tls_cert,
            tls_key=args.tls_key,
            tls_server_name=args.tls_server_name or None,
            api_key_file=args.api_key_file,
        )
    except SpecError as exc:
        raise SpecError(_in_flags(str(exc))) from None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.facts:
        print(collect_host_facts().model_dump_json())
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        config = temporal_config(args)
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
        print(f"error: {_in_flags(str(exc))}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
