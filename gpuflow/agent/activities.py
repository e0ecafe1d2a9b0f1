"""Host agent activities: start, probe and stop job processes, sample GPUs, read logs.

They run on the host's own task queue. Processes are started in their own session with an exit
code file written by a wrapper (launch.py), and their pid and start time are kept on disk, so an
agent that restarts still knows which processes are its own (processes.py) and how they ended
(exits.py). Logs leave the host masked with the secret values recorded at start (logs.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from gpuflow import secrets
from gpuflow.agent import processes
from gpuflow.agent.exits import recorded_exit, wait_for_exit
from gpuflow.agent.job_env import job_environment
from gpuflow.agent.launch import (
    RunLocks,
    claimed_pid,
    drop_dead_claim,
    job_working_dir,
    spawn_wrapper,
)
from gpuflow.agent.logs import latest_attempt, read_masked, record_masks, secret_values
from gpuflow.agent.processes import RunPaths
from gpuflow.config import private_dir
from gpuflow.metrics import SampledRun, Sampler
from gpuflow.utilization import GpuSample, readings_kept
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


def _sampled(paths: processes.RunPaths, pgid: int, gpus: list[int]) -> SampledRun:
    """The run as its GPUs are sampled: with the GPUs it holds a share of (none for a run
    started before shares were noted)."""
    try:
        shared = json.loads(paths.state.read_text()).get("shared_gpus", [])
    except (OSError, ValueError):
        shared = []
    return SampledRun(str(paths.root), pgid, tuple(gpus), frozenset(shared))


def _utc(timestamp: float | None) -> datetime | None:
    return None if timestamp is None else datetime.fromtimestamp(timestamp, UTC)


class HostAgent:
    """The activities of one host. `state_dir` survives agent restarts."""

    def __init__(
        self,
        *,
        host_id: str,
        state_dir: Path,
        sampler: Sampler,
        secrets_path: Path | None = None,
    ) -> None:
        self.host_id = host_id
        self.secrets_path = secrets_path
        """Where this host's secrets live; None is GPUFLOW_HOME/secrets.json."""
        self.state_dir = Path(state_dir)
        self.sampler = sampler
        self.sample_every_s: float | None = None
        """While a probe waits on a running job, read its GPUs this often (for this process's
        metrics, which would otherwise move only when a probe answers, once a tick); None reads
        them only when the probe answers."""
        self._children: dict[str, subprocess.Popen[bytes]] = {}
        self._starting = RunLocks()

    def _paths(self, job_id: str, attempt: int, rank: int) -> RunPaths:
        return RunPaths(self.state_dir / "jobs" / job_id / f"{attempt}-{rank}")

    def _reap(self) -> None:
        for key, child in list(self._children.items()):
            if child.poll() is not None:
                del self._children[key]

    def _group(self, paths: RunPaths) -> int | None:
        """The job's process group id while any of its processes lives, else None."""
        self._reap()
        return processes.live_group(paths)

    def _alive(self, paths: RunPaths) -> Callable[[], bool]:
        return lambda: self._group(paths) is not None

    @activity.defn(name="start_process")
    async def start_process(self, inp: StartProcessInput) -> ProcessHandle:
        node = inp.node
        paths = self._paths(inp.job_id, inp.attempt, node.rank)
        if activity.in_activity():  # alive: an agent that dies from here on is seen in seconds
            activity.heartbeat()
        async with self._starting.hold(str(paths.root)):
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
            try:
                job_env = secrets.resolve(inp.env, host=self.host_id, path=self.secrets_path)
            except (secrets.MissingSecret, secrets.SecretsFileError) as exc:
                # The job's (or the host's secrets file's) fault, not an interruption: the job
                # ends failed with this message instead of being retried elsewhere.
                raise ApplicationError(str(exc), non_retryable=True) from None
            referenced = secrets.referenced(inp.env)
            for directory in (self.state_dir, paths.root.parent.parent, paths.root.parent):
                private_dir(directory)
            private_dir(paths.root)  # before a relative working_dir is made inside it
            cwd = usable_working_dir(inp.working_dir, paths.root, self.host_id)
            # Before the process can print them: its log stays masked with these whatever
            # becomes of the secrets, whichever agent reads it.
            record_masks(paths, (job_env[key] for key in referenced))
            # A start cut off before it recorded the process: adopt what it launched.
            pid = await claimed_pid(claim=paths.claim, pid=paths.pid)
            adopted = pid is not None
            if pid is None:
                drop_dead_claim(paths.claim)
                self._children[str(paths.root)] = spawn_wrapper(
                    paths,
                    commands=inp.commands,
                    cwd=cwd,
                    env=job_environment(inp, job_env),
                )
                # The pid of the wrapper that won the claim: this one's, unless a wrapper of
                # an earlier, cut-off start claimed the run first.
                pid = await claimed_pid(claim=paths.claim, pid=paths.pid, launched=True)
                if pid is None:
                    raise ApplicationError(
                        f"the job's wrapper on {self.host_id} exited before it started the script"
                    )
            state = {
                "pid": pid,
                "start_time": processes.proc_start_time(pid),
                "started_at": time.time(),
                "gpus": node.gpu_indices,
                # A share of a GPU: its readings are the job's own processes' (samplers.py).
                "shared_gpus": node.gpu_indices if node.gpu_fraction is not None else [],
                # Names only (the values are in the run's masks): a log read masks the values
                # they have then too.
                "secrets": sorted(set(referenced.values())),
            }
            tmp = paths.state.with_suffix(".tmp")
            processes.write_private(tmp, json.dumps(state))
            tmp.replace(paths.state)
            activity.logger.info(
                "started %s attempt %s rank %s as pid %s",
                inp.job_id,
                inp.attempt,
                node.rank,
                pid,
            )
        return ProcessHandle(
            job_id=inp.job_id,
            attempt=inp.attempt,
            rank=node.rank,
            pid=pid,
            log_path=str(paths.log),
            already_running=adopted,
            started_at=_utc(state["started_at"]),
            exited=await self._exit_within(paths, inp.wait_s),
        )

    @activity.defn(name="probe_process")
    async def probe_process(self, inp: ProbeInput) -> ProbeResult:
        paths = self._paths(inp.job_id, inp.attempt, inp.rank)
        if not paths.state.exists():
            return ProbeResult(state="missing")
        # A long poll: answer at once when the script exits, else at the end of the wait with
        # fresh samples (the workflow needs no timer between probes).
        sampling = inp.sample and bool(inp.gpu_indices)
        taken: list[GpuSample] = []
        reading = self._reading(paths, inp.gpu_indices, taken) if sampling else None
        exited = await self._exit_within(paths, inp.wait_s, on_wait=reading)
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
            run = _sampled(paths, pgid, inp.gpu_indices)
            samples = await asyncio.to_thread(self.sampler.sample, run, time.time())
        except Exception as exc:  # a sampler fault is reported, never fatal
            return ProbeResult(state="running", sample_error=str(exc))
        if inp.min_utilization is not None and taken:
            # When the GPUs turned busy or idle during the wait, not only how they read now.
            samples = readings_kept([*taken, *samples], inp.min_utilization)
        return ProbeResult(state="running", samples=samples)

    def _reading(
        self, paths: RunPaths, indices: list[int], taken: list[GpuSample]
    ) -> Callable[[], None] | None:
        """A reading of the job's GPUs taken while a probe waits: its samples go to the
        metrics and to `taken` (the probe answers with the turns among them)."""
        if self.sample_every_s is None:
            return None

        def read() -> None:
            pgid = self._group(paths)
            if pgid is not None:
                with contextlib.suppress(Exception):  # a sampler fault is the probe's to report
                    taken.extend(self.sampler.sample(_sampled(paths, pgid, indices), time.time()))

        return read

    async def _exit_within(
        self, paths: RunPaths, wait_s: float, *, on_wait: Callable[[], None] | None = None
    ) -> ProbeResult | None:
        """The script's exit, waiting up to `wait_s` for it (see exits.wait_for_exit)."""
        await wait_for_exit(
            paths,
            wait_s,
            alive=self._alive(paths),
            on_wait=on_wait,
            every_s=self.sample_every_s or 0.0,
        )
        return self._exit(paths)

    def _exit(self, paths: RunPaths) -> ProbeResult | None:
        if not paths.exit_code.exists():
            return None
        # The job's script has ended; leftovers in its group are stopped at finalize.
        self.sampler.forget(str(paths.root))
        return recorded_exit(paths, alive=self._alive(paths))

    @activity.defn(name="stop_process")
    async def stop_process(self, inp: StopProcessInput) -> StopProcessResult:
        """SIGTERM to the job's whole process group, SIGKILL after the grace period."""
        paths = self._paths(inp.job_id, inp.attempt, inp.rank)
        pgid = self._group(paths) if paths.state.exists() else None
        if pgid is None:
            return StopProcessResult(was_running=False)
        if not paths.exit_code.exists():
            paths.stopped.touch()
        processes.signal_group(pgid, signal.SIGTERM)
        deadline = time.monotonic() + inp.grace_s
        while time.monotonic() < deadline:
            if self._group(paths) is None:
                self.sampler.forget(str(paths.root))
                return StopProcessResult(was_running=True, signal="TERM")
            activity.heartbeat()
            await asyncio.sleep(0.2)
        processes.signal_group(pgid, signal.SIGKILL)
        for _ in range(50):
            if self._group(paths) is None:
                break
            await asyncio.sleep(0.1)
        self.sampler.forget(str(paths.root))
        return StopProcessResult(was_running=True, signal="KILL")

    @activity.defn(name="read_logs")
    async def read_logs(self, inp: LogsInput) -> LogChunk:
        """Log bytes from `offset`, every secret value the job was given masked. A value that a
        read would cut is held back for the next one; with `wait_s`, waits that long for new
        bytes before answering with none."""
        attempt = inp.attempt
        if attempt is None:
            attempt = latest_attempt(self.state_dir / "jobs" / inp.job_id, inp.rank)
            if attempt is None:
                return LogChunk(data="", next_offset=0, eof=True)
        paths = self._paths(inp.job_id, attempt, inp.rank)
        values = secret_values(paths, secrets_path=self.secrets_path)
        return await read_masked(
            paths, inp, attempt=attempt, values=values, alive=self._alive(paths)
        )

    @activity.defn(name="ping_host")
    async def ping_host(self) -> str:
        return self.host_id

    def activities(self) -> list[Any]:
        """What a host agent registers: the host half of workflows.contract."""
        return [
            self.start_process,
            self.probe_process,
            self.stop_process,
            self.read_logs,
            self.ping_host,
        ]


def usable_working_dir(working_dir: str | None, run_dir: Path, host: str) -> Path:
    """Where the job runs (launch.job_working_dir), made if missing; a non-retryable refusal
    (the job's fault, not an interruption of its host) when it cannot be made or entered."""
    try:
        path = job_working_dir(working_dir, run_dir)
        path.mkdir(parents=True, exist_ok=True)
        problem = None if os.access(path, os.R_OK | os.X_OK) else "permission denied"
    except OSError as exc:
        problem = (exc.strerror or type(exc).__name__).lower()
    except RuntimeError:  # Path.home() of a user without one
        problem = "~ names the home of the agent's user, and it has none"
    if problem is not None:
        raise ApplicationError(
            f"working_dir {working_dir} cannot be used on {host}: {problem}", non_retryable=True
        )
    return path
