"""SSH hosts: read their facts when a fleet is applied, and make sure their agent runs before a
job starts there (asyncssh, through gpuflow.ssh.provisioning)."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpuflow import secrets
from gpuflow.config import TemporalConfig
from gpuflow.errors import GpuflowError
from gpuflow.naming import host_id, host_task_queue
from gpuflow.specs.fleet import FleetSpec
from gpuflow.ssh.provisioning import (
    ProvisioningError,
    ensure_ssh_agent,
    push_ssh_files,
    ssh_host_facts,
    ssh_target,
    ssh_target_for,
)
from gpuflow.workflows.models import HostFacts

REMOTE_STATE_DIR = "~/.gpuflow/agent"

# Where the agent's copies of the control worker's Temporal files go, inside its directory.
_REMOTE_TEMPORAL_FILES = {
    "tls_ca": "temporal/ca.pem",
    "tls_cert": "temporal/client.pem",
    "tls_key": "temporal/client.key",
    "api_key_file": "temporal/api-key",
}


async def collect_ssh_facts(spec: FleetSpec) -> dict[str, HostFacts]:
    """Facts of every host of an ssh fleet, read in parallel; any failure stops the apply with
    every failing host named, before anything is written."""
    targets = [ssh_target_for(decl, host_id=host_id(spec.name, decl.name)) for decl in spec.hosts]
    results = await asyncio.gather(*(ssh_host_facts(t) for t in targets), return_exceptions=True)
    facts: dict[str, HostFacts] = {}
    errors: list[str] = []
    for decl, result in zip(spec.hosts, results, strict=True):
        if isinstance(result, ProvisioningError):
            errors.append(str(result))
        elif isinstance(result, BaseException):
            raise result
        else:
            facts[decl.name] = result
    if errors:
        raise GpuflowError("; ".join(errors))
    return facts


def agent_temporal_files(config: TemporalConfig) -> dict[str, bytes]:
    """What an agent needs on its host to reach Temporal the way the control worker does, by
    the `ensure_ssh_agent` argument that names it: the contents of the CA, client certificate
    and key, and the API key (from GPUFLOW_TEMPORAL_API_KEY or its file); those that are set.
    A file that cannot be read is a GpuflowError naming the variable and the path only."""
    if config.embedded:
        return {}
    files: dict[str, bytes] = {}
    for name in ("tls_ca", "tls_cert", "tls_key"):
        content = config.read_file(name)
        if content is not None:
            files[name] = content
    key = config.read_api_key()
    if key is not None:
        files["api_key_file"] = key.encode()
    return files


def agent_tls_server_name(config: TemporalConfig) -> str | None:
    """The name the agent checks the frontend's certificate against: the control worker's,
    unless GPUFLOW_AGENT_TEMPORAL_TLS_SERVER_NAME says otherwise (agents that dial another
    address, such as an IP, through GPUFLOW_AGENT_TEMPORAL_ADDRESS)."""
    override = os.environ.get("GPUFLOW_AGENT_TEMPORAL_TLS_SERVER_NAME", "").strip() or None
    if override is not None and not config.uses_tls:
        raise GpuflowError(
            "GPUFLOW_AGENT_TEMPORAL_TLS_SERVER_NAME is set but the control worker reaches "
            "Temporal without TLS, and agents connect the same way; unset it or configure "
            "GPUFLOW_TEMPORAL_TLS*"
        )
    return override or config.tls_server_name


async def ensure_host_agent(
    host_id: str, settings: Mapping[str, Any], *, secrets_path: Path | None = None
) -> str | None:
    """Start the host's agent if it does not run; an error message, or None when it runs.
    `secrets_path`: the control plane's secrets file (what `gpuflow secret set` wrote through
    the API), pushed to the host for its jobs; None is GPUFLOW_HOME's.

    The agent connects to Temporal as the control worker does: its TLS files and API key are
    copied into the agent's directory over SSH (mode 0600) and named on its command line by
    path; their contents never go through Temporal, a command line or a message."""
    state_dir = settings.get("state_dir") or REMOTE_STATE_DIR
    target = ssh_target(host_id, settings)
    agent_dir = f"{state_dir}/{host_id.replace('/', '_')}"
    try:
        config = TemporalConfig.from_env()
        address = os.environ.get("GPUFLOW_AGENT_TEMPORAL_ADDRESS", config.address)
        server_name = agent_tls_server_name(config)
        temporal_files = agent_temporal_files(config)
    except GpuflowError as exc:
        return f"host {host_id}: the agent's Temporal connection: {exc}"
    remote_paths = {name: f"{agent_dir}/{_REMOTE_TEMPORAL_FILES[name]}" for name in temporal_files}
    files = {remote_paths[name]: content for name, content in temporal_files.items()}
    try:
        values = secrets.load(secrets_path or secrets.secrets_file())
        if values:
            files[f"{agent_dir}/secrets.json"] = json.dumps(values).encode()
        await push_ssh_files(target, files=files, mode=0o600)
        await ensure_ssh_agent(
            target,
            temporal_address=address,
            namespace=config.namespace,
            task_queue=host_task_queue(host_id),
            state_dir=agent_dir,
            tls=config.tls,
            tls_ca=remote_paths.get("tls_ca"),
            tls_cert=remote_paths.get("tls_cert"),
            tls_key=remote_paths.get("tls_key"),
            tls_server_name=server_name,
            api_key_file=remote_paths.get("api_key_file"),
        )
    except ProvisioningError as exc:
        return str(exc)
    return None
