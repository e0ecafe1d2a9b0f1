"""Simulated GPUs of sim hosts: samples from a declared source, the job's process tree CPU
load or a constant, always marked simulated. Linux only for process_cpu (reads /proc)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from gpuflow.agent.gpus import SamplingError
from gpuflow.specs.fleet import SimulatedUtilization
from gpuflow.utilization import GpuSample, SampleBatch


class ProcessCpuSampler:
    """CPU load of a job's process tree, which stands in for GPU load on simulated hosts.

    The tree is the root process, its descendants, and, when the root leads its own session
    (the host agent starts jobs with a new session), every process of that session, so
    children that were reparented still count. Linux only (reads /proc).
    """

    def __init__(self, root_pid: int) -> None:
        self.root_pid = root_pid
        self.memory_used_mib = 0
        """Resident memory of the tree at the last reading."""
        self._ticks: dict[tuple[int, int], int] = {}
        self._at: float | None = None
        self._percent: float | None = None

    def cpu_percent(self) -> float | None:
        """Percent of one core the tree used between the scans of /proc of this call and the
        previous one (at most 100; the last figure again when both read the same scan). None
        on the first call, which only sets the baseline, or when the root process is gone."""
        found = _process_tree(self.root_pid)
        if found is None:
            self._at = self._percent = None
            return None
        at, tree = found
        if at == self._at:
            return self._percent
        ticks = {(pid, start): cpu for pid, start, cpu, _ in tree}
        self.memory_used_mib = sum(rss for *_, rss in tree) >> 20
        previous, previous_at = self._ticks, self._at
        self._ticks, self._at = ticks, at
        if previous_at is None or at < previous_at:
            self._percent = None
            return None
        # A process new to the tree started during the interval: all its time is in it.
        used = sum(max(0, cpu - previous.get(key, 0)) for key, cpu in ticks.items())
        seconds = used / _CLOCK_TICKS
        self._percent = min(100.0, 100.0 * seconds / (at - previous_at))
        return self._percent


class SimulatedSampler:
    """The GPUs of a simulated host for one job: every sample comes from `source` (the job's
    process tree CPU load, or a constant) and is marked simulated."""

    def __init__(
        self,
        *,
        source: SimulatedUtilization,
        root_pid: int | None = None,
        memory_total_mib: int = 0,
    ) -> None:
        if source.source == "process_cpu" and root_pid is None:
            raise ValueError("source process_cpu needs the job's root_pid")
        self.source = source
        self.memory_total_mib = memory_total_mib
        self._cpu = ProcessCpuSampler(root_pid) if root_pid is not None else None

    def sample(self, indices: list[int], now: float) -> SampleBatch:
        if self.source.source == "constant" or self._cpu is None:
            load, memory = self.source.value, 0
        else:
            reading = self._cpu.cpu_percent()
            if reading is None:  # baseline, or the job's process is gone: a gap, never idle
                return SampleBatch()
            load, memory = reading, min(self._cpu.memory_used_mib, self.memory_total_mib)
        return SampleBatch(
            samples=[
                GpuSample(
                    gpu=index,
                    ts=now,
                    utilization=load,
                    memory_used_mib=memory,
                    memory_total_mib=self.memory_total_mib,
                    simulated=True,
                )
                for index in indices
            ]
        )


# -- /proc plumbing ----------------------------------------------------------------------

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_PROC = Path("/proc")


SCAN_REUSE_S = 1.0
"""A scan of /proc serves every job sampled within this long after it. Each job's tree is found
by reading every process's stat (its session may hold reparented children), and a sim fleet's
jobs all run on this machine: without sharing, a round of samples read J x P files for J jobs
among P processes, which grew with the square of the jobs (benchmarks/sampler_cost.py
--simulated)."""
Stat = tuple[int, int, int, int, int]
"""(ppid, session, start time, CPU ticks, RSS bytes) of a process (`_read_stat`)."""


class _Scan:
    """Every process's stat as one scan of /proc read them, with who is whose child and who
    is in which session, for each job's tree to be found without another pass. `at` is by the
    monotonic clock: a load is CPU seconds over the seconds between two scans, which a step of
    the wall clock would stretch into a false idle reading (or shrink to nothing)."""

    def __init__(self, at: float, stats: dict[int, Stat]) -> None:
        self.at, self.stats = at, stats
        self.children: dict[int, list[int]] = {}
        self.sessions: dict[int, list[int]] = {}
        for pid, (ppid, session, *_) in stats.items():
            self.children.setdefault(ppid, []).append(pid)
            self.sessions.setdefault(session, []).append(pid)


_scanned: _Scan | None = None
_scanning = threading.Lock()


def _scan(root_pid: int) -> _Scan:
    """Every process's stat: the last scan while it is fresh (SCAN_REUSE_S) and knows the
    root (a job started since is not in it: only a new scan tells new from gone)."""
    global _scanned
    with _scanning:
        last = _scanned
        if (
            last is not None
            and root_pid in last.stats
            and time.monotonic() - last.at < SCAN_REUSE_S
        ):
            return last
        stats = {}
        for entry in os.listdir(_PROC):
            if entry.isdigit():
                stat = _read_stat(int(entry))
                if stat is not None:
                    stats[int(entry)] = stat
        _scanned = _Scan(time.monotonic(), stats)
        return _scanned


def _process_tree(root_pid: int) -> tuple[float, list[tuple[int, int, int, int]]] | None:
    """When /proc was read, and (pid, start time, CPU ticks, RSS bytes) of every process of
    the job then; None if the root is gone."""
    if not _PROC.is_dir():
        raise SamplingError("simulated utilization from process_cpu needs Linux (/proc)")
    scan = _scan(root_pid)
    stats = scan.stats
    root = stats.get(root_pid)
    if root is None:
        return None
    members = {root_pid}
    if root[1] == root_pid:  # it leads its session: reparented children still count
        members.update(scan.sessions.get(root_pid, ()))
    todo = list(members)
    while todo:
        for child in scan.children.get(todo.pop(), ()):
            if child not in members:
                members.add(child)
                todo.append(child)
    tree = [(pid, stats[pid][2], stats[pid][3], stats[pid][4]) for pid in sorted(members)]
    return scan.at, tree


def _read_stat(pid: int) -> Stat | None:
    """(ppid, session, start time, CPU ticks, RSS bytes) from /proc/<pid>/stat."""
    try:
        text = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None  # exited while we looked
    # The command name sits in parentheses and may itself hold spaces and parentheses.
    fields = text.rpartition(")")[2].split()
    try:
        return (
            int(fields[1]),
            int(fields[3]),
            int(fields[19]),
            int(fields[11]) + int(fields[12]),
            int(fields[21]) * _PAGE_SIZE,
        )
    except (IndexError, ValueError):
        return None
