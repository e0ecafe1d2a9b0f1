"""What one node of a job needs, read from a JobSpec once, with every default applied.

Filters and scorers read a `Request`, never the JobSpec: defaults (the backend that follows from
the GPU vendor, the count range, manual selection) are decided here and nowhere else, so the
automatic path, manual selection and the dry run cannot disagree about them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from itertools import count

from gpuflow.specs import JobSpec
from gpuflow.specs.resources import DEFAULT_BACKEND
from gpuflow.specs.units import readable_version

BACKEND_NAMES = {"cuda": "CUDA", "rocm": "ROCm", "metal": "Metal"}
VENDOR_NAMES = {"nvidia": "NVIDIA", "amd": "AMD", "apple": "Apple", "intel": "Intel"}


def effective_backend(backend: str | None, vendor: str | None) -> str | None:
    """The GPU runtime: the one named, else the vendor's (nvidia: cuda, amd: rocm, apple: metal).

    The one defaults function for hosts and jobs alike.
    """
    if backend:
        return backend.lower()
    return DEFAULT_BACKEND.get(vendor.lower()) if vendor else None


def version_tuple(text: str | None) -> tuple[int, ...] | None:
    """`535.104.05` -> (535, 104, 5), so versions compare numerically; None if unreadable (the
    one version grammar is specs.units.parse_version)."""
    return readable_version(text)


@dataclass(frozen=True, slots=True)
class Request:
    """Per-node needs of a job. Memory and disk in MiB; GPU memory is per GPU."""

    name: str
    nodes: int
    wants_gpu: bool
    gpu_min: int
    """Whole GPUs at least (0 for a fraction or a CPU-only job)."""
    gpu_max: int | None
    """Whole GPUs at most; None takes every free matching GPU."""
    fraction: float | None
    vendor: str | None
    names: frozenset[str]
    gpu_memory_min: int
    gpu_memory_max: int | None
    compute_capability: tuple[int, ...] | None
    compute_capability_text: str | None
    cpus: float
    memory_mib: int
    disk_mib: int
    os: str | None
    arch: str | None
    backend: str | None
    min_driver: tuple[int, ...] | None
    min_driver_text: str | None
    labels: tuple[tuple[str, str], ...]
    tolerations: frozenset[str]
    scorer: str | None
    selected_hosts: frozenset[str] | None
    """Manual selection: host names (including hosts of named GPUs); None selects nothing."""
    selected_gpus: tuple[tuple[str, frozenset[int]], ...]
    """Manual selection of exact GPUs: host name -> allowed indices."""
    key: int = -1
    """Equal for requests equal in everything a verdict depends on (all but the job's name);
    memo tables are keyed by it."""

    def identity(self) -> tuple[object, ...]:
        return (
            self.nodes,
            self.wants_gpu,
            self.gpu_min,
            self.gpu_max,
            self.fraction,
            self.vendor,
            self.names,
            self.gpu_memory_min,
            self.gpu_memory_max,
            self.compute_capability,
            self.cpus,
            self.memory_mib,
            self.disk_mib,
            self.os,
            self.arch,
            self.backend,
            self.min_driver,
            self.labels,
            self.tolerations,
            self.selected_hosts,
            self.selected_gpus,
        )

    def allowed_gpus(self, host_name: str) -> frozenset[int] | None:
        """GPU indices the user named on this host; None when any GPU may be used."""
        for name, indices in self.selected_gpus:
            if name == host_name:
                return indices
        return None

    def describe_gpu(self) -> str:
        """`1 GPU`, `4 GPUs`, `0.5 of a GPU`, `1..4 GPUs`: the job's ask in messages."""
        if self.fraction is not None:
            return f"{self.fraction:g} of a GPU"
        if self.gpu_max == self.gpu_min:
            return f"{self.gpu_min} GPU" + ("" if self.gpu_min == 1 else "s")
        top = "" if self.gpu_max is None else str(self.gpu_max)
        return f"{self.gpu_min}..{top} GPUs"


_KEYS: dict[tuple[object, ...], int] = {}
_RESOLVED: dict[int, tuple[JobSpec, Request]] = {}
_MAX_CACHED = 4096


def resolve(job: JobSpec) -> Request:
    """The one place a JobSpec becomes a Request (remembered per JobSpec object, which is
    immutable)."""
    cached = _RESOLVED.get(id(job))
    if cached is not None and cached[0] is job:
        return cached[1]
    request = _resolve(job)
    identity = request.identity()
    key = _KEYS.get(identity)
    if key is None:
        if len(_KEYS) >= 100 * _MAX_CACHED:
            _KEYS.clear()  # ids are never reused: a request seen again simply gets a new one
        key = _KEYS[identity] = next(_COUNTER)
    request = replace(request, key=key)
    if len(_RESOLVED) >= _MAX_CACHED:
        _RESOLVED.clear()
    _RESOLVED[id(job)] = (job, request)
    return request


_COUNTER = count()


def _resolve(job: JobSpec) -> Request:
    res = job.resources
    gpu = res.gpu if res.wants_gpu else None
    fraction = gpu.fraction if gpu is not None else None
    gpu_min: int = 0
    gpu_max: int | None = 0
    if gpu is not None and fraction is None:
        gpu_min = int(gpu.count.min)
        gpu_max = None if gpu.count.max is None else int(gpu.count.max)
    memory = gpu.memory if gpu is not None else None
    selected_hosts: frozenset[str] | None = None
    selected_gpus: dict[str, set[int]] = {}
    if job.placement is not None and (job.placement.hosts or job.placement.gpus):
        for item in job.placement.gpus:
            host, _, index = item.rpartition(":")
            selected_gpus.setdefault(host, set()).add(int(index))
        selected_hosts = frozenset(job.placement.hosts) | frozenset(selected_gpus)
    return Request(
        name=job.name,
        nodes=job.nodes,
        wants_gpu=gpu is not None,
        gpu_min=gpu_min,
        gpu_max=gpu_max,
        fraction=fraction,
        vendor=gpu.vendor if gpu is not None else None,
        names=frozenset(gpu.names) if gpu is not None else frozenset(),
        gpu_memory_min=int(memory.min) if memory is not None else 0,
        gpu_memory_max=int(memory.max) if memory is not None and memory.max is not None else None,
        compute_capability=version_tuple(gpu.compute_capability) if gpu is not None else None,
        compute_capability_text=gpu.compute_capability if gpu is not None else None,
        cpus=float(res.cpu.min),
        memory_mib=int(res.memory.min),
        disk_mib=int(res.disk.min),
        os=res.os.lower() if res.os else None,
        arch=res.arch.lower() if res.arch else None,
        backend=effective_backend(res.backend, gpu.vendor if gpu is not None else None),
        min_driver=version_tuple(res.min_driver),
        min_driver_text=res.min_driver,
        labels=tuple(sorted(job.labels.items())),
        tolerations=frozenset(job.tolerations),
        scorer=job.scorer,
        selected_hosts=selected_hosts,
        selected_gpus=tuple(
            sorted((host, frozenset(indices)) for host, indices in selected_gpus.items())
        ),
    )
