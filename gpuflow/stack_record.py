"""The record an embedded stack (`gpuflow up`) keeps in its GPUFLOW_HOME while it serves, by
which commands run with that home reach that stack (config.py `TemporalConfig.from_env`) and
`gpuflow down` finds it."""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path

READY_FILE = "up.ready"
"""In GPUFLOW_HOME while its `gpuflow up` serves: that stack's StackRecord, as JSON."""


@dataclass(frozen=True)
class StackRecord:
    """What `gpuflow up` writes once it serves: commands run with its home reach that stack."""

    pid: int | None
    """The `gpuflow up` process; None in the record of an older gpuflow (its UI alone)."""
    ui: str
    """The Temporal UI's URL, or where a cluster's UI is."""
    temporal: str | None = None
    """HOST:PORT of its embedded dev server; None when it joined a cluster."""

    @property
    def serving(self) -> bool:
        """Whether its `gpuflow up` still runs: a killed one leaves its record behind."""
        return self.pid is not None and gpuflow_process(self.pid)


def write_stack_record(path: Path, record: StackRecord) -> None:
    """Whole or not at all: `gpuflow up -d` reads it the moment it appears."""
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text(json.dumps(dataclasses.asdict(record)))
    os.replace(partial, path)


def read_stack_record(home: Path) -> StackRecord | None:
    """The record in `home`'s up.ready; None without one. It may be stale (`serving`)."""
    try:
        text = (home / READY_FILE).read_text()
    except OSError:
        return None
    try:
        data = json.loads(text)
        return StackRecord(pid=int(data["pid"]), ui=str(data["ui"]), temporal=data["temporal"])
    except (ValueError, KeyError, TypeError):  # an older gpuflow's: the UI's URL alone
        return StackRecord(pid=None, ui=text.strip())


def gpuflow_process(pid: int) -> bool:
    """Whether `pid` is a live gpuflow process (not one the kernel reused it for since)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's: alive
    try:
        return b"gpuflow" in Path(f"/proc/{pid}/cmdline").read_bytes()  # a zombie's is empty
    except OSError:
        return True  # no /proc to tell by: alive is all that is known
