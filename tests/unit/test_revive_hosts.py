"""The control activity that starts the agents of silent ssh hosts again (`revive_hosts`,
gpuflow/control/revive.py), against the store: only ssh hosts of the fleet that are not in
maintenance are started; a host whose start fails is unreachable, with the reason."""

from __future__ import annotations

import pytest
from temporalio.testing import ActivityEnvironment

from gpuflow.control.activities import ControlActivities
from gpuflow.services.fleets import AGENT_STARTED, apply_fleet, get_host, set_host_state
from gpuflow.specs import FleetSpec
from gpuflow.status import HostState
from gpuflow.store.db import Store
from gpuflow.store.tables import HostRow
from gpuflow.workflows.models import FleetInput, HostFacts, ProvisionInput, ReviveInput

pytestmark = pytest.mark.asyncio(loop_scope="session")

FACTS = HostFacts(os="linux", arch="x86_64", cpus=4, memory_mib=8192, disk_mib=8192)
LOGIN_FAILED = "host f/down: unreachable: no SSH login within 10 s"


def _ssh_fleet(store: Store, name: str, hosts: list[str]) -> None:
    spec = FleetSpec.model_validate(
        {
            "name": name,
            "kind": "ssh",
            "hosts": [{"name": h, "hostname": "127.0.0.1", "port": 22} for h in hosts],
        }
    )
    apply_fleet(store, spec, dict.fromkeys(hosts, FACTS))


async def test_silent_ssh_hosts_are_started_and_one_that_fails_is_unreachable(
    sqlite_store: Store,
) -> None:
    store = sqlite_store
    _ssh_fleet(store, "f", ["up", "down", "drained"])
    _ssh_fleet(store, "g", ["elsewhere"])
    apply_fleet(
        store, FleetSpec.model_validate({"name": "s", "kind": "sim", "hosts": [{"name": "h1"}]})
    )
    set_host_state(store, "f/up", HostState.UNREACHABLE, LOGIN_FAILED)  # an earlier try
    set_host_state(store, "f/drained", HostState.MAINTENANCE, "draining")
    started: list[str] = []

    async def ensure_agent(host: HostRow) -> str | None:
        started.append(host.id)
        return LOGIN_FAILED if host.id == "f/down" else None

    control = ControlActivities(store, ensure_agent=ensure_agent)
    result = await ActivityEnvironment().run(
        control.revive_hosts,
        ReviveInput(fleet="f", host_ids=["f/up", "f/down", "f/drained", "g/elsewhere", "s/h1"]),
    )

    assert started == ["f/up", "f/down"]
    assert result.revived == ["f/up"] and result.unreachable == ["f/down"]
    down, up, drained = (get_host(store, hid) for hid in ("f/down", "f/up", "f/drained"))
    assert down is not None and (down.state, down.state_detail) == ("unreachable", LOGIN_FAILED)
    # reachable again, but only an answer to a ping makes the host ready
    assert up is not None and (up.state, up.state_detail) == ("not_ready", AGENT_STARTED)
    assert drained is not None and drained.state == HostState.MAINTENANCE

    hosts = await ActivityEnvironment().run(control.fleet_hosts, FleetInput(fleet="f"))
    assert {h.host_id: h.ssh for h in hosts.hosts} == {"f/up": True, "f/down": True}
    sim = await ActivityEnvironment().run(control.fleet_hosts, FleetInput(fleet="s"))
    assert [h.ssh for h in sim.hosts] == [False]


async def test_a_failed_provisioning_leaves_a_draining_host_in_maintenance(
    sqlite_store: Store,
) -> None:
    """Marking a host unreachable must not take it out of maintenance (it may be draining):
    provisioning and the health round share `mark_unreachable`."""
    store = sqlite_store
    _ssh_fleet(store, "f", ["down"])
    set_host_state(store, "f/down", HostState.MAINTENANCE, "draining")

    async def ensure_agent(host: HostRow) -> str | None:
        return LOGIN_FAILED

    control = ControlActivities(store, ensure_agent=ensure_agent)
    result = await ActivityEnvironment().run(
        control.provision_host, ProvisionInput(job_id="job-a", host_id="f/down")
    )
    assert not result.ready and result.message == LOGIN_FAILED
    host = get_host(store, "f/down")
    assert host is not None and host.state == HostState.MAINTENANCE
