"""Following jobs live until they end (`gpuflow apply` without -d)."""

from __future__ import annotations

import asyncio
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from gpuflow.cli.follow_logs import JobOutput
from gpuflow.cli.render import Column, fitted_table, recorded_status, status_text
from gpuflow.client.logs import RETRY_GRACE_S, workflow_running
from gpuflow.errors import GpuflowError
from gpuflow.status import JobStatus


def _table(rows: dict[str, dict[str, Any]], width: int) -> Table:
    columns = [
        Column("JOB"),
        Column("STATUS"),
        Column("WHERE", wrap=True),
        Column("DETAIL", wrap=True),
    ]
    cells = [
        [row["name"], status_text(row["status"], row["reason"]), row["where"], row["detail"]]
        for row in rows.values()
    ]
    return fitted_table(columns, cells, width=width)


async def _endings(client: Any, job_id: str) -> list[Any]:
    """The job's recorded endings (final statuses), oldest first, among its newest
    ENDINGS_READ statuses."""
    try:
        events = (await client.events(job_id, most=ENDINGS_READ)).events
    except GpuflowError:
        return []
    final = {status.value for status in JobStatus if status.is_final}
    return [event for event in events if event.status in final]


ENDINGS_READ = 100
"""Recorded statuses read to find the endings a poll missed (a few per attempt)."""

FINAL_OPEN_S = RETRY_GRACE_S
"""How long a job whose row reads final is still followed while its workflow runs on: a job
that retries records its next attempt within moments; a workflow that stays open longer (its
control worker gone before it closed) is not waited for without end (as `logs -f`)."""


async def follow_jobs(
    console: Console, client: Any, job_ids: list[str], *, output: bool = True
) -> bool:
    """Live status until every job ends (its row final, its workflow closed); prints each
    transition and, with `output`, what the jobs write (follow_logs.py). True if all ended
    `done`."""
    logs = JobOutput(console, client, prefixed=len(job_ids) > 1) if output else None
    rows: dict[str, dict[str, Any]] = {}
    over: set[str] = set()
    final_since: dict[str, float] = {}
    """When each job's row was first seen final while its workflow still ran."""
    seen: dict[str, tuple[str, str]] = {}
    placed: dict[str, str] = {}
    """Where each job ran, as its progress last said (hosts and GPUs): kept once it ends."""
    endings: dict[str, int] = {}
    """How many of each job's attempts' endings were printed."""
    with Live(
        _table(rows, console.width), console=console, refresh_per_second=4, transient=True
    ) as live:
        while True:
            for job_id in job_ids:
                info = await client.get(job_id)
                status = info.status
                detail = info.message or ""
                where = f"{','.join(info.hosts)} ({info.fleet})" if info.hosts else "-"
                try:
                    progress = await client.progress(job_id)
                    if not info.status.is_final:
                        status = progress.status
                        detail = progress.message or detail
                        if progress.placement is not None:
                            sim = " simulated" if progress.simulated else ""
                            where = placed[job_id] = (
                                ", ".join(
                                    f"{n.host_name}:{','.join(map(str, n.gpu_indices)) or '-'}"
                                    for n in progress.placement.nodes
                                )
                                + sim
                            )
                except GpuflowError:
                    pass
                if info.status.is_final and info.hosts and job_id in placed:
                    where = placed[job_id]
                if logs is not None and (job_id in placed or (info.status.is_final and info.hosts)):
                    logs.started(job_id, info.name)  # it ran, or runs: its output exists
                rows[job_id] = {
                    "name": info.name,
                    "status": status,
                    "reason": info.reason,
                    "where": where,
                    "detail": detail,
                }
                done, ended = endings.get(job_id, 0), info.attempt - 1
                if ended > done:
                    # Attempts ended between two polls (a preemption, a failed attempt retried
                    # at once): their endings as recorded, before the new attempt's lines.
                    for event in (await _endings(client, job_id))[-(ended - done) :]:
                        live.console.print(
                            Text.assemble(
                                (f"{info.name}: ", "bold"),
                                recorded_status(event.status),
                                f"  {event.message}" if event.message else "",
                            )
                        )
                    endings[job_id] = ended
                key = (status.value, detail)
                if status.is_final:
                    endings[job_id] = info.attempt
                if seen.get(job_id) != key:
                    seen[job_id] = key
                    live.console.print(
                        Text.assemble(
                            (f"{info.name}: ", "bold"),
                            status_text(status, info.reason),
                            f"  {detail}" if detail else "",
                        )
                    )
            live.update(_table(rows, console.width))
            now = asyncio.get_running_loop().time()
            for job_id, row in rows.items():
                if job_id in over or not row["status"].is_final:
                    final_since.pop(job_id, None)
                    continue
                since = final_since.setdefault(job_id, now)
                handle = client.temporal.get_workflow_handle(job_id)
                if now - since > FINAL_OPEN_S or not await workflow_running(handle):
                    over.add(job_id)
            if len(over) == len(rows):
                break
            await asyncio.sleep(0.5)
        if logs is not None:
            await logs.finish()
    console.print(_table(rows, console.width))
    return all(row["status"] == JobStatus.DONE for row in rows.values())
