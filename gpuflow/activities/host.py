"""Host agent activities: start, probe and stop job processes, sample GPUs, read logs.

They run on the host's own task queue. Processes are started in their own session with an exit
code file written by a wrapper, and their pid and start time are kept on disk, so an agent that
restarts still knows which processes are its own and how they ended.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import signal
import subprocess
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from temporalio import activity
from temporalio.exceptions import ApplicationError

from gpuflow import secrets
from gpuflow.utilization import GpuSample
from gpuflow.workflows.models import (
    LogChunk,
    LogsInput,
    ProbeInput,
    ProbeResult,
    ProcessHandle,
    StartProcessInput,
    StopProcessInput,
    StopProcessResult,
)


class GpuSampler(Protocol):
    def sample(
        self, job_key: str, root_pid: int, indices: list[int], now: float
    ) -> list[GpuSample]: ...

    def forget(self, job_key: str) -> None: ...


def _proc_start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot; None if it is gone or a zombie."""
    stat = _proc_stat(pid)
    return None if stat is None else int(stat[19])


def _proc_stat(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name (state first); None if gone or a
    zombie."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2 :].split()
    return None if fields[0] in ("Z", "X") else fields


PROBE_WAIT_MAX_S = 5.0
"""Longest a probe waits for an exit: well inside the probe's timeout, no heartbeat needed."""

_PRIVATE_ENV = ("GPUFLOW_TEMPORAL_API_KEY", "GPUFLOW_DATABASE_URL")
"""The agent's own credentials: never handed to the jobs it starts."""


def _utc(timestamp: float | None) -> datetime | None:
    return None if timestamp is None else datetime.fromtimestamp(timestamp, UTC)


def _inherited_env() -> dict[str, str]:
    """What a job inherits from the agent's environment."""
    return {k: v for k, v in os.environ.items() if k not in _PRIVATE_ENV}


def _group_alive(pgid: int) -> bool:
    """Whether any live process is still in the job's process group (the wrapper started it as
    a session and group leader, so children that ignore SIGTERM are found here too)."""
    if _proc_stat(pgid) is not None:
        return True
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False  # no process at all in the group: no need to look through /proc
    except PermissionError:
        pass
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            stat = _proc_stat(int(entry.name))
            if stat is not None and int(stat[2]) == pgid:
                return True
    return False


@dataclass
class _Paths:
    root: Path

    @property
    def script(self) -> Path:
        return self.root / "job.sh"

    @property
    def log(self) -> Path:
        return self.root / "output.log"

    @property
    def state(self) -> Path:
        return self.root / "process.json"

    @property
    def exit_code(self) -> Path:
        return self.root / "exit_code"

    @property
    def stopped(self) -> Path:
        return self.root / "stopped"


class HostAgent:
    """The activities of one host. `state_dir` survives agent restarts."""

    def __init__(
        self,
        *,
        host_id: str,
        state_dir: Path,
        sampler: GpuSampler,
        secrets_path: Path | None = None,
    ) -> None:
        self.host_id = host_id
        self.secrets_path = secrets_path
        """Where this host's secrets live; None is GPUFLOW_HOME/secrets.json."""
        self.state_dir = Path(state_dir)
        self.sampler = sampler
        self._children: dict[str, subprocess.Popen[bytes]] = {}
        self._lock = asyncio.Lock()

    def _paths(self, job_id: str, attempt: int, rank: int) -> _Paths:
        return _Paths(self.state_dir / "jobs" / job_id / f"{attempt}-{rank}")

    def _reap(self) -> None:
        for key, child in list(self._children.items()):
            if child.poll() is not None:
                del self._children[key]

    def _group(self, paths: _Paths) -> int | None:
        """The job's process group id while any of its processes lives, else None."""
        try:
            state = json.loads(paths.state.read_text())
        except (OSError, ValueError):
            return None
        self._reap()
        pgid = int(state["pid"])
        leader_start = _proc_start_time(pgid)
        if leader_start is not None and leader_start != state.get("start_time"):
            return None  # the pid now belongs to an unrelated process
        return pgid if _group_alive(pgid) else None

    @activity.defn(name="start_process")
    async def start_process(self, inp: StartProcessInput) -> ProcessHandle:
        node = inp.node
        paths = self._paths(inp.job_id, inp.attempt, node.rank)
        async with self._lock:
            if paths.state.exists():  # started before: the same handle, never a second process
                state = json.loads(paths.state.read_text())
                return ProcessHandle(
                    job_id=inp.job_id,
                    attempt=inp.attempt,
                    rank=node.rank,
                    pid=int(state["pid"]),
                    log_path=str(paths.log),
                    already_running=True,
                    started_at=_utc(state.get("started_at")),
                    exited=self._exit(paths),
                )
            paths.root.mkdir(parents=True, exist_ok=True)
            paths.script.write_text("set -e\n" + "\n".join(inp.commands) + "\n")
            try:
                job_env = secrets.resolve(inp.env, host=self.host_id, path=self.secrets_path)
            except secrets.MissingSecret as exc:
                raise ApplicationError(str(exc), non_retryable=True) from None
            env = {**_inherited_env(), **job_env, **_node_env(inp)}
            wrapper = (
                f"bash {shlex.quote(str(paths.script))} > {shlex.quote(str(paths.log))} 2>&1; "
                f"echo $? > {shlex.quote(str(paths.exit_code))}.tmp && "
                f"mv {shlex.quote(str(paths.exit_code))}.tmp {shlex.quote(str(paths.exit_code))}"
            )
            cwd = inp.working_dir or str(paths.root)
            Path(cwd).mkdir(parents=True, exist_ok=True)
            child = subprocess.Popen(
                ["bash", "-c", wrapper],
                cwd=cwd,
                env=env,
                start_new_session=True,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            self._children[str(paths.root)] = child
            state = {
                "pid": child.pid,
                "start_time": _proc_start_time(child.pid),
                "started_at": time.time(),
                "gpus": node.gpu_indices,
            }
            tmp = paths.state.with_suffix(".tmp")
            tmp.write_text(json.dumps(state))
            tmp.replace(paths.state)
            activity.logger.info(
                "started %s attempt %s rank %s as pid %s",
                inp.job_id,
                inp.attempt,
                node.rank,
                child.pid,
            )
        return ProcessHandle(
            job_id=inp.job_id,
            attempt=inp.attempt,
            rank=node.rank,
            pid=child.pid,
            log_path=str(paths.log),
            started_at=_utc(state["started_at"]),
            exited=await self._exit_within(paths, inp.wait_s),
        )

    @activity.defn(name="probe_process")
    async def probe_process(self, inp: ProbeInput) -> ProbeResult:
        paths = self._paths(inp.job_id, inp.attempt, inp.rank)
        if not paths.state.exists():
            return ProbeResult(state="missing")
        exited = await self._exit_within(paths, inp.wait_s)
        if exited is not None:
            return exited
        pgid = self._group(paths)
        if pgid is None:
            self.sampler.forget(str(paths.root))
            if paths.stopped.exists():
                return ProbeResult(state="stopped", exit_code=None)
            return ProbeResult(state="missing")  # died without a trace (e.g. host reboot)
        if not inp.sample or not inp.gpu_indices:
            return ProbeResult(state="running")
        try:
            samples = await asyncio.to_thread(
                self.sampler.sample, str(paths.root), pgid, inp.gpu_indices, time.time()
            )
        except Exception as exc:  # a sampler fault is reported, never fatal
            return ProbeResult(state="running", sample_error=str(exc))
        return ProbeResult(state="running", samples=samples)

    async def _exit_within(self, paths: _Paths, wait_s: float) -> ProbeResult | None:
        """The script's exit, waiting up to `wait_s` for it. The exit code is a file the job's
        wrapper writes (it survives an agent restart): looked for every 50 ms."""
        for _ in range(int(min(wait_s, PROBE_WAIT_MAX_S) / 0.05)):
            if paths.exit_code.exists():
                break
            await asyncio.sleep(0.05)
        return self._exit(paths)

    def _exit(self, paths: _Paths) -> ProbeResult | None:
        if not paths.exit_code.exists():
            return None
        # The job's script has ended; leftovers in its group are stopped at finalize.
        self.sampler.forget(str(paths.root))
        try:
            code = int(paths.exit_code.read_text().strip())
        except (OSError, ValueError):
            code = None
        leftovers = self._group(paths) is not None
        return ProbeResult(state="exited", exit_code=code, leftovers=leftovers)

    @activity.defn(name="stop_process")
    async def stop_process(self, inp: StopProcessInput) -> StopProcessResult:
        """SIGTERM to the job's whole process group, SIGKILL after the grace period."""
        paths = self._paths(inp.job_id, inp.attempt, inp.rank)
        pgid = self._group(paths) if paths.state.exists() else None
        if pgid is None:
            return StopProcessResult(was_running=False)
        if not paths.exit_code.exists():
            paths.stopped.touch()
        _signal_group(pgid, signal.SIGTERM)
        deadline = time.monotonic() + inp.grace_s
        while time.monotonic() < deadline:
            if self._group(paths) is None:
                self.sampler.forget(str(paths.root))
                return StopProcessResult(was_running=True, signal="TERM")
            activity.heartbeat()
            await asyncio.sleep(0.2)
        _signal_group(pgid, signal.SIGKILL)
        for _ in range(50):
            if self._group(paths) is None:
                break
            await asyncio.sleep(0.1)
        self.sampler.forget(str(paths.root))
        return StopProcessResult(was_running=True, signal="KILL")

    @activity.defn(name="read_logs")
    async def read_logs(self, inp: LogsInput) -> LogChunk:
        job_dir = self.state_dir / "jobs" / inp.job_id
        attempt = inp.attempt
        if attempt is None:
            attempts = (
                sorted(
                    int(p.name.split("-")[0]) for p in job_dir.glob(f"*-{inp.rank}") if p.is_dir()
                )
                if job_dir.exists()
                else []
            )
            if not attempts:
                return LogChunk(data="", next_offset=0, eof=True)
            attempt = attempts[-1]
        paths = self._paths(inp.job_id, attempt, inp.rank)
        try:
            with paths.log.open("rb") as handle:
                handle.seek(inp.offset)
                data = handle.read(inp.limit)
        except OSError:
            return LogChunk(data="", next_offset=inp.offset, attempt=attempt, eof=True)
        return LogChunk(
            data=data.decode("utf-8", errors="replace"),
            next_offset=inp.offset + len(data),
            attempt=attempt,
            eof=len(data) < inp.limit,
        )

    @activity.defn(name="ping_host")
    async def ping_host(self) -> str:
        return self.host_id

    def activities(self) -> list[Any]:
        return [
            self.start_process,
            self.probe_process,
            self.stop_process,
            self.read_logs,
            self.ping_host,
        ]


def _signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass
    except PermissionError:
        os.kill(pid, sig)


def _node_env(inp: StartProcessInput) -> dict[str, str]:
    node = inp.node
    env = {
        "GPUFLOW_JOB_ID": inp.job_id,
        "GPUFLOW_ATTEMPT": str(inp.attempt),
        "GPUFLOW_NODE_RANK": str(node.rank),
        "GPUFLOW_NODES_NUM": str(inp.nodes),
        "GPUFLOW_MASTER_NODE_IP": inp.master_address,
        "GPUFLOW_GPUS_PER_NODE": str(len(node.gpu_indices)),
        "GPUFLOW_GPUS_NUM": str(len(node.gpu_indices) * inp.nodes),
        "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in node.gpu_indices),
    }
    if node.simulated:
        env["GPUFLOW_SIMULATED"] = "1"
    if node.gpu_fraction is not None:
        env["GPUFLOW_GPU_FRACTION"] = f"{node.gpu_fraction:g}"
    return env
