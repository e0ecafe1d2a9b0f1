"""This host's GPUs: discovery and sampling through NVML (simulated GPUs: agent/simulated.py).

Used by the host agent (never by workflow code). pynvml is imported inside functions, so the
module (and `GpuInfo`) imports on machines without nvidia-ml-py or a driver. NVML failures
never escape as NVML exceptions: discovery says why there are no GPUs, sampling returns an
error for the GPU that failed and samples the rest, and a caller that names GPUs that are gone
gets an `NvmlError` that says which and why. A GPU shared by several jobs (GPU fractions) can be
read for one job's processes alone (`_own_usage`).

`GPUFLOW_NVML_LIBRARY=/path/to/libnvidia-ml.so.1` makes this process use that library instead
of the one the dynamic loader finds (tests point agents at a stub library with it).
"""

from __future__ import annotations

import ctypes
import os
import re
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager, suppress
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gpuflow.errors import GpuflowError
from gpuflow.utilization import SAMPLE_INTERVAL_S, GpuSample, GpuSampleError, SampleBatch

LIBRARY_ENV = "GPUFLOW_NVML_LIBRARY"

# NVML return codes gpuflow treats specially (nvml.h).
_NO_PERMISSION = 4
_DRIVER_NOT_LOADED = 9
_LIBRARY_NOT_FOUND = 12
_FUNCTION_NOT_FOUND = 13
_GPU_IS_LOST = 15
_RESET_REQUIRED = 16
_RM_VERSION_MISMATCH = 18
_UNINITIALIZED = 1
_INVALID_ARGUMENT = 2

_HOST_PROBLEMS = {
    _LIBRARY_NOT_FOUND: "libnvidia-ml.so.1 was not found: no NVIDIA driver is installed",
    _DRIVER_NOT_LOADED: "the NVIDIA driver is not loaded (check `nvidia-smi` and the nvidia "
    "kernel module)",
    _NO_PERMISSION: "no permission to talk to the NVIDIA driver (check /dev/nvidia* access)",
    _RM_VERSION_MISMATCH: "the NVIDIA driver and its NVML library have different versions "
    "(driver upgraded without a reboot?); reboot the host or reload the driver",
    _FUNCTION_NOT_FOUND: "the NVIDIA driver is too old for nvidia-ml-py; upgrade the driver",
}
_GPU_PROBLEMS = {
    _GPU_IS_LOST: "is lost (fell off the bus or stopped answering); the host needs a GPU "
    "reset or a reboot",
    _RESET_REQUIRED: "needs a reset (`nvidia-smi --gpu-reset`) or a reboot",
}
_REINIT = {_UNINITIALIZED, _DRIVER_NOT_LOADED, _LIBRARY_NOT_FOUND, _RM_VERSION_MISMATCH}


class SamplingError(GpuflowError):
    """GPUs (or a simulated source) could not be read on this host."""


