"""Applying a fleet file: what its hosts report, by kind. The one place where local, sim and
ssh fleets differ in how their hosts become known (the rows they make are
gpuflow.services.fleets's)."""

from __future__ import annotations

import asyncio

from gpuflow.specs.fleet import FleetSpec
from gpuflow.workflows.models import HostFacts


async def host_facts(spec: FleetSpec) -> dict[str, HostFacts]:
    """Facts of the fleet's hosts by host name: asked over SSH for an ssh fleet, collected on
    this machine for the local fleet, none for a sim fleet (its file declares its hosts)."""
    if spec.kind == "ssh":
        from gpuflow.ssh.agents import collect_ssh_facts

        return await collect_ssh_facts(spec)
    if spec.kind == "local":
        from gpuflow.agent.facts import collect_host_facts
        from gpuflow.services.fleets import local_host_name

        return {local_host_name(): await asyncio.to_thread(collect_host_facts)}
    return {}
