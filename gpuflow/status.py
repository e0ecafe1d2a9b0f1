"""State machines shared by every layer: job status, termination reasons, host state.

Pure module (no I/O); workflows import it through pass-through imports.
"""

from __future__ import annotations

import re
from enum import StrEnum


class JobStatus(StrEnum):
    PENDING = "pending"
    PROVISIONING = "provisioning"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    TERMINATED = "terminated"
    STOPPED = "stopped"

    @property
    def is_final(self) -> bool:
        return self in _FINAL_STATUSES


_FINAL_STATUSES = frozenset(
    {JobStatus.DONE, JobStatus.FAILED, JobStatus.TERMINATED, JobStatus.STOPPED}
)


class RetryEvent(StrEnum):
    """What a retry policy can react to (`retry.on_events`)."""

    NO_CAPACITY = "no-capacity"
    INTERRUPTION = "interruption"
    ERROR = "error"


class TerminationReason(StrEnum):
    DONE = "done"
    PROCESS_FAILED = "process_failed"
    NO_CAPACITY = "no_capacity"
    HOST_LOST = "host_lost"
    GPU_UNDERUTILIZED = "gpu_underutilized"
    MAX_DURATION_EXCEEDED = "max_duration_exceeded"
    STOPPED_BY_USER = "stopped_by_user"
    PROVISIONING_FAILED = "provisioning_failed"
    START_FAILED = "start_failed"
    INTERNAL_ERROR = "internal_error"
    WORKFLOW_CLOSED = "workflow_closed"
    PREEMPTED = "preempted"

    @property
    def status(self) -> JobStatus:
        return _REASON_STATUS[self]

    @property
    def retry_event(self) -> RetryEvent | None:
        """The retry event this ending counts as; None means never retried."""
        return _REASON_RETRY_EVENT.get(self)

    @property
    def description(self) -> str:
        return _REASON_DESCRIPTION[self]


_REASON_STATUS = {
    TerminationReason.DONE: JobStatus.DONE,
    TerminationReason.PROCESS_FAILED: JobStatus.FAILED,
    TerminationReason.NO_CAPACITY: JobStatus.FAILED,
    TerminationReason.HOST_LOST: JobStatus.FAILED,
    TerminationReason.GPU_UNDERUTILIZED: JobStatus.TERMINATED,
    TerminationReason.MAX_DURATION_EXCEEDED: JobStatus.TERMINATED,
    TerminationReason.STOPPED_BY_USER: JobStatus.STOPPED,
    TerminationReason.PROVISIONING_FAILED: JobStatus.FAILED,
    TerminationReason.START_FAILED: JobStatus.FAILED,
    TerminationReason.INTERNAL_ERROR: JobStatus.FAILED,
    TerminationReason.WORKFLOW_CLOSED: JobStatus.TERMINATED,
    TerminationReason.PREEMPTED: JobStatus.TERMINATED,
}

_REASON_RETRY_EVENT = {
    TerminationReason.PROCESS_FAILED: RetryEvent.ERROR,
    TerminationReason.NO_CAPACITY: RetryEvent.NO_CAPACITY,
    TerminationReason.HOST_LOST: RetryEvent.INTERRUPTION,
    TerminationReason.PROVISIONING_FAILED: RetryEvent.INTERRUPTION,
    TerminationReason.PREEMPTED: RetryEvent.INTERRUPTION,
}

_REASON_DESCRIPTION = {
    TerminationReason.DONE: "all processes exited with code 0",
    TerminationReason.PROCESS_FAILED: "a process exited with a non-zero code",
    TerminationReason.NO_CAPACITY: "no host had capacity for the job",
    TerminationReason.HOST_LOST: "a host stopped answering",
    TerminationReason.GPU_UNDERUTILIZED: "a GPU stayed below the utilization policy",
    TerminationReason.MAX_DURATION_EXCEEDED: "the job ran longer than max_duration",
    TerminationReason.STOPPED_BY_USER: "stopped by the user",
    TerminationReason.PROVISIONING_FAILED: "a host could not be provisioned",
    TerminationReason.START_FAILED: (
        "the job could not be started (e.g. a missing secret, or its queue was deleted)"
    ),
    TerminationReason.INTERNAL_ERROR: "gpuflow hit an internal error",
    TerminationReason.WORKFLOW_CLOSED: "its workflow was closed outside gpuflow (e.g. terminated)",
    TerminationReason.PREEMPTED: "stopped to admit a job of higher priority or to return quota",
}


class HostState(StrEnum):
    PROVISIONING = "provisioning"
    READY = "ready"
    NOT_READY = "not_ready"
    UNREACHABLE = "unreachable"
    MAINTENANCE = "maintenance"


NO_GPUS = "-"
"""A job's GPUs (`JobInfo.gpus`, what `ps` shows) when its placement holds none: it asks for
no GPUs."""
NO_CAPACITY_PREFIX = "no capacity: "
"""How a job that found no capacity says why (its message, then `; `-separated reasons)."""
WAITING_PREFIX = "waiting for capacity: "
"""How a pending job waiting for capacity says why (the same reasons)."""
NEVER_ADMITTED = "can never admit it"
"""What a waiting job's reason says when its queue could not admit it even with its whole
cohort idle (`gpuflow ps` shows that reason in full)."""


def retrying(attempt: int, after: str, wait_s: int) -> str:
    """What a job says between attempts: `attempt 3: retrying after process_failed in 20 s`
    (without ` in …` when the next attempt starts at once)."""
    return f"attempt {attempt}: retrying after {after}" + (f" in {wait_s} s" if wait_s else "")


def waits_to_retry(message: str | None) -> bool:
    """Whether a pending job's message says it waits before its next attempt (`retrying`):
    it is in no line then."""
    return bool(message) and _RETRY_WAIT.fullmatch(message or "") is not None


_RETRY_WAIT = re.compile(r"attempt \d+: retrying after \S+ in \d+ s")


def capacity_prefix(message: str) -> str | None:
    """The no-capacity or waiting prefix the message starts with, if any."""
    return next((p for p in (NO_CAPACITY_PREFIX, WAITING_PREFIX) if message.startswith(p)), None)


def capacity_reasons(message: str) -> list[str]:
    """The per-host reasons a no-capacity or waiting message carries; [] for any other."""
    prefix = capacity_prefix(message)
    if prefix is None:
        return []
    return split_reasons(message.removeprefix(prefix))


def split_reasons(text: str) -> list[str]:
    """`a: x; b: y (p; q)` -> [`a: x`, `b: y (p; q)`]: reasons are joined with `; `, which a
    host's state detail in parentheses may hold too (`not ready (agent not answering; last
    heartbeat 6s ago)`): that one is not split."""
    parts: list[str] = []
    depth, start = 0, 0
    for i, char in enumerate(text):
        if char == "(":
            depth += 1
        elif char == ")":
            depth = max(0, depth - 1)
        elif char == ";" and depth == 0 and text.startswith("; ", i):
            parts.append(text[start:i])
            start = i + 2
    parts.append(text[start:])
    return [part.strip() for part in parts if part.strip()]
