"""SSH hosts: read their facts when a fleet is applied, and make sure their agent runs before a
job starts there (asyncssh, through gpuflow.activities.provisioning)."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

from gpuflow import secrets
from gpuflow.activities.provisioning import (
    ProvisioningError,
    SshTarget,
    ensure_ssh_agent,
    push_ssh_file,
    ssh_host_facts,
    ssh_target_for,
)
from gpuflow.config import TemporalConfig
from gpuflow.errors import GpuflowError
from gpuflow.naming import host_id, host_task_queue
from gpuflow.specs.fleet import FleetSpec
from gpuflow.worker.facts import HostFacts

REMOTE_STATE_DIR = "~/.gpuflow/agent"


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


async def ensure_host_agent(host: Any, *, home: Path, client: Any) -> str | None:
    """Start the host's agent if it does not run; an error message, or None when it runs."""
    ssh = dict(host.ssh)
    state_dir = ssh.pop("state_dir", None) or REMOTE_STATE_DIR
    target = SshTarget(host_id=host.id, **{k: v for k, v in ssh.items() if v is not None})
    config = TemporalConfig.from_env()
    address = os.environ.get("GPUFLOW_AGENT_TEMPORAL_ADDRESS", config.address)
    agent_dir = f"{state_dir}/{host.id.replace('/', '_')}"
    try:
        values = secrets.load()
        if values:
            await push_ssh_file(
                target,
                remote_path=f"{agent_dir}/secrets.json",
                content=json.dumps(values).encode(),
            )
        await ensure_ssh_agent(
            target,
            temporal_address=address,
            namespace=config.namespace,
            task_queue=host_task_queue(host.id),
            state_dir=agent_dir,
        )
    except ProvisioningError as exc:
        return str(exc)
    return None
