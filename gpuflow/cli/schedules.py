"""`gpuflow schedule`: submit a job on a cron (Temporal Schedules)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

from gpuflow.cli import common
from gpuflow.cli.common import run
from gpuflow.errors import GpuflowError

# ---- schedules ------------------------------------------------------------------------------

schedule_app = typer.Typer(
    help="Submit a job on a cron (Temporal Schedules).", no_args_is_help=True
)


@schedule_app.command("create")
@run
async def schedule_create(
    file: Path = typer.Option(..., "--file", "-f", help="Job file."),
    cron: str | None = typer.Option(
        None,
        "--cron",
        help="Cron expression in UTC: minute hour day-of-month month day-of-week, e.g. "
        "'0 3 * * *' (03:00 UTC), or @daily, @hourly...; start it with CRON_TZ=Europe/Berlin "
        "for another time zone.",
    ),
    every: str | None = typer.Option(None, "--every", help="Interval, e.g. 6h (1m or more)."),
    schedule_id: str | None = typer.Option(None, "--id", help="Schedule id."),
    profile: str | None = typer.Option(None, "--profile", help="Profile (defaults) to inherit."),
    gpu: str | None = typer.Option(None, "--gpu", help="Override resources.gpu, e.g. A100:2."),
    fleet: list[str] | None = typer.Option(None, "--fleet", help="Fleets to try, in order."),
    max_duration: str | None = typer.Option(
        None, "--max-duration", help="Stop each run after this long, e.g. 2h (off: never)."
    ),
    queue: str | None = typer.Option(None, "--queue", "-q", help="Queue to wait in."),
    priority: int | None = typer.Option(
        None, "--priority", help="0..100: higher starts first within its queue."
    ),
) -> None:
    """Create a schedule; each run is a job of its own (apply's overrides apply to each).
    Cron times are UTC."""
    from gpuflow.client.cron import check_cron
    from gpuflow.client.schedules import check_every, check_schedule_id, run_id_prefix
    from gpuflow.specs.units import parse_duration

    # Checked here, so that their errors name the flag, not the job file.
    if (cron is None) == (every is None):
        raise GpuflowError("give exactly one of --cron or --every")
    if cron is not None:
        cron = check_cron(cron, name="--cron")
    try:
        every_s = parse_duration(every) if every is not None else None
    except ValueError as exc:
        raise GpuflowError(f"--every: {exc}") from None
    if every_s is not None:
        check_every(every_s, name="--every")
    if schedule_id is not None:
        check_schedule_id(schedule_id, name="--id")
    (spec,) = common.load_jobs(
        [file],
        profile=profile,
        fleet=fleet,
        gpu=gpu,
        max_duration=max_duration,
        queue=queue,
        priority=priority,
    )
    client = await common.open_client()
    try:
        with common.named_file([file]):
            created = await client.schedule(
                spec, cron=cron, every_s=every_s, schedule_id=schedule_id
            )
        (plan,) = await client.plan([spec])
    finally:
        await client.close()
    runs = escape(run_id_prefix(spec.name, created))
    common.console.print(
        f"schedule [bold]{created}[/] created; its runs show up in `gpuflow ps` as {runs}-<time>"
    )
    never = plan.queue_never or (
        None if plan.fits_idle else "nothing fits it, even with every host of its fleets idle"
    )
    if never is not None:  # the fleets or the queue may change before its first run: said
        common.err.print(f"warning: {escape(never)}: each run waits or fails until that changes")


@schedule_app.command("list")
@run
async def schedule_list(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """List schedules with their next runs."""
    from gpuflow.cli.render import schedules_table

    client = await common.open_client()
    try:
        schedules = await client.schedules()
    finally:
        await client.close()
    if as_json:
        common.print_json(schedules)
        return
    if not schedules:
        common.console.print("no schedules")
        return
    common.console.print(schedules_table(schedules, width=common.console.width))


@schedule_app.command("delete")
@run
async def schedule_delete(
    schedule_id: str = typer.Argument(..., help="Schedule id (schedule list)."),
) -> None:
    """Delete a schedule (jobs it started keep running)."""
    client = await common.open_client()
    try:
        await client.delete_schedule(schedule_id)
    finally:
        await client.close()
    common.console.print(f"schedule {schedule_id} deleted")
