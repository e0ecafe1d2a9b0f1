"""`gpuflow secret`: secrets jobs refer to, held by the control plane.

A value is sealed to the control plane's key before it leaves this machine, so Temporal (its
history, the UI) only ever carries ciphertext; see gpuflow/sealed.py.
"""

from __future__ import annotations

import sys

import typer

from gpuflow.cli import common
from gpuflow.errors import GpuflowError, NotFoundError

secret_app = typer.Typer(
    help="Secrets jobs refer to as ${{ secrets.NAME }}; held by the control plane, sent to it "
    "sealed (Temporal never sees a value).",
    no_args_is_help=True,
)


@secret_app.command("set")
@common.run
async def secret_set(name: str = typer.Argument(..., help="Secret name.")) -> None:
    """Store a secret (value from standard input, or asked for without echo)."""
    from gpuflow.secrets import MIN_MASKED_LENGTH

    if sys.stdin.isatty():
        value = typer.prompt(f"value of {name}", hide_input=True)
    else:
        value = sys.stdin.read().rstrip("\n")
    if not value:
        raise GpuflowError("empty value; nothing stored")
    client = await common.open_client()
    try:
        await client.set_secret(name, value)
    finally:
        await client.close()
    common.console.print(f"secret {name} stored by the control plane", highlight=False)
    if len(value) < MIN_MASKED_LENGTH:
        common.err.print(
            f"[yellow]warning:[/] values shorter than {MIN_MASKED_LENGTH} characters are not "
            "masked in job logs",
            soft_wrap=True,
        )


@secret_app.command("list")
@common.run
async def secret_list(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Names of the stored secrets (never their values)."""
    client = await common.open_client()
    try:
        names = await client.secrets()
    finally:
        await client.close()
    if as_json:
        common.print_json(names)
    else:
        common.console.print("\n".join(names) if names else "no secrets", highlight=False)


@secret_app.command("delete")
@common.run
async def secret_delete(
    name: str = typer.Argument(..., help="Secret name."),
    force: bool = typer.Option(
        False, "--force", help="Delete it even though schedules' jobs use it (their runs fail)."
    ),
) -> None:
    """Delete a secret that no schedule's job refers to."""
    client = await common.open_client()
    try:
        needing = await common.schedules_needing(client, secret=name) if force else []
        deleted = await client.delete_secret(name, force=force)
    finally:
        await client.close()
    if not deleted:
        raise NotFoundError(f"no secret named {name!r}")
    common.console.print(f"secret {name} deleted", highlight=False)
    common.warn_scheduled(f"secret {name}", needing, "it is set again")
