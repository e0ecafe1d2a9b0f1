"""gpuflow's metrics as an operator sees them: a real Prometheus (Debian's `prometheus`
package) scrapes a control worker's endpoint on loopback while a job runs on a simulated
fleet, and the series come back through Prometheus's HTTP API."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]


def _prometheus() -> str:
    found = shutil.which("prometheus") or (
        "/usr/bin/prometheus" if os.access("/usr/bin/prometheus", os.X_OK) else None
    )
    if found is None:
        reason = "the prometheus server is not installed (apt-get install prometheus)"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    return found


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.read().decode()


async def _until(what: str, check: Any, timeout: float = 60) -> Any:
    """Poll `check()` (run in a thread) until it returns something truthy."""
    last: Any = None
    for _ in range(int(timeout * 2)):
        try:
            last = await asyncio.to_thread(check)
        except OSError as exc:
            last = exc
        else:
            if last:
                return last
        await asyncio.sleep(0.5)
    raise AssertionError(f"{what}: not seen in {timeout:.0f}s (last: {last!r})")


@pytest.fixture
def prometheus_scraping(tmp_path: Path) -> Iterator[tuple[int, str]]:
    """(the gpuflow metrics port it scrapes every second, Prometheus's URL)."""
    binary = _prometheus()
    target = _free_port()
    web = _free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        "  - job_name: gpuflow\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{target}']}}]\n"
    )
    log = (tmp_path / "prometheus.log").open("wb")
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{web}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    try:
        yield target, f"http://127.0.0.1:{web}"
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def _query(prometheus: str, expr: str) -> list[dict[str, Any]]:
    url = f"{prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    body = json.loads(_get(url))
    assert body["status"] == "success", body
    return list(body["data"]["result"])


def _value(prometheus: str, expr: str) -> float | None:
    result = _query(prometheus, expr)
    return float(result[0]["value"][1]) if result else None


DASHBOARD = Path(__file__).parents[2] / "infra" / "grafana" / "gpuflow.json"
# Grafana's variables, as the dashboard's defaults (All) and a short time range give them.
_VARIABLES = {"$fleet": ".*", "$host": ".*", "$__rate_interval": "1m", "$__range": "5m"}


def _dashboard_queries() -> list[tuple[str, list[str]]]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    queries = []
    for panel in panels:
        exprs = []
        for target in panel.get("targets", []):
            expr = target["expr"]
            for variable, value in _VARIABLES.items():
                expr = expr.replace(variable, value)
            assert "$" not in expr, f"{panel['title']}: unknown variable in {expr}"
            exprs.append(expr)
        if exprs:
            queries.append((panel["title"], exprs))
    return queries


async def _gpuflow(env: dict[str, str], *args: str) -> str:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gpuflow",
        *args,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode == 0, f"gpuflow {' '.join(args)}\n{out.decode()}"
    return out.decode()


