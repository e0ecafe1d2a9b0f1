"""`gpuflow fleet`: apply, list and delete fleets of hosts."""

from __future__ import annotations

from pathlib import Path

import typer

from gpuflow.cli import common
from gpuflow.cli.common import run

fleet_app = typer.Typer(help="Fleets of hosts.", no_args_is_help=True)


@fleet_app.command("apply")
@run
async def fleet_apply(
    files: list[Path] = typer.Option(..., "--file", "-f", help="Fleet file(s)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON (a list for several files)."),
) -> None:
    """Create or update fleets, one per file, in order."""
    from gpuflow.cli.render import fleets_table
    from gpuflow.specs.load import load_fleet

    specs = common.load_each(files, load_fleet, "fleet")
    client = await common.open_client()
    applied = []
    try:
        for spec in specs:
            hosts = len(spec.hosts) or 1
            with common.console.status(f"applying fleet {spec.name} ({hosts} host(s))…"):
                applied.append(await client.apply_fleet(spec))
    except BaseException:
        # A later file failed (an unreachable host): say which fleets changed before it.
        done = ", ".join(info.name for info in applied)
        if done:
            common.err.print(f"applied before the error: fleet {done}", highlight=False)
        raise
    finally:
        await client.close()
    if as_json:
        dumped = [info.model_dump(mode="json") for info in applied]
        common.print_json(dumped[0] if len(files) == 1 else dumped)
        return
    for info in applied:
        common.console.print(f"fleet [bold]{info.name}[/] applied")
        for warning in info.warnings:
            common.err.print(f"warning: {warning}", highlight=False, markup=False)
    common.console.print(fleets_table(applied, width=common.console.width))


@fleet_app.command("list")
@run
async def fleet_list(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """List fleets and their hosts."""
    from gpuflow.cli.render import fleets_table

    client = await common.open_client()
    try:
        with common.console.status("reading the fleets…"):
            fleets = await client.fleets()
    finally:
        await client.close()
    if as_json:
        common.print_json([fleet.model_dump(mode="json") for fleet in fleets])
    elif not fleets:
        common.console.print("no fleets (gpuflow fleet apply -f FILE adds one)")
    else:
        common.console.print(fleets_table(fleets, width=common.console.width))


@fleet_app.command("delete")
@run
async def fleet_delete(name: str = typer.Argument(..., help="Fleet name.")) -> None:
    """Delete a fleet that runs no job and that no waiting job needs (one naming no other)."""
    client = await common.open_client()
    try:
        await client.delete_fleet(name)
    finally:
        await client.close()
    common.console.print(f"fleet {name} deleted")
