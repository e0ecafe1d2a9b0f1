"""`gpuflow queue`: apply, list and delete the queues jobs wait in."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from gpuflow.cli import common
from gpuflow.cli.common import run
from gpuflow.cli.render import Cell, Column, fitted_table
from gpuflow.errors import SpecError
from gpuflow.specs.queue import ANY_MODEL, gpu_amounts
from gpuflow.status import JobStatus

queue_app = typer.Typer(help="Queues: where jobs wait, with GPU quotas.", no_args_is_help=True)


def queues_table(queues: Sequence[Any], *, width: int) -> Table:
    """NAME, COHORT, QUOTA, USED, BORROWED, LENT, WAITING, RUNNING (admitted jobs); jobs
    between attempts are noted under it (`between_attempts_notes`)."""
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
            str(queue.running),
        ]
        for queue in queues
    ]
    return fitted_table(columns, rows, width=width)


def _used(queue: Any) -> str:
    """GPUs used, and the part of them over quota that no lending covers (a quota lowered
    under running jobs): `A100:4 (+2 over)`, the model said once when it is the only one."""
    used, over = gpu_amounts(queue.used), queue.over_quota
    if not over:
        return used
    alone = len(queue.used) == 1 and set(over) <= set(queue.used)
    amount = gpu_amounts({ANY_MODEL: sum(over.values())}) if alone else gpu_amounts(over)
    return f"{used} (+{amount} over)"


def between_attempts_notes(queues: Sequence[Any]) -> list[str]:
    """A line for each queue that holds jobs between two attempts (retrying), which the
    table counts in neither WAITING nor RUNNING (and `queue delete` counts)."""
    return [
        f"{queue.name}: {queue.between_attempts} job(s) between attempts (retrying), "
        "neither waiting nor running now"
        for queue in queues
        if queue.between_attempts
    ]


def print_queues(queues: Sequence[Any]) -> None:
    """The table, and the notes under it."""
    common.console.print(queues_table(queues, width=common.console.width))
    for note in between_attempts_notes(queues):
        common.console.print(escape(note), highlight=False)


@queue_app.command("apply")
@run
async def queue_apply(
    files: list[Path] = typer.Option(..., "--file", "-f", help="Queue file(s) (type: queue)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON (a list for several files)."),
) -> None:
    """Create or update queues, one per file, in order."""
    from gpuflow.scheduler.quota import mixed_cohort
    from gpuflow.specs.load import load_queue
    from gpuflow.specs.safe_yaml import display_path

    specs = common.load_each(files, load_queue, "queue")
    for k, spec in enumerate(specs):  # the control plane checks each against those applied
        mixed = mixed_cohort(spec, specs[:k])
        if mixed is not None:
            raise SpecError(f"{display_path(files[k])}: {mixed}")
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
    print_queues([queue.queue for queue in applied])


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
        print_queues(queues)


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
    priority: str = typer.Argument(
        ..., help="A whole number, 0..100: higher starts first within its queue."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Change a job's priority within its queue, waiting or running (a retry keeps it)."""
    wanted = _priority(priority)
    client = await common.open_client()
    try:
        before = await client.get(job)
        info = await client.set_priority(before.id, wanted)
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


def _priority(text: str) -> int:
    """The argument as a priority, or one line saying what one is (Typer's own refusal of a
    number it could not read was a box of several lines)."""
    from gpuflow.specs.job import check_priority

    value: object = int(text) if re.fullmatch(r"\s*[+-]?\d{1,12}\s*", text) else text
    try:
        return check_priority(value)
    except ValueError as exc:
        raise SpecError(f"priority: {exc}") from None