async def test_prometheus_scrapes_a_job_on_a_sim_fleet(
    dev_env: WorkflowEnvironment, tmp_path: Path, prometheus_scraping: tuple[int, str]
) -> None:
    port, prometheus = prometheus_scraping
    fleet = f"m{uuid.uuid4().hex[:6]}"
    env = {
        **os.environ,
        "GPUFLOW_HOME": str(tmp_path / "home"),
        "GPUFLOW_DATABASE_URL": f"sqlite:///{tmp_path / 'gpuflow.db'}",
        "GPUFLOW_TEMPORAL_ADDRESS": dev_env.client.service_client.config.target_host,
        "GPUFLOW_METRICS_ADDRESS": f"127.0.0.1:{port}",
        "PYTHONPATH": os.pathsep.join(
            [str(Path(__file__).parents[2]), os.environ.get("PYTHONPATH", "")]
        ),
    }
    (tmp_path / "fleet.yaml").write_text(
        f"type: fleet\nname: {fleet}\nkind: sim\nutilization: {{source: constant, value: 73}}\n"
        "hosts:\n  - name: box\n    cpus: 4\n    gpus: [{name: A100, memory: 80GB, count: 2}]\n"
    )
    (tmp_path / "job.yaml").write_text(
        f"name: spin\nfleets: [{fleet}]\nresources: {{gpu: A100:1}}\ncommands: ['sleep 120']\n"
    )
    control_log = (tmp_path / "control.log").open("wb")
    control = subprocess.Popen(
        [sys.executable, "-m", "gpuflow.control.main"],
        env=env,
        stdout=control_log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    try:
        endpoint = f"http://127.0.0.1:{port}/metrics"
        await _until("gpuflow's endpoint", lambda: "gpuflow_store_up 1.0" in _get(endpoint))
        await _until("Prometheus ready", lambda: "Ready" in _get(f"{prometheus}/-/ready"))
        await _gpuflow(env, "fleet", "apply", "-f", str(tmp_path / "fleet.yaml"))
        text = await _gpuflow(env, "apply", "-y", "-d", "-f", str(tmp_path / "job.yaml"))
        job_id = text.split(" as ")[-1].split()[0]

        selector = f'{{fleet="{fleet}",model="A100"}}'
        assert (
            await _until(
                "one A100 allocated",
                lambda: _value(prometheus, f"gpuflow_gpus_allocated{selector}"),
            )
            == 1
        )
        assert _value(prometheus, f"gpuflow_gpus_free{selector}") == 1
        running = f'gpuflow_jobs{{fleet="{fleet}",status="running"}}'
        # placed (allocated) first, provisioning, then running
        assert await _until("the job running", lambda: _value(prometheus, running)) == 1
        assert _value(prometheus, 'sum(gpuflow_placement_seconds_count{outcome="placed"})')
        try:
            utilization = await _until(
                "the job's GPU sample",
                lambda: _query(prometheus, f'gpuflow_gpu_utilization_percent{{job_id="{job_id}"}}'),
            )
        except AssertionError:
            lines = [x for x in _get(endpoint).splitlines() if x.startswith("gpuflow_gpu_")]
            raise AssertionError(f"{job_id}: {lines}") from None
        assert utilization[0]["metric"]["source"] == "simulated"
        assert utilization[0]["metric"]["host"] == f"{fleet}/box"
        assert float(utilization[0]["value"][1]) == 73
        # the Temporal SDK's worker metrics come through the same endpoint
        assert _query(prometheus, 'temporal_worker_task_slots_available{task_queue="gpuflow"}')
        # every query of the Grafana dashboard is valid PromQL, and its fleet panels see the job
        queries = _dashboard_queries()
        for _, exprs in queries:
            for expr in exprs:
                await asyncio.to_thread(_query, prometheus, expr)  # asserts status success
        panels = dict(queries)
        assert _value(prometheus, panels["GPUs allocated"][0]) == 1
        assert _value(prometheus, panels["Jobs running"][0]) == 1

        await _gpuflow(env, "stop", "spin")
        assert await _until(
            "the A100 given back",
            lambda: _value(prometheus, f"gpuflow_gpus_allocated{selector}") == 0,
        )
        ended = f'gpuflow_jobs_ended_total{{fleet="{fleet}",reason="stopped_by_user"}}'
        assert await _until("the stopped job counted", lambda: _value(prometheus, ended)) == 1
        assert await _until(
            "the job's GPU series gone",
            lambda: not _query(prometheus, f'gpuflow_gpu_utilization_percent{{job_id="{job_id}"}}'),
        )
    finally:
        control.send_signal(signal.SIGTERM)
        try:
            control.wait(timeout=30)
        except subprocess.TimeoutExpired:
            control.kill()
            control.wait()
        control_log.close()


async def test_the_embedded_stack_serves_one_endpoint_for_all_its_parts(tmp_path: Path) -> None:
    """`gpuflow up`: the control worker and the local agent share one process and so one
    endpoint, which has the database's numbers and both workers' Temporal metrics."""
    port = _free_port()
    env = {
        **{
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("GPUFLOW_TEMPORAL_", "GPUFLOW_DATABASE_URL"))
        },
        "GPUFLOW_HOME": str(tmp_path / "home"),
        "GPUFLOW_TEMPORAL_PORT": str(_free_port()),
        "GPUFLOW_UI_PORT": str(_free_port()),
        "GPUFLOW_METRICS_ADDRESS": f"127.0.0.1:{port}",
        "PYTHONPATH": os.pathsep.join(
            [str(Path(__file__).parents[2]), os.environ.get("PYTHONPATH", "")]
        ),
    }
    log = (tmp_path / "up.log").open("wb")
    stack = subprocess.Popen(
        [sys.executable, "-m", "gpuflow", "up"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    try:
        endpoint = f"http://127.0.0.1:{port}/metrics"
        ready = tmp_path / "home" / "up.ready"
        await _until("gpuflow up ready", ready.exists, timeout=120)
        text = await _until(
            "both workers' Temporal metrics",
            lambda: body if 'task_queue="gpuflow-host-local/' in (body := _get(endpoint)) else None,
        )
        assert "temporal_worker_task_slots_available{" in text
        assert 'task_queue="gpuflow"' in text
        assert "gpuflow_store_up 1.0" in text
        assert 'gpuflow_hosts{fleet="local",state="ready"} 1.0' in text
    finally:
        stack.send_signal(signal.SIGTERM)
        try:
            stack.wait(timeout=60)
        except subprocess.TimeoutExpired:
            stack.kill()
            stack.wait()
        log.close()
