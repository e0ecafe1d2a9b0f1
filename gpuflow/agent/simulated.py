"""Simulated GPUs of sim hosts: samples from a declared source, the job's process tree CPU
load or a constant, always marked simulated. Linux only for process_cpu (reads /proc)."""

from __future__ import annotations

import os
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

    def cpu_percent(self, now: float) -> float | None:
        """Percent of one core the tree used since the previous call (at most 100). None on
        the first call, which only sets the baseline, or when the root process is gone."""
        tree = _process_tree(self.root_pid)
        if tree is None:
            self._at = None
            return None
        ticks = {(pid, start): cpu for pid, start, cpu, _ in tree}
        self.memory_used_mib = sum(rss for *_, rss in tree) >> 20
        previous, previous_at = self._ticks, self._at
        self._ticks, self._at = ticks, now
        if previous_at is None or now <= previous_at:
            return None
        # A process new to the tree started during the interval: all its time is in it.
        used = sum(max(0, cpu - previous.get(key, 0)) for key, cpu in ticks.items())
        seconds = used / _CLOCK_TICKS
        return min(100.0, 100.0 * seconds / (now - previous_at))


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
            reading = self._cpu.cpu_percent(now)
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


def _process_tree(root_pid: int) -> list[tuple[int, int, int, int]] | None:
    """(pid, start time, CPU ticks, RSS bytes) of every process of the job; None if the root
    is gone."""
    if not _PROC.is_dir():
        raise SamplingError("simulated utilization from process_cpu needs Linux (/proc)")
    stats = {}
    for entry in os.listdir(_PROC):
        if entry.isdigit():
            stat = _read_stat(int(entry))
            if stat is not None:
                stats[int(entry)] = stat
    root = stats.get(root_pid)
    if root is None:
        return None
    leads_session = root[1] == root_pid
    children: dict[int, list[int]] = {}
    for pid, (ppid, *_) in stats.items():
        children.setdefault(ppid, []).append(pid)
    members = {pid for pid, stat in stats.items() if leads_session and stat[1] == root_pid}
    members.add(root_pid)
    todo = list(members)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in members:
                members.add(child)
                todo.append(child)
    return [(pid, stats[pid][2], stats[pid][3], stats[pid][4]) for pid in sorted(members)]


def _read_stat(pid: int) -> tuple[int, int, int, int, int] | None:
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