class NvmlError(SamplingError):
    """NVML failed: no driver, no library, or a GPU that is gone. Says which and why."""

    def __init__(self, message: str, *, code: int | None = None, gpu: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        """NVML return code, when NVML gave one."""
        self.gpu = gpu
        """The GPU concerned; None for the whole host."""


class GpuInfo(BaseModel):
    """One GPU as NVML describes it; what a host agent registers."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    index: int
    """NVML index (what CUDA_VISIBLE_DEVICES takes with CUDA_DEVICE_ORDER=PCI_BUS_ID)."""
    uuid: str
    name: str
    """Upper-case model as jobs write it, e.g. `H100`, `A100`, `RTX4090`."""
    full_name: str
    """NVML's name, e.g. `NVIDIA H100 80GB HBM3`."""
    memory_mib: int
    driver_version: str
    compute_capability: str | None
    """CUDA compute capability `major.minor`; None when the driver does not say."""
    vendor: Literal["nvidia"] = "nvidia"


class GpuDiscovery(BaseModel):
    """The GPUs of this host, or why there are none."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gpus: list[GpuInfo]
    driver_version: str | None = None
    unavailable_reason: str | None = None
    """Why NVML could not be used (no driver, no library); None when it could."""
    unreadable: dict[int, str] = Field(default_factory=dict)
    """GPUs NVML counts but cannot describe (e.g. lost), left out of `gpus`: index -> why."""


_BRANDS = {"NVIDIA", "TESLA", "GEFORCE", "QUADRO"}
_NOISE = re.compile(r"^(\d+(\.\d+)?[GMT]B|PCIE|SXM\d*|HBM\d*E?|NVLINK|GENERATION|MIG.*)$")


def model_name(full_name: str) -> str:
    """The model as jobs name it: `NVIDIA H100 80GB HBM3` -> `H100`, `NVIDIA A100-SXM4-80GB`
    -> `A100`, `NVIDIA GeForce RTX 4090` -> `RTX4090`, `NVIDIA H100 NVL` -> `H100NVL`."""
    text = full_name.upper().replace("-", " ")
    tokens = [t for t in text.split() if t not in _BRANDS and not _NOISE.match(t)]
    return "".join(tokens) or full_name.strip().upper()


def inspect_gpus() -> GpuDiscovery:
    """Every GPU NVML sees; never raises: without NVML the reason is in the result."""
    try:
        with _nvml() as nvml:
            return _inspect(nvml)
    except NvmlError as exc:
        return GpuDiscovery(gpus=[], unavailable_reason=str(exc))


def discover_gpus(*, indices: list[int] | None = None) -> list[GpuInfo]:
    """This host's GPUs. Without `indices`: every GPU, or [] when NVML cannot be used (see
    `inspect_gpus` for why). With `indices`: exactly those, or NvmlError naming what is gone."""
    found = inspect_gpus()
    if indices is None:
        return found.gpus
    if found.unavailable_reason is not None:
        raise NvmlError(f"GPUs {_list(indices)} cannot be read: {found.unavailable_reason}")
    by_index = {gpu.index: gpu for gpu in found.gpus}
    for index in indices:
        if index in found.unreadable:
            raise NvmlError(found.unreadable[index], gpu=index)
        if index not in by_index:
            raise NvmlError(
                f"GPU {index} not found on this host (NVML sees "
                f"{len(found.gpus) + len(found.unreadable)} GPUs)",
                gpu=index,
            )
    return [by_index[i] for i in indices]


def discover_gpus_with_reason() -> tuple[list[GpuInfo], str | None, str | None]:
    """`(gpus, driver_version, unavailable_reason)`: `inspect_gpus` as a tuple."""
    found = inspect_gpus()
    return found.gpus, found.driver_version, found.unavailable_reason


class NvmlSampler:
    """Reads utilization and memory of this host's GPUs. Initialises NVML once and keeps the
    device handles; a GPU that fails is reported in the batch's errors (and its handle taken
    again next time) while the others are sampled. Not thread-safe: one caller at a time."""

    def __init__(self) -> None:
        self._nvml: Any = None
        self._handles: dict[int, Any] = {}

    def sample(
        self, indices: list[int], now: float, own: Mapping[int, Collection[int]] | None = None
    ) -> SampleBatch:
        """One reading of each GPU in `indices`, stamped `now` (epoch seconds). For a GPU in
        `own` (one a job shares with others), the reading is that of the processes named there,
        not the whole GPU's (`_own_usage`), where NVML can tell them apart."""
        try:
            nvml = self._session()
        except NvmlError as exc:
            message = f"GPU sampling failed: {exc}"
            return SampleBatch(
                errors=[GpuSampleError(gpu=i, message=message, code=exc.code) for i in indices]
            )
        samples, errors = [], []
        for position, index in enumerate(indices):
            try:
                handle = self._handles.get(index)
                if handle is None:
                    handle = self._handles[index] = nvml.nvmlDeviceGetHandleByIndex(index)
                rates = nvml.nvmlDeviceGetUtilizationRates(handle)
                memory = nvml.nvmlDeviceGetMemoryInfo(handle)
                utilization, used = float(min(rates.gpu, 100)), int(memory.used) >> 20
                pids = None if own is None else own.get(index)
                mine = None if pids is None else _own_usage(nvml, handle, pids, now)
                if mine is not None:
                    utilization, used = mine
            except nvml.NVMLError as exc:
                self._handles.pop(index, None)
                code = int(exc.value)
                if code in _REINIT:
                    # The driver failed, not this GPU: the rest fail alike; start over next time.
                    self.close()
                    message = f"GPU sampling failed: {_explain(exc)}"
                    errors += [
                        GpuSampleError(gpu=i, message=message, code=code)
                        for i in indices[position:]
                    ]
                    break
                message = _explain(exc, gpu=index)
                errors.append(GpuSampleError(gpu=index, message=message, code=code))
                continue
            samples.append(
                GpuSample(
                    gpu=index,
                    ts=now,
                    utilization=utilization,
                    memory_used_mib=used,
                    memory_total_mib=int(memory.total) >> 20,
                )
            )
        return SampleBatch(samples=samples, errors=errors)

    def close(self) -> None:
        """Shut NVML down; the next `sample` initialises it again."""
        nvml, self._nvml = self._nvml, None
        self._handles.clear()
        if nvml is not None:
            with suppress(nvml.NVMLError):  # the driver went away already
                nvml.nvmlShutdown()

    def _session(self) -> Any:
        if self._nvml is None:
            nvml = _load()
            try:
                nvml.nvmlInit()
            except nvml.NVMLError as exc:
                raise NvmlError(_explain(exc), code=int(exc.value)) from None
            self._nvml = nvml
        return self._nvml


PROCESS_WINDOW_S = SAMPLE_INTERVAL_S
"""How far back a shared GPU's per-process samples are read: one interval of the agent's own
sampling (NVML keeps a few seconds of them)."""
_NOT_FOUND = 6


