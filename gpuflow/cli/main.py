"""The `gpuflow` command."""

from __future__ import annotations

import os
import sys

import typer

from gpuflow.cli import agent as _agent
from gpuflow.cli import common, describe, jobs
from gpuflow.cli.common import run
from gpuflow.cli.fleets import fleet_app
from gpuflow.cli.queues import queue_app, set_priority
from gpuflow.cli.schedules import schedule_app
from gpuflow.cli.secrets_cmd import secret_app
from gpuflow.errors import GpuflowError


def _flags_show_no_value() -> None:
    """Typer 0.29's --help writes a flag's type after it (`--json  <bool>`), as if it took a
    value; it takes none. Where Typer has that hook, a flag shows no type."""
    from typer.core import TyperOption

    shown = getattr(TyperOption, "display_type_rich", None)
    if shown is None or getattr(shown, "gpuflow", False):
        return

    def display_type_rich(self: TyperOption, ctx: object) -> str | None:
        return None if getattr(self, "is_flag", False) else shown(self, ctx)

    display_type_rich.gpuflow = True  # type: ignore[attr-defined]
    TyperOption.display_type_rich = display_type_rich  # type: ignore[method-assign]


_flags_show_no_value()

app = typer.Typer(
    name="gpuflow",
    help="GPU jobs as durable Temporal workflows.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",  # a docstring's wrapped lines read as one paragraph
)
app.add_typer(fleet_app, name="fleet")
app.add_typer(queue_app, name="queue")

# ---- stack ----------------------------------------------------------------------------------


@app.command()
def up(
    detach: bool = typer.Option(False, "--detach", "-d", help="Run in the background."),
) -> None:
    """Start the embedded stack: Temporal dev server, control worker, local host agent.

    Its state is in `GPUFLOW_HOME` (~/.gpuflow). It serves Temporal on 127.0.0.1 port
    `GPUFLOW_TEMPORAL_PORT` (7233), the Temporal UI on `GPUFLOW_UI_PORT` (that port + 1000)
    and metrics on `GPUFLOW_METRICS_ADDRESS` (127.0.0.1:9464; off turns them off).

    A second stack on one machine needs its own value of each. Commands run with its
    `GPUFLOW_HOME` reach it, unless `GPUFLOW_TEMPORAL_ADDRESS` or `GPUFLOW_TEMPORAL_PORT`
    is set."""
    from gpuflow.cli import stack

    try:
        if detach:
            stack.up_detached(common.console)
        else:
            stack.up_foreground(common.console)
    except GpuflowError as exc:
        common.err.print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None


@app.command()
@run
async def down(
    stop_jobs: bool = typer.Option(
        False, "--stop-jobs", "-y", help="Stop running jobs first, without asking."
    ),
    force: bool = typer.Option(
        False, "--force", help="Stop the stack and leave running jobs' processes running."
    ),
) -> None:
    """Stop the embedded stack started with `gpuflow up -d`. Running jobs are stopped first
    (asked, or -y), or left running with --force; never without saying so."""
    from gpuflow.cli import stack

    await stack.down(common.console, common.open_client, stop_jobs=stop_jobs, force=force)


app.command("agent", context_settings={"help_option_names": ["-h", "--help"]})(_agent.agent)

# ---- jobs, schedules, secrets (commands in their own modules) ------------------------------

app.command()(jobs.apply)
app.command()(jobs.ps)
app.command()(describe.describe)
app.command()(jobs.logs)
app.command()(jobs.stop)
# A negative priority is an argument to refuse with the range, not an unknown option.
app.command("set-priority", context_settings={"ignore_unknown_options": True})(set_priority)
app.command()(jobs.metrics)
app.command()(jobs.offers)
app.add_typer(schedule_app, name="schedule")
app.add_typer(secret_app, name="secret")


def main() -> None:
    """The `gpuflow` command. A finished command leaves without the interpreter's teardown:
    the Temporal client's Rust threads can abort a short-lived process there ("PyGILState_Release
    ... finalizing", temporalio/sdk-python#300), turning a command that printed its answer into
    exit code -6. Every command has released what it holds by the time `app` returns; gpuflow
    registers no exit handler."""
    try:
        app(prog_name="gpuflow")
    except SystemExit as exc:
        code = _exit_code(exc.code)
    else:
        code = 0
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


if __name__ == "__main__":
    main()
