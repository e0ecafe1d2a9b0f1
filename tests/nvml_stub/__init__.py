"""A stub NVML library (nvml_stub.c) that nvidia-ml-py loads for real, and a handle to drive it.

`build_stub(dest_dir)` compiles it as `libnvidia-ml.so.1`; `NvmlStub` writes the state file the
library reads on every call (GPUs, utilization, driver, failures) and knows the environment a
subprocess needs to use it. The pytest fixture lives in `tests.nvml_stub.fixture`; the
monitoring benchmark builds the stub through this module too.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

SOURCE = Path(__file__).with_name("nvml_stub.c")
LIBRARY_NAME = "libnvidia-ml.so.1"
STATE_ENV = "GPUFLOW_NVML_STUB_STATE"
LIBRARY_ENV = "GPUFLOW_NVML_LIBRARY"  # read by gpuflow.agent.gpus

NOT_SUPPORTED = 3
DRIVER_NOT_LOADED = 9
GPU_IS_LOST = 15


class StubBuildError(RuntimeError):
    """The stub could not be compiled (no gcc, or a compiler error)."""


def build_stub(dest_dir: Path) -> Path:
    """Compile the stub into `dest_dir/libnvidia-ml.so.1` and return its path."""
    compiler = shutil.which(os.environ.get("CC", "gcc"))
    if compiler is None:
        raise StubBuildError("gcc is needed to build the NVML stub and was not found")
    dest_dir.mkdir(parents=True, exist_ok=True)
    target = dest_dir / LIBRARY_NAME
    command = [
        compiler, "-O2", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC",
        f"-Wl,-soname,{LIBRARY_NAME}", "-o", str(target), str(SOURCE),
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise StubBuildError(f"building the NVML stub failed:\n{result.stderr}")
    return target


@dataclass
class StubGpu:
    """One GPU as the stub reports it."""

    name: str = "NVIDIA H100 80GB HBM3"
    uuid: str = ""
    memory_total_mib: int = 81559
    memory_used_mib: int = 0
    utilization: int = 0
    memory_utilization: int = 0
    compute_capability: tuple[int, int] = (9, 0)
    error: int = 0
    """NVML return code every call on this GPU gives; 15 is NVML_ERROR_GPU_IS_LOST."""


@dataclass
class StubProcess:
    """A compute process on one GPU: its SM utilization and GPU memory, as NVML lists them."""

    gpu: int
    pid: int
    sm_utilization: int = 0
    memory_used_mib: int = 0


@dataclass
class NvmlStub:
    """What the stub library says, written to `state_file` on every change."""

    library: Path
    state_file: Path
    gpus: list[StubGpu] = field(default_factory=list)
    driver_version: str = "550.54.15"
    init_error: int = 0
    """NVML return code of nvmlInit; 9 is NVML_ERROR_DRIVER_NOT_LOADED."""
    processes: list[StubProcess] = field(default_factory=list)
    per_process_error: int = 0
    """NVML return code of the per-process calls; 3 is NVML_ERROR_NOT_SUPPORTED."""

    def set_gpus(
        self,
        count: int,
        *,
        name: str = "NVIDIA H100 80GB HBM3",
        memory_total_mib: int = 81559,
        compute_capability: tuple[int, int] = (9, 0),
    ) -> None:
        """`count` idle GPUs of one model, each with its own UUID."""
        self.gpus = [
            StubGpu(name=name, memory_total_mib=memory_total_mib,
                    compute_capability=compute_capability)
            for _ in range(count)
        ]  # fmt: skip
        self.write()

    def set_utilization(
        self, index: int, utilization: int, *, memory_used_mib: int | None = None
    ) -> None:
        self.gpus[index].utilization = utilization
        if memory_used_mib is not None:
            self.gpus[index].memory_used_mib = memory_used_mib
        self.write()

    def set_processes(self, *processes: StubProcess) -> None:
        """The compute processes NVML lists (and samples: one that uses no SMs has none)."""
        self.processes = list(processes)
        self.write()

    def lose_gpu(self, index: int, lost: bool = True) -> None:
        """GPU `index` answers every call with NVML_ERROR_GPU_IS_LOST (or recovers)."""
        self.gpus[index].error = GPU_IS_LOST if lost else 0
        self.write()

    def unload_driver(self, unloaded: bool = True) -> None:
        """nvmlInit fails with NVML_ERROR_DRIVER_NOT_LOADED (or works again)."""
        self.init_error = DRIVER_NOT_LOADED if unloaded else 0
        self.write()

    def write(self) -> None:
        lines = [f"driver\t{self.driver_version}", f"init_error\t{self.init_error}"]
        for index, gpu in enumerate(self.gpus):
            uuid = gpu.uuid or f"GPU-00000000-0000-0000-0000-{index:012d}"
            major, minor = gpu.compute_capability
            fields = [
                "gpu", gpu.name, uuid, gpu.memory_total_mib, gpu.memory_used_mib,
                gpu.utilization, gpu.memory_utilization, major, minor, gpu.error,
            ]  # fmt: skip
            lines.append("\t".join(str(f) for f in fields))
        for p in self.processes:
            fields = ["proc", p.gpu, p.pid, p.sm_utilization, p.memory_used_mib]
            lines.append("\t".join(str(f) for f in fields))
        lines.append(f"per_process\t{self.per_process_error}")
        # Replace atomically: the library may read the file at any moment.
        partial = self.state_file.with_suffix(".partial")
        partial.write_text("\n".join(lines) + "\n")
        partial.replace(self.state_file)

    def env(self) -> dict[str, str]:
        """Variables that point a subprocess (e.g. a host agent) at this stub."""
        return {LIBRARY_ENV: str(self.library), STATE_ENV: str(self.state_file)}

    def load(self) -> ctypes.CDLL:
        """Load the stub into this process, so that `dlopen("libnvidia-ml.so.1")` finds it."""
        return ctypes.CDLL(str(self.library), mode=ctypes.RTLD_GLOBAL)

    def init_calls(self) -> int:
        """How many times nvmlInit reached the stub in this process."""
        return int(self.load().gpuflow_stub_init_calls())
