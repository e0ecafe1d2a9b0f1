"""Errors a user can cause. Each says what to change; the CLI prints the message, never a
traceback."""

from __future__ import annotations


class GpuflowError(Exception):
    """Base of every error gpuflow raises on purpose."""


MAX_MESSAGE = 400
"""Longest SpecError message: one line a person reads, whatever the input held."""


class SpecError(GpuflowError):
    """A job, fleet or profile file (or SDK object) is invalid. The message is one line of at
    most MAX_MESSAGE characters, however long or odd the refused input."""

    def __init__(self, message: str) -> None:
        line = " ".join(message.split())
        super().__init__(line if len(line) <= MAX_MESSAGE else line[: MAX_MESSAGE - 1] + "…")


class NotFoundError(GpuflowError):
    """A job, fleet or host that the user named does not exist."""


class InUseError(GpuflowError):
    """A queue or secret that gpuflow's schedules still name: deleting it would fail each of
    their later runs. `schedules` holds their ids."""

    def __init__(self, message: str, schedules: list[str]) -> None:
        super().__init__(message)
        self.schedules = schedules


class ConflictError(GpuflowError):
    """The request is well formed, but what it names is in a state that refuses it now (a job
    that has ended cannot be given a new priority): nothing to change in the request itself."""


class ConnectionFailed(GpuflowError):
    """Temporal or the database cannot be reached."""


class WaitTimeout(GpuflowError, TimeoutError):
    """A job did not end within the time a caller waited for it (it goes on: nothing was
    stopped)."""


class UnschedulableError(GpuflowError):
    """Nothing fits the job; `reasons` holds one line per host."""

    def __init__(self, message: str, reasons: list[str] | None = None) -> None:
        super().__init__(message)
        self.reasons = reasons or []
