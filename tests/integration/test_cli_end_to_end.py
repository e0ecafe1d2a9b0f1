"""The `gpuflow` command against a real dev server, as a user runs it (subprocesses)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from pathlib import Path

import pytest
from temporalio.testing import WorkflowEnvironment

from gpuflow.client import Client
from gpuflow.store.db import Store
from gpuflow.worker.control import ControlWorker

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]


async def _gpuflow(env: dict[str, str], *args: str, ok: bool = True) -> str:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gpuflow", *args, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )
    try:
        out, _ = await asyncio.wait_for(process.communicate(), 120)
    except TimeoutError:
        process.kill()
        raise AssertionError(f"gpuflow {' '.join(args)} did not finish in 120 s") from None
    text = out.decode()
    command = " ".join(args)
    assert (process.returncode == 0) == ok, f"gpuflow {command} -> {process.returncode}\n{text}"
    return text


async def test_cli_round_trip(dev_env: WorkflowEnvironment, tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'gpuflow.db'}").init()
    env = {**os.environ, "GPUFLOW_HOME": str(tmp_path / "home"),
           "GPUFLOW_DATABASE_URL": store.url,
           "GPUFLOW_TEMPORAL_ADDRESS": dev_env.client.service_client.config.target_host,
           "COLUMNS": "200"}
    fleet = f"f{uuid.uuid4().hex[:6]}"
    (tmp_path / "fleet.yaml").write_text(
        f"type: fleet\nname: {fleet}\nkind: sim\nhosts:\n"
        "  - name: box\n    cpus: 8\n    blocks: 2\n"
        "    gpus: [{name: A100, memory: 80GB, count: 2}]\n"
        "  - name: mac\n    os: macos\n    arch: arm64\n"
        "    gpus: [{name: M2ULTRA, memory: 192GB, vendor: apple}]\n")
    (tmp_path / "busy.yaml").write_text(
        f"name: spin\nfleets: [{fleet}]\nresources: {{gpu: A100:1}}\ncommands:\n"
        "  - echo started\n  - \"timeout 120 bash -c 'while :; do :; done' || true\"\n"
        "utilization_policy: {min_gpu_utilization: 5, time_window: 1m}\n")
    (tmp_path / "big.yaml").write_text(
        f"name: big\nfleets: [{fleet}]\nresources: {{gpu: A100:4}}\ncommands: ['true']\n")
    async with ControlWorker(dev_env.client, store, home=tmp_path / "home"):
        await _gpuflow(env, "fleet", "apply", "-f", str(tmp_path / "fleet.yaml"))
        fleets = json.loads(await _gpuflow(env, "fleet", "list", "--json"))
        hosts = {h["name"]: h for f in fleets if f["name"] == fleet for h in f["hosts"]}
        assert hosts["box"]["blocks"] == 2 and hosts["box"]["blocks_busy"] == 0
        assert hosts["mac"]["simulated"] is True

        offers = json.loads(await _gpuflow(env, "offers", "-f", str(tmp_path / "big.yaml"),
                                           "--json"))
        assert offers["fits"] == []
        reasons = [f"{r['host']}: {r['reason']}" for r in offers["rejections"]]
        assert any(r.startswith("box: ") for r in reasons)
        assert any(r.startswith("mac: ") for r in reasons)

        (tmp_path / "either.yaml").write_text(
            (tmp_path / "big.yaml").read_text() + "alternatives: [{gpu: A100:1}]\n")
        either = json.loads(await _gpuflow(env, "offers", "-f", str(tmp_path / "either.yaml"),
                                           "--json"))
        assert [(o["option"], o["gpu"]) for o in either["options"]] == [(1, "A100:4"),
                                                                          (2, "A100:1")]
        assert either["options"][0]["offers"]["fits"] == []
        assert [f["host"] for f in either["options"][1]["offers"]["fits"]] == ["box"]
        plan = await _gpuflow(env, "offers", "-f", str(tmp_path / "either.yaml"))
        assert "option 2" in plan and "box" in plan

        text = await _gpuflow(env, "apply", "-y", "-d", "-f", str(tmp_path / "busy.yaml"))
        assert "submitted spin" in text
        job_id = text.split(" as ")[-1].split()[0]
        client = Client(temporal=dev_env.client, store=store)
        for _ in range(100):
            if (await client.get(job_id)).status != "pending":
                break
            await asyncio.sleep(0.2)
        jobs = json.loads(await _gpuflow(env, "ps", "-a", "--json"))
        assert jobs[0]["id"] == job_id
        assert jobs[0]["status"] == "running", jobs[0]["message"]
        fleets = json.loads(await _gpuflow(env, "fleet", "list", "--json"))
        box = next(h for f in fleets if f["name"] == fleet for h in f["hosts"]
                   if h["name"] == "box")
        assert box["blocks_busy"] == 1

        assert "started" in await _gpuflow(env, "logs", "spin")
        metrics: dict[str, object] = {}
        for _ in range(100):
            if (await client.metrics(job_id)).gpus:
                break
            await asyncio.sleep(0.3)
        metrics = json.loads(await _gpuflow(env, "metrics", "spin", "--json"))
        windows = list(metrics["gpus"].values())  # type: ignore[union-attr]
        assert windows and windows[0]["simulated"] is True
        assert "simulated" in await _gpuflow(env, "metrics", "spin")

        text = await _gpuflow(env, "stop", "spin")
        assert "stopped" in text
        everything = json.loads(await _gpuflow(env, "ps", "-a", "--json"))
        assert next(j for j in everything if j["id"] == job_id)["status"] == "stopped"
        text = await _gpuflow(env, "stop", "no-such-job", ok=False)
        assert "error: no job named 'no-such-job'" in text
    store.dispose()
