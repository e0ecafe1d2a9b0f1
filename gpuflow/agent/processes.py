"""A host's view of a job's processes: the files of one run (job, attempt, rank), /proc, and
process groups. Used by the host agent's activities; Linux only, as the agent is."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


def proc_start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot; None if it is gone or a zombie."""
    stat = proc_stat(pid)
    return None if stat is None else int(stat[19])


def proc_stat(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name (state first); None if gone or a
    zombie."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2 :].split()
    return None if fields[0] in ("Z", "X") else fields


def write_private(path: Path, text: str) -> None:
    """Write a file only its owner can read, whatever the umask or a leftover's mode."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)


def group_alive(pgid: int) -> bool:
    """Whether any live process is still in the job's process group (the wrapper started it as
    a session and group leader, so children that ignore SIGTERM are found here too)."""
    if proc_stat(pgid) is not None:
        return True
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False  # no process at all in the group: no need to look through /proc
    except PermissionError:
        pass
    return any(True for _ in _members(pgid))


def group_pids(pgid: int) -> set[int]:
    """The live processes of the process group."""
    return set(_members(pgid))


def _members(pgid: int) -> Iterator[int]:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            stat = proc_stat(int(entry.name))
            if stat is not None and int(stat[2]) == pgid:
                yield int(entry.name)


@dataclass
class RunPaths:
    """Where one run (job, attempt, rank) keeps its script, log, state, masks and exit code."""

    root: Path

    @property
    def script(self) -> Path:
        return self.root / "job.sh"

    @property
    def log(self) -> Path:
        return self.root / "output.log"

    @property
    def state(self) -> Path:
        return self.root / "process.json"

    @property
    def masks(self) -> Path:
        """The secret values the run was given, recorded at its start to mask its log with."""
        return self.root / "masks.json"

    @property
    def exit_code(self) -> Path:
        return self.root / "exit_code"

    @property
    def stopped(self) -> Path:
        return self.root / "stopped"

    @property
    def claim(self) -> Path:
        return self.root / "claimed"

    @property
    def pid(self) -> Path:
        return self.root / "pid"


def signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass
    except PermissionError:
        os.kill(pid, sig)


def live_group(paths: RunPaths) -> int | None:
    """The run's process group id while any of its processes lives, else None. The pid comes
    from the run's state file, with its start time: a pid that now belongs to an unrelated
    process is not the run's."""
    try:
        state = json.loads(paths.state.read_text())
    except (OSError, ValueError):
        return None
    pgid = int(state["pid"])
    leader_start = proc_start_time(pgid)
    if leader_start is not None and leader_start != state.get("start_time"):
        return None  # the pid now belongs to an unrelated process
    return pgid if group_alive(pgid) else None
