"""`gpuflow agent`: the host agent, with its options declared here so that `--help` lists them.
The agent itself (gpuflow/agent/main.py) reads the same options from its own command line."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

err = Console(stderr=True)


def agent(
    host_id: str | None = typer.Option(
        None, "--host-id", metavar="FLEET/HOST", help="The host this agent serves."
    ),
    temporal_address: str | None = typer.Option(
        None, "--temporal-address", metavar="HOST:PORT", help="Where Temporal listens."
    ),
    state_dir: Path | None = typer.Option(
        None, "--state-dir", help="Where the agent keeps job processes' state and logs."
    ),
    task_queue: str | None = typer.Option(
        None, "--task-queue", help="Task queue to poll (default: gpuflow-host-HOST_ID)."
    ),
    namespace: str = typer.Option("default", "--namespace", help="Temporal namespace."),
    secrets_file: Path | None = typer.Option(
        None, "--secrets-file", help="Secrets this host resolves (default: STATE_DIR/secrets.json)."
    ),
    tls: bool | None = typer.Option(
        None,
        "--tls/--no-tls",
        help="Use TLS (default: only when a --tls-* option or --api-key-file is given).",
    ),
    tls_ca: Path | None = typer.Option(
        None, "--tls-ca", metavar="PEM", help="CA of the server's certificate."
    ),
    tls_cert: Path | None = typer.Option(
        None, "--tls-cert", metavar="PEM", help="Client certificate (mTLS)."
    ),
    tls_key: Path | None = typer.Option(
        None, "--tls-key", metavar="PEM", help="Private key of --tls-cert."
    ),
    tls_server_name: str | None = typer.Option(
        None, "--tls-server-name", help="Name to check the server's certificate against."
    ),
    api_key_file: Path | None = typer.Option(
        None, "--api-key-file", metavar="FILE", help="File that holds the Temporal API key."
    ),
    api_key: str | None = typer.Option(None, "--api-key", hidden=True),
    facts: bool = typer.Option(
        False, "--facts", help="Print this machine's host facts as JSON and exit."
    ),
) -> None:
    """Run a host agent: a Temporal worker that starts, watches and stops job processes on
    this host and samples its GPUs. ssh fleets start their agents themselves."""
    from gpuflow.agent.main import main

    if api_key is not None:
        # Never echo the value: a command line shows in `ps` and in the agent's pidfile.
        _usage_error(
            "--api-key is not taken: command lines show in `ps`; write the key to a file "
            "only the agent's user reads and give --api-key-file"
        )
    if not facts and not (host_id and temporal_address and state_dir):
        _usage_error("--host-id, --temporal-address and --state-dir are required (or --facts)")
    argv = ["--facts"] if facts else []
    for flag, value in (
        ("--host-id", host_id),
        ("--temporal-address", temporal_address),
        ("--state-dir", state_dir),
        ("--task-queue", task_queue),
        ("--namespace", namespace),
        ("--secrets-file", secrets_file),
        ("--tls-ca", tls_ca),
        ("--tls-cert", tls_cert),
        ("--tls-key", tls_key),
        ("--tls-server-name", tls_server_name),
        ("--api-key-file", api_key_file),
    ):
        if value is not None:
            argv += [flag, str(value)]
    if tls is not None:
        argv.append("--tls" if tls else "--no-tls")
    raise typer.Exit(main(argv))


def _usage_error(message: str) -> None:
    err.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)
