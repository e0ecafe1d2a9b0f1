"""What every `gpuflow` command shares: the consoles, running an async command with one-line
errors, JSON output and connecting the client (tests replace these attributes)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import re
import signal
import sys
from collections.abc import Callable, Coroutine, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TextIO, TypeVar, cast

import typer
from rich.console import Console
from rich.markup import escape
from temporalio.service import RPCError

from gpuflow.errors import ConnectionFailed, GpuflowError, SpecError

if TYPE_CHECKING:
    from gpuflow.specs.job import JobSpec

_PADDING = re.compile(r" +((?:\x1b\[[0-9;]*m)*)(?=\n)")
"""Spaces that end a line, before the style codes that may close it."""


class _Trimmed:
    """A stream with no line ending in spaces: Rich pads every line of a table and its
    caption to the table's width, and leaves the space a line was wrapped at, so each line
    piped to a file, grepped or copied out of a terminal ended in spaces. On a terminal the
    output looks the same."""

    def __init__(self, stream: Callable[[], TextIO]) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        return self._stream().write(_PADDING.sub(r"\1", text))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream(), name)


def new_console(
    *, stderr: bool = False, width: int | None = None, file: TextIO | None = None
) -> Console:
    """A console of the CLI's, on `file` or else stdout or stderr, whichever is current when it
    writes (tests swap them); its lines end at their last character."""

    def stream() -> TextIO:
        return file or (sys.stderr if stderr else sys.stdout)

    return Console(file=cast(TextIO, _Trimmed(stream)), width=width)


console = new_console()
err = new_console(stderr=True)
T = TypeVar("T")


def run(coro_fn: Callable[..., Coroutine[Any, Any, T]]) -> Callable[..., T]:
    """Run an async command; a GpuflowError becomes one line on stderr and exit code 1."""

    @functools.wraps(coro_fn)
    def wrapper(*args: Any, **kwargs: Any) -> T:
        try:
            return asyncio.run(_ended_by_sigterm(coro_fn(*args, **kwargs)))
        except GpuflowError as exc:
            # The message may quote user input: print it as text, never as Rich markup.
            err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
            raise typer.Exit(1) from None
        except RPCError as exc:
            from gpuflow.cli.stack import temporal_lost

            # Temporal went away (or refused) after the connection was made.
            err.print(f"[bold red]error:[/] {temporal_lost(exc)}", highlight=False, soft_wrap=True)
            raise typer.Exit(1) from None
        except KeyboardInterrupt:
            err.print("interrupted")
            raise typer.Exit(130) from None
        except asyncio.CancelledError:  # SIGTERM: what the command started is cleaned up
            err.print("terminated")
            raise typer.Exit(143) from None

    return wrapper


async def _ended_by_sigterm(coro: Coroutine[Any, Any, T]) -> T:
    """Run `coro` with SIGTERM cancelling it, as Ctrl-C does, so that what it started (a
    `logs` reader workflow, a live display) is cleaned up when the command is killed."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    try:
        if task is not None:
            loop.add_signal_handler(signal.SIGTERM, task.cancel)
    except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, say
        pass
    try:
        return await coro
    finally:
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.remove_signal_handler(signal.SIGTERM)


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def quiet_temporal_runtime() -> None:
    """The command's Temporal runtime logs only errors: its client retries a call while
    Temporal is briefly away, and the SDK's warnings of each retry (in colour, in Rust's words)
    landed between a followed job's lines. What fails for good reaches the command as an error
    and is said in one line. (A command that serves, `gpuflow up`, keeps the default.)"""
    from temporalio.runtime import LoggingConfig, Runtime, TelemetryConfig, TelemetryFilter

    if _quiet:  # once a process: a runtime holds threads of its own
        return
    quiet = TelemetryFilter(core_level="ERROR", other_level="ERROR")
    runtime = Runtime(telemetry=TelemetryConfig(logging=LoggingConfig(filter=quiet)))
    Runtime.set_default(runtime, error_if_already_set=False)
    _quiet.append(runtime)


_quiet: list[object] = []


async def open_client() -> Any:
    from gpuflow.cli.stack import stack_address, stack_down_message
    from gpuflow.client import Client

    quiet_temporal_runtime()
    try:
        return await Client.connect()
    except ConnectionFailed as exc:
        # Against the embedded stack, the transport's own words only hide the likely cause.
        address = stack_address()
        if address is None or not str(exc).startswith("cannot reach Temporal"):
            raise
        raise ConnectionFailed(stack_down_message(address)) from None


class _Named(Protocol):
    @property
    def name(self) -> str: ...


S = TypeVar("S", bound=_Named)


def load_each(files: Sequence[Path], load: Callable[[Path], S], what: str) -> list[S]:
    """Every file's spec, all read and checked before any is applied (a bad file applies
    nothing); two files of one name are refused, as the second would undo the first."""
    from gpuflow.errors import SpecError
    from gpuflow.specs.safe_yaml import display_path

    specs, seen = [], dict[str, Path]()
    for path in files:
        spec = load(path)
        name = spec.name
        if name in seen:
            first = display_path(seen[name])
            raise SpecError(f"{display_path(path)}: {what} {name} is also in {first}")
        seen[name] = path
        specs.append(spec)
    return specs


@contextlib.contextmanager
def named_file(files: list[Path]) -> Iterator[None]:
    """The control plane's refusal of the one job file's job (an unknown fleet, a secret it
    lacks) names the file, as the file's own errors do."""
    from gpuflow.specs.safe_yaml import display_path

    try:
        yield
    except SpecError as exc:
        shown = display_path(files[0]) if len(files) == 1 else None
        if shown is None or str(exc).startswith(f"{shown}:"):
            raise
        raise SpecError(f"{shown}: {exc}") from None


async def schedules_needing(client: Any, **named: str) -> list[str]:
    """What `--force` warns of: the schedules that need the queue or secret it deletes (none
    when they cannot be read: said, and the delete goes on)."""
    try:
        needing: list[str] = await client.schedules_needing(**named)
    except GpuflowError as exc:
        err.print(f"warning: {escape(str(exc))}", highlight=False, soft_wrap=True)
        return []
    return needing


def warn_scheduled(what: str, schedules: list[str], until: str) -> None:
    """The warning on stderr after `--force` deleted a queue or secret that schedules need."""
    from gpuflow.client.schedules import needed_by

    if schedules:
        err.print(
            f"warning: {escape(needed_by(what, schedules))}; their runs fail until {until}",
            highlight=False,
            soft_wrap=True,
        )


def load_jobs(
    files: Sequence[Path],
    *,
    profile: str | None,
    fleet: list[str] | None,
    **overrides: Any,
) -> list[JobSpec]:
    """The job files as `apply`, `offers` and `schedule create` read them: the profile (or the
    one each file names), then their override flags (`--gpu`, `--fleet`, `--max-duration`,
    `-q`, `--priority`, and apply's utilization policy), each checked naming its flag."""
    from gpuflow.specs.flags import JobFlags
    from gpuflow.specs.load import load_job

    flags = JobFlags(fleets=tuple(fleet or ()), **overrides)
    return [load_job(path, profile=profile, flags=flags) for path in files]
