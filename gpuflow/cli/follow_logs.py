"""The output of the jobs `gpuflow apply` follows, printed above its live table as the jobs
write it (node 0 of each; `gpuflow logs --node N` for the others), each line prefixed with the
job's name when several jobs are followed."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.text import Text
from temporalio.service import RPCError

from gpuflow.errors import GpuflowError

MOST_STREAMS = 8
"""Jobs whose output one `apply` prints at most (each has a log reader of its own): past that,
the status lines alone, and `gpuflow logs` for the output."""

DRAIN_S = 5.0
"""How long the streams of ended jobs are given to print what is left once every job ended."""


class JobOutput:
    """One stream per job that has started, up to MOST_STREAMS."""

    def __init__(self, console: Console, client: Any, *, prefixed: bool) -> None:
        self.console, self.client, self.prefixed = console, client, prefixed
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.skipped: list[str] = []

    def started(self, job_id: str, name: str) -> None:
        """The job runs (its processes have started): print its output from now on."""
        if job_id in self.tasks or name in self.skipped:
            return
        if len(self.tasks) >= MOST_STREAMS:
            self.skipped.append(name)
            return
        self.tasks[job_id] = asyncio.create_task(self._stream(job_id, name))

    async def finish(self) -> None:
        """Let the streams print the end of the output (they end with their jobs), then stop
        any that has not."""
        if self.tasks:
            await asyncio.wait(list(self.tasks.values()), timeout=DRAIN_S)
        for task in self.tasks.values():
            task.cancel()
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)
        if self.skipped:
            self.console.print(
                f"[dim]output not shown for {escape(', '.join(self.skipped))} (more than "
                f"{MOST_STREAMS} jobs): gpuflow logs NAME[/]",
                highlight=False,
            )

    async def _stream(self, job_id: str, name: str) -> None:
        partial = ""
        try:
            # aclosing: the log reader is deleted from Temporal however the stream ends.
            async with contextlib.aclosing(self.client.logs(job_id, follow=True)) as chunks:
                async for chunk in chunks:
                    partial += chunk
                    *lines, partial = partial.split("\n")
                    for line in lines:
                        self._print(name, line)
        except (GpuflowError, RPCError) as exc:  # its status lines still say how it went
            said = escape(f"{name}: output unavailable: {exc}")
            self.console.print(f"[dim]{said}[/]", highlight=False)
        if partial:
            self._print(name, partial)

    def _print(self, name: str, line: str) -> None:
        text = Text(f"{name} | ", style="dim") + Text(line) if self.prefixed else Text(line)
        self.console.print(text, highlight=False, soft_wrap=True)
