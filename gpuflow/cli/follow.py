"""Showing the plan before a submit, and following jobs live until they end."""

from __future__ import annotations

import asyncio
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from gpuflow.cli.render import status_text
from gpuflow.client import taken_option
from gpuflow.errors import GpuflowError
from gpuflow.status import JobStatus


async def show_plan(console: Console, client: Any, spec: Any) -> None:
    per_option = await client.offers_per_option(spec)
    gpus = " or ".join(o.gpu for o in per_option)
    console.print(
        f"[bold]{spec.name}[/]: {spec.nodes} node(s), GPU {gpus}, "
        f"fleets {', '.join(spec.fleets) or 'any'}"
    )
    chosen = taken_option(per_option)
    if chosen is not None and chosen.offers.fits:
        best = chosen.offers.fits[0]
        which = f"option {chosen.option} ({chosen.gpu}): " if len(per_option) > 1 else ""
        console.print(
            f"  best fit: {which}{best.host} (fleet {best.fleet}, GPUs {best.gpus or '-'}, "
            f"score {best.score:.3f}); {len(chosen.offers.fits)} host(s) fit"
        )
        return
    console.print(
        "  [yellow]nothing fits now[/]; the job waits for capacity if its retry "
        "policy allows, else it fails:"
    )
    for option in per_option:
        prefix = f"option {option.option} ({option.gpu}): " if len(per_option) > 1 else ""
        for rejection in option.offers.rejections[:10]:
            console.print(f"    {prefix}{rejection}", highlight=False)


def _table(rows: dict[str, dict[str, Any]]) -> Table:
    table = Table(box=None, header_style="bold")
    for column in ("JOB", "STATUS", "WHERE", "DETAIL"):
        table.add_column(column)
    for row in rows.values():
        table.add_row(
            row["name"],
            status_text(row["status"], row["reason"]),
            row["where"],
            Text(row["detail"], overflow="fold"),
        )
    return table


async def follow_jobs(console: Console, client: Any, job_ids: list[str]) -> bool:
    """Live status until every job ends; prints each transition. True if all ended `done`."""
    rows: dict[str, dict[str, Any]] = {}
    seen: dict[str, tuple[str, str]] = {}
    with Live(_table(rows), console=console, refresh_per_second=4, transient=True) as live:
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
                            where = (
                                ", ".join(
                                    f"{n.host_name}:{','.join(map(str, n.gpu_indices)) or '-'}"
                                    for n in progress.placement.nodes
                                )
                                + sim
                            )
                except GpuflowError:
                    pass
                rows[job_id] = {
                    "name": info.name,
                    "status": status,
                    "reason": info.reason,
                    "where": where,
                    "detail": detail,
                }
                key = (status.value, detail)
                if seen.get(job_id) != key:
                    seen[job_id] = key
                    live.console.print(
                        Text.assemble(
                            (f"{info.name}: ", "bold"),
                            status_text(status, info.reason),
                            f"  {detail}" if detail else "",
                        )
                    )
            live.update(_table(rows))
            if all(row["status"].is_final for row in rows.values()):
                break
            await asyncio.sleep(0.5)
    console.print(_table(rows))
    return all(row["status"] == JobStatus.DONE for row in rows.values())