def _own_usage(
    nvml: Any, handle: Any, pids: Collection[int], now: float
) -> tuple[float, int] | None:
    """SM utilization (%) and GPU memory (MiB) of `pids` on the GPU, from NVML's per-process
    readings: each process's mean SM utilization over its samples of the last
    `PROCESS_WINDOW_S` (a process that used no SMs has none: 0), summed. None when NVML cannot
    tell (no per-process readings on this GPU or driver; or a PID namespace apart, when a
    process NVML lists is not in this host's /proc): the whole GPU's reading stands then."""
    try:
        running = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
    except nvml.NVMLError:
        return None
    if not all(os.path.exists(f"/proc/{int(process.pid)}") for process in running):
        return None  # not this host's processes (or one just ended: this reading only)
    memory = sum(int(p.usedGpuMemory or 0) for p in running if int(p.pid) in pids)
    try:
        samples = nvml.nvmlDeviceGetProcessUtilization(
            handle, max(0, int((now - PROCESS_WINDOW_S) * 1_000_000))
        )
    except nvml.NVMLError as exc:
        if int(exc.value) != _NOT_FOUND:  # NOT_FOUND: no process used the SMs lately
            return None
        samples = []
    busy: dict[int, list[int]] = {}
    for sample in samples:
        if int(sample.pid) in pids:
            busy.setdefault(int(sample.pid), []).append(int(sample.smUtil))
    utilization = sum(sum(values) / len(values) for values in busy.values())
    return float(min(utilization, 100)), memory >> 20


# -- NVML plumbing -----------------------------------------------------------------------


def _load() -> Any:
    """pynvml, bound to the library GPUFLOW_NVML_LIBRARY names when it is set."""
    try:
        import pynvml
    except ImportError as exc:
        raise NvmlError(f"nvidia-ml-py is not installed ({exc})") from None
    path = os.environ.get(LIBRARY_ENV)
    if path:
        try:
            # RTLD_GLOBAL with the soname libnvidia-ml.so.1: pynvml's own dlopen finds it too.
            library = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        except OSError as exc:
            raise NvmlError(f"{LIBRARY_ENV}={path} cannot be loaded: {exc}") from None
        with pynvml.libLoadLock:
            current = pynvml.nvmlLib
            if current is None or getattr(current, "_name", None) != library._name:
                pynvml.nvmlLib = library
                # pynvml caches function pointers of the library it loaded first.
                getattr(pynvml, "_nvmlGetFunctionPointer_cache", {}).clear()
    return pynvml


@contextmanager
def _nvml() -> Iterator[Any]:
    nvml = _load()
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        raise NvmlError(_explain(exc), code=int(exc.value)) from None
    try:
        yield nvml
    finally:
        with suppress(nvml.NVMLError):  # the driver went away already
            nvml.nvmlShutdown()


def _inspect(nvml: Any) -> GpuDiscovery:
    try:
        driver = _text(nvml.nvmlSystemGetDriverVersion())
        count = int(nvml.nvmlDeviceGetCount())
    except nvml.NVMLError as exc:
        return GpuDiscovery(gpus=[], unavailable_reason=_explain(exc))
    gpus, unreadable = [], {}
    for index in range(count):
        try:
            gpus.append(_describe(nvml, index, driver))
        except nvml.NVMLError as exc:
            unreadable[index] = _explain(exc, gpu=index)
    return GpuDiscovery(gpus=gpus, driver_version=driver, unreadable=unreadable)


def _describe(nvml: Any, index: int, driver: str) -> GpuInfo:
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    full_name = _text(nvml.nvmlDeviceGetName(handle))
    try:
        major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
        capability: str | None = f"{major}.{minor}"
    except nvml.NVMLError:
        capability = None
    return GpuInfo(
        index=index,
        uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
        name=model_name(full_name),
        full_name=full_name,
        memory_mib=int(nvml.nvmlDeviceGetMemoryInfo(handle).total) >> 20,
        driver_version=driver,
        compute_capability=capability,
    )


def _explain(exc: Any, *, gpu: int | None = None) -> str:
    """A sentence for an NVMLError: what is wrong, and what to do about it."""
    code = int(getattr(exc, "value", -1))
    nvml_text = f"NVML: {exc}"
    if gpu is not None and code in _GPU_PROBLEMS:
        return f"GPU {gpu} {_GPU_PROBLEMS[code]} ({nvml_text})"
    if gpu is not None and code == _INVALID_ARGUMENT:
        return f"GPU {gpu} does not exist on this host ({nvml_text})"
    problem = _HOST_PROBLEMS.get(code, nvml_text)
    text = problem if problem == nvml_text else f"{problem} ({nvml_text})"
    return text if gpu is None else f"GPU {gpu} cannot be read: {text}"


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _list(indices: list[int]) -> str:
    return ", ".join(str(i) for i in indices)
