"""`gpuflow queue`: apply, list and delete the queues jobs wait in."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from gpuflow.cli import common
from gpuflow.cli.common import run
from gpuflow.cli.render import Cell, Column, fitted_table
from gpuflow.specs.queue import gpu_amounts
from gpuflow.status import JobStatus

queue_app = typer.Typer(help="Queues: where jobs wait, with GPU quotas.", no_args_is_help=True)


def queues_table(queues: Sequence[Any], *, width: int) -> Table:
    """NAME, COHORT, QUOTA, USED, BORROWED, LENT, WAITING, RUNNING (admitted jobs)."""
    columns = [
        Column("NAME"),
        Column("COHORT", drop=3),
        Column("QUOTA", wrap=True, readable=8),
        Column("USED", wrap=True, readable=8),
        Column("BORROWED", drop=1, wrap=True, readable=8),
        Column("LENT", drop=2, wrap=True, readable=8),
        Column("WAITING", justify="right"),
        Column("RUNNING", justify="right"),
    ]
    rows: list[list[Cell]] = [
        [
            queue.name,
            queue.cohort or "-",
            "no limit" if queue.quota is None else gpu_amounts(queue.quota),
            _used(queue),
            gpu_amounts(queue.borrowed),
            gpu_amounts(queue.lent),
            str(queue.waiting),
            str(queue.admitted),
        ]
        for queue in queues
    ]
    return fitted_table(columns, rows, width=width)


def _used(queue: Any) -> str:
    """GPUs used, and the part of them over quota that no lending covers (a quota lowered
    under running jobs)."""
    used = gpu_amounts(queue.used)
    return f"{used} ({gpu_amounts(queue.over_quota)} over)" if queue.over_quota else used


@queue_app.command("apply")
@run
async def queue_apply(
    files: list[Path] = typer.Option(..., "--file", "-f", help="Queue file(s) (type: queue)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON (a list for several files)."),
) -> None:
    """Create or update queues, one per file, in order."""
    from gpuflow.specs.load import load_queue

    specs = common.load_each(files, load_queue, "queue")
    client = await common.open_client()
    applied = []
    try:
        for spec in specs:
            with common.console.status(f"applying queue {escape(spec.name)}…"):
                applied.append(await client.apply_queue(spec))
    finally:
        await client.close()
    if as_json:
        dumped = [queue.model_dump(mode="json") for queue in applied]
        common.print_json(dumped[0] if len(files) == 1 else dumped)
        return
    for queue in applied:
        done = "created" if queue.created else "updated" if queue.changed else "unchanged"
        common.console.print(f"queue [bold]{escape(queue.queue.name)}[/] {done}")
        for warning in queue.warnings:
            common.err.print(f"warning: {escape(warning)}", highlight=False)
    queues = [queue.queue for queue in applied]
    common.console.print(queues_table(queues, width=common.console.width))


@queue_app.command("list")
@run
async def queue_list(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """List queues: quota, GPUs used, borrowed and lent, and jobs waiting and running."""
    client = await common.open_client()
    try:
        with common.console.status("reading the queues…"):
            queues = await client.list_queues()
    finally:
        await client.close()
    if as_json:
        common.print_json([queue.model_dump(mode="json") for queue in queues])
    else:
        common.console.print(queues_table(queues, width=common.console.width))


@queue_app.command("delete")
@run
async def queue_delete(
    name: str = typer.Argument(..., help="Queue name."),
    force: bool = typer.Option(
        False, "--force", help="Delete it even though schedules name it (their runs fail)."
    ),
) -> None:
    """Delete a queue that holds no job and that no schedule names (deleting an applied
    `default` restores the built-in one, which has no quota limit)."""
    client = await common.open_client()
    try:
        needing = await common.schedules_needing(client, queue=name) if force else []
        await client.delete_queue(name, force=force)
    finally:
        await client.close()
    if name == "default":
        common.console.print("queue default deleted; the built-in default queue (no limit) is back")
    else:
        common.console.print(f"queue {escape(name)} deleted", highlight=False)
    common.warn_scheduled(f"queue {name}", needing, "it is applied again")


@run
async def set_priority(
    job: str = typer.Argument(..., help="Job name or id."),
    priority: int = typer.Argument(..., help="0..100: higher starts first within its queue."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Change a job's priority within its queue, waiting or running (a retry keeps it)."""
    client = await common.open_client()
    try:
        before = await client.get(job)
        info = await client.set_priority(before.id, priority)
    finally:
        await client.close()
    if as_json:
        common.print_json(info.model_dump(mode="json"))
        return
    common.console.print(
        f"{escape(info.name)} ({info.id}): priority {before.priority} -> {info.priority} "
        f"in queue {escape(info.queue or 'default')}"
        + ("; the next admission pass orders it by it" if info.status == JobStatus.PENDING else ""),
        highlight=False,
    )
