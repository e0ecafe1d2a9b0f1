"""A run's log as a host agent serves it: bytes from an offset, with every secret value the job
was given masked (an unmasked log never leaves the host), waiting a little for new bytes when
asked to follow. The values are recorded next to the run's files when it starts, so they are
masked whatever becomes of the secrets later and whichever agent reads the log."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from temporalio import activity
from temporalio.exceptions import ApplicationError

from gpuflow import secrets
from gpuflow.agent.masking import mask, maskable
from gpuflow.agent.processes import RunPaths, write_private
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


def record_masks(paths: RunPaths, values: Iterable[str]) -> None:
    """Records, before the run's process starts, the secret values it is given: its log is
    masked with them whatever becomes of its secrets later, across agent restarts. A retried
    start adds to what an earlier one recorded (the process it adopts got those). The record
    is private, as output.log, which holds the values in clear, already is."""
    known = recorded_masks(paths) or []
    tmp = paths.masks.with_suffix(".tmp")
    write_private(tmp, json.dumps({"values": sorted({*known, *values})}))
    tmp.replace(paths.masks)  # whole or absent: a cut-off write leaves the previous record


def recorded_masks(paths: RunPaths) -> list[str] | None:
    """The secret values recorded at the run's start; None when it has no record (an agent
    from before records were kept started it). A record that cannot be read is refused: an
    unmasked log must not leave the host."""
    try:
        text = paths.masks.read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        problem = exc.strerror or type(exc).__name__
    except UnicodeDecodeError:  # its message would quote a byte of the file
        problem = "not UTF-8 text"
    else:
        try:
            values = json.loads(text).get("values")
        except (ValueError, AttributeError):
            values = None
        if isinstance(values, list) and all(isinstance(v, str) for v in values):
            return values
        problem = 'not a JSON object with a "values" list of strings'
    raise ApplicationError(
        f"cannot mask the job's secrets in its log: {paths.masks} cannot be read: {problem}",
        non_retryable=True,
    )


def secret_values(paths: RunPaths, *, secrets_path: Path | None) -> list[str]:
    """The secret values to mask in a run's log: those recorded at its start and those its
    secret names have now. Refuses when it cannot know them: its record cannot be read, or it
    has none and the secrets file is broken."""
    recorded = recorded_masks(paths)
    try:
        names: list[str] = json.loads(paths.state.read_text()).get("secrets", [])
    except (OSError, ValueError):
        names = []
    try:
        stored = secrets.load(secrets_path) if names else {}
    except secrets.SecretsFileError as exc:
        if recorded is not None:
            return recorded  # every value the process was given
        raise ApplicationError(
            f"cannot mask the job's secrets in its log: {exc}", non_retryable=True
        ) from None
    return [*(recorded or []), *(stored[name] for name in names if name in stored)]


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
