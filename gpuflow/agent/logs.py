"""A run's log as a host agent serves it: bytes from an offset, with every secret value the job
was given masked (an unmasked log never leaves the host), waiting a little for new bytes when
asked to follow."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from temporalio import activity
from temporalio.exceptions import ApplicationError

from gpuflow import secrets
from gpuflow.agent.masking import mask, maskable
from gpuflow.agent.processes import RunPaths
from gpuflow.workflows.models import LogChunk, LogsInput

LOG_WAIT_MAX_S = 10.0
"""Longest a log read waits for new bytes: well inside the read's timeout."""


def latest_attempt(job_dir: Path, rank: int) -> int | None:
    """The job's newest attempt that ran `rank` on this host; None when none did."""
    attempts = (
        sorted(int(p.name.split("-")[0]) for p in job_dir.glob(f"*-{rank}") if p.is_dir())
        if job_dir.exists()
        else []
    )
    return attempts[-1] if attempts else None


def secret_values(
    paths: RunPaths, *, given: Mapping[str, str], secrets_path: Path | None
) -> list[str]:
    """The secret values to mask in a run's log: those `given` at start (known while the agent
    that started it runs) and those its secret names have now. Refuses when the secrets file is
    broken and the values are not known otherwise: an unmasked log must not leave the host."""
    try:
        names: list[str] = json.loads(paths.state.read_text()).get("secrets", [])
    except (OSError, ValueError):
        names = []
    try:
        stored = secrets.load(secrets_path) if names else {}
    except secrets.SecretsFileError as exc:
        if set(names) <= given.keys():
            return list(given.values())
        raise ApplicationError(
            f"cannot mask the job's secrets in its log: {exc}", non_retryable=True
        ) from None
    return [*given.values(), *(stored[name] for name in names if name in stored)]


async def read_masked(
    paths: RunPaths,
    inp: LogsInput,
    *,
    attempt: int,
    values: list[str],
    alive: Callable[[], bool],
) -> LogChunk:
    """The log bytes of `attempt` from `inp.offset`, `values` masked. A value that a read would
    cut is held back for the next one; with `inp.wait_s`, waits that long (LOG_WAIT_MAX_S at
    most) for new bytes before answering with none. The log is final once the run's process
    group is no longer `alive`."""
    masked_values = maskable(values)
    deadline = time.monotonic() + min(inp.wait_s, LOG_WAIT_MAX_S)
    while True:
        # Whether anything can still write is decided before reading, so no byte can follow
        # a read taken as final (a killed job writes no exit code: its group is the test).
        final = paths.state.exists() and not alive()
        # Past the limit by the longest value, so that a full read always shows one whole.
        size = inp.limit + max((len(v) for v in masked_values), default=0)
        try:
            with paths.log.open("rb") as handle:
                handle.seek(inp.offset)
                data = handle.read(size)
        except OSError:
            return LogChunk(data="", next_offset=inp.offset, attempt=attempt, eof=True)
        eof = len(data) < size
        masked, consumed = mask(data, masked_values, final=final and eof)
        if masked or final or time.monotonic() >= deadline:
            return LogChunk(
                data=masked.decode("utf-8", errors="replace"),
                next_offset=inp.offset + consumed,
                attempt=attempt,
                eof=eof,
            )
        activity.heartbeat()
        await asyncio.sleep(0.2)
