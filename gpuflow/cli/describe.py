"""`gpuflow describe`: one job in full, with the statuses it recorded (what `ps` shortens)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import typer
from rich.console import Group
from rich.table import Table
from rich.text import Text

from gpuflow.cli import common
from gpuflow.cli.common import run
from gpuflow.cli.render import Cell, Column, ago, fitted_table, recorded_status, status_text
from gpuflow.cli.waiting import (
    line_positions,
    queue_reason_text,
    reserved_text,
    short_reasons,
    waiting_summary,
)
from gpuflow.status import JobStatus, capacity_prefix, capacity_reasons

MOST_REASONS = 30
"""Reasons a job waits shown at most (one per host, or per group of hosts on a big fleet)."""


@run
async def describe(
    job: str = typer.Argument(..., help="Job name or id."),
    events: int = typer.Option(20, "--events", min=1, max=500, help="The newest N statuses."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """One job in full: where it runs or why it waits (every reason), its queue and place in
    line, and the statuses it recorded (retries, waits, preemptions), newest last."""
    client = await common.open_client()
    try:
        with common.err.status(f"reading {job}…"):
            described = await client.describe(job, events=events)
            info = described.job
            # Its place in line, as `ps` counts it: among its queue's waiting jobs, when no
            # admission pass has placed it yet (a pass's place is its own).
            line = as_json and info.status == JobStatus.PENDING and info.queue_position is None
            listed = await client.jobs(queue=info.queue) if line else []
    finally:
        await client.close()
    if as_json:
        dumped = described.model_dump(mode="json")
        dumped["job"]["waiting"] = waiting_summary(info, line_positions(listed))  # as in ps
        common.print_json(dumped)
        return
    width = common.console.width
    shown, total = described.events, described.events_total
    common.console.print(_facts(described.job))
    title = f"statuses (the newest {len(shown)} of {total:,})" if total > len(shown) else ""
    common.console.print(Text(title or "statuses", style="bold"))
    common.console.print(_events_table(shown, width=width))


def _facts(info: Any) -> Group:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(overflow="fold")
    grid.add_row("job", Text(f"{info.name} ({info.id})"))
    grid.add_row("status", status_text(info.status, info.reason))
    for label, value in _lines(info):
        grid.add_row(label, Text(value))
    reasons = _reasons(info)
    if len(reasons) > MOST_REASONS:  # a fleet of thousands of hosts: the first, and a count
        left = len(reasons) - MOST_REASONS + 1
        reasons = [*reasons[: MOST_REASONS - 1], f"... and {left:,} more (--json has all)"]
    if reasons:
        grid.add_row("why", Text("\n".join(reasons)))
    elif info.message:
        grid.add_row("message", Text(info.message))
    return Group(grid)


def _lines(info: Any) -> list[tuple[str, str]]:
    lines = []
    if info.queue:
        place = f"{info.queue}"
        if info.status == JobStatus.PENDING and info.queue_position is not None:
            place += f", #{info.queue_position} in line: {queue_reason_text(info.queue_reason)}"
        lines.append(("queue", place))
    reserved = reserved_text(info)
    if reserved is not None:
        start = info.reserved_start
        by = "" if start is None else f"; by {_when(start)} if the jobs it waits for run to "
        lines.append(("reserved", reserved + (by + "their max_duration" if by else "")))
    lines.append(("priority", str(info.priority) + (", preemptible" if info.preemptible else "")))
    lines.append(("attempt", str(info.attempt)))
    if info.hosts:
        where = ", ".join(info.hosts) + (f" ({info.gpus})" if info.gpus else "")
        lines.append(("where", f"{where} on fleet {info.fleet}" if info.fleet else where))
    for host, state in info.hosts_not_ready.items():
        lines.append(("warning", f"host {host} is {state}"))
    started = "first started" if info.attempt > 1 else "started"  # attempt 1's start
    for label, moment in (
        ("submitted", info.submitted_at),
        (started, info.started_at),
        ("finished", info.finished_at),
    ):
        if moment is not None:
            lines.append((label, f"{_when(moment)} ({ago(moment)})"))
    return lines


def _reasons(info: Any) -> list[str]:
    """Why the job waits, or found no capacity, one host per line (`ps` shows the first)."""
    return capacity_reasons(info.message or "")


def _events_table(events: list[Any], *, width: int) -> Table:
    columns = [Column("TIME"), Column("STATUS"), Column("MESSAGE", wrap=True)]
    rows: list[list[Cell]] = [
        [_when(event.at), recorded_status(event.status), _short(event.message)] for event in events
    ]
    return fitted_table(columns, rows, width=width)


def _short(message: str) -> str:
    """A status's words, its per-host reasons cut to the first (the `why` above has them)."""
    reasons = capacity_reasons(message)
    if len(reasons) < 2:
        return message
    return f"{capacity_prefix(message)}{short_reasons('; '.join(reasons))}"


def _when(moment: datetime) -> str:
    """Local time to the second; the date too when it is not today."""
    local = (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).astimezone()
    today = datetime.now().astimezone().date()
    return local.strftime("%H:%M:%S" if local.date() == today else "%Y-%m-%d %H:%M:%S")
