"""Collects what a host agent reports about its machine when it registers (OS, CPU, memory,
disk, GPUs)."""

from __future__ import annotations

import os
import platform
import shutil
from pathlib import Path

from gpuflow.agent.gpus import discover_gpus_with_reason
from gpuflow.workflows.models import GpuFact, HostFacts


def _memory_mib() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
    except OSError:
        pass
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1024 * 1024))
    except (ValueError, OSError):
        return 0


def collect_host_facts(work_dir: str | Path = "/") -> HostFacts:
    """Facts of this machine; GPUs through NVML (none when there is no NVIDIA driver)."""
    system = platform.system().lower()
    machine = platform.machine().lower()
    gpus, driver, reason = discover_gpus_with_reason()
    return HostFacts(
        os="macos" if system == "darwin" else system,
        arch="arm64" if machine in ("arm64", "aarch64") else machine,
        cpus=os.cpu_count() or 1,
        memory_mib=_memory_mib(),
        disk_mib=shutil.disk_usage(work_dir).free // (1024 * 1024),
        gpus=[GpuFact.model_validate(gpu.model_dump()) for gpu in gpus],
        backend="cuda" if gpus else None,
        driver_version=driver,
        gpu_error=reason,
    )
