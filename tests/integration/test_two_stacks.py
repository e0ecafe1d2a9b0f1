"""Two embedded stacks on one machine, each with its own GPUFLOW_HOME and ports on loopback.
A command run with the second's home and no port variable reached Temporal on 7233 (the
default stack's): `fleet list` listed that stack's fleets, and `down` stopped its running job,
held its admission, then stopped the second stack. The home now names its stack."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuflow.client import Client
from gpuflow.config import TEMPORAL_VARIABLES, TemporalConfig
from tests.integration.stack_cli import free_port

pytestmark = pytest.mark.integration

JOB = "name: {name}\ncommands: [sleep 120]\n"


class Stack:
    """A `gpuflow up -d` in a home of its own, and `gpuflow` run as a user of that home."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.port = free_port()

    def env(self, *, port: bool) -> dict[str, str]:
        """The user's environment: GPUFLOW_HOME, and GPUFLOW_TEMPORAL_PORT when `port`."""
        env = {k: v for k, v in os.environ.items() if k not in TEMPORAL_VARIABLES}
        env |= {"GPUFLOW_HOME": str(self.home), "COLUMNS": "200"}
        env |= {"GPUFLOW_METRICS_ADDRESS": "off", "GPUFLOW_UI_PORT": str(free_port())}
        if port:
            env["GPUFLOW_TEMPORAL_PORT"] = str(self.port)
        return env

    def gpuflow(self, *args: str, port: bool = False, code: int = 0) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "gpuflow", *args],
            capture_output=True,
            text=True,
            timeout=180,
            env=self.env(port=port),
        )
        said = done.stdout + done.stderr
        assert done.returncode == code, f"gpuflow {' '.join(args)} -> {done.returncode}\n{said}"
        return said

    def jobs(self, *, port: bool = False) -> dict[str, str]:
        """Name -> status of the jobs `ps -a --json` lists (GPUFLOW_TEMPORAL_PORT if `port`)."""
        said = self.gpuflow("ps", "-a", "--json", port=port)
        return {job["name"]: job["status"] for job in json.loads(said)}

    def submit(self, name: str) -> None:
        """Submit a job with the port named, and wait until it runs."""
        path = self.home.parent / f"{name}.yaml"
        path.write_text(JOB.format(name=name))
        self.gpuflow("apply", "-d", "-y", "-f", str(path), port=True)
        for _ in range(60):
            if self.jobs(port=True).get(name) == "running":
                return
            time.sleep(0.5)
        raise AssertionError(f"{name} did not start: {self.jobs(port=True)}")


@pytest.fixture
def stacks(tmp_path: Path) -> Iterator[tuple[Stack, Stack]]:
    first, second = Stack(tmp_path / "first"), Stack(tmp_path / "second")
    try:
        for stack in (first, second):
            assert "gpuflow is up" in stack.gpuflow("up", "-d", port=True)
        yield first, second
    finally:  # their own ports, named: nothing else is touched
        for stack in (first, second):
            subprocess.run(
                [sys.executable, "-m", "gpuflow", "down", "-y"],
                env=stack.env(port=True),
                capture_output=True,
                timeout=180,
            )


async def test_the_home_names_the_stack_its_commands_reach(
    stacks: tuple[Stack, Stack], monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = stacks
    first.submit("on-first")
    second.submit("on-second")
    # read-only first: an address followed wrongly shows here, before anything is stopped
    assert first.jobs() == {"on-first": "running"}
    assert second.jobs() == {"on-second": "running"}

    for name in TEMPORAL_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GPUFLOW_HOME", str(second.home))
    assert TemporalConfig.from_env().address == f"127.0.0.1:{second.port}"
    client = await Client.connect()
    try:
        assert [job.name for job in await client.jobs()] == ["on-second"]
    finally:
        await client.close()

    said = second.gpuflow("down", "-y")
    assert "on-second: stopped (stopped_by_user)" in said
    assert "on-first" not in said
    assert said.rstrip().endswith("gpuflow is down")
    assert not (second.home / "up.ready").exists()

    assert first.jobs() == {"on-first": "running"}
    client = await Client.connect(config=TemporalConfig(address=f"127.0.0.1:{first.port}"))
    try:
        assert not await client.admission_held()
    finally:
        await client.close()
