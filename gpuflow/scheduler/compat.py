"""Can this host run this kind of job at all? Runtime, vendor, OS, CPU arch, driver, CUDA CC.

`compatibility` is the one function that decides it, for every path. The first mismatch is the
one reported, in this order: backend runtime (CUDA/ROCm/Metal), GPU vendor, OS, CPU arch, minimum
driver, compute capability. Runtime comes first because it is what a user changes: a CUDA job on
a Mac reads "mac-1: needs CUDA, host has Metal" however it got there.

A host's stored versions (driver, compute capability) come from its agent or its fleet file; one
that cannot be read makes that host not fit a job that asks for a version, with a reason, and
never raises: one host's odd facts must not break placement on the others.
"""

from __future__ import annotations

from gpuflow.scheduler.model import HostSnapshot
from gpuflow.scheduler.request import BACKEND_NAMES, VENDOR_NAMES, Request, effective_backend
from gpuflow.specs.units import readable_version, shown

OS_NAMES = {"linux": "Linux", "macos": "macOS"}


def host_backend(host: HostSnapshot) -> str | None:
    """The host's GPU runtime, defaulted from its first GPU's vendor like a job's."""
    return effective_backend(host.backend, host.gpus[0].vendor if host.gpus else None)


def gpu_meets_capability(capability: str | None, request: Request) -> bool:
    if request.compute_capability is None:
        return True
    have = readable_version(capability)
    return have is not None and have >= request.compute_capability


def compatibility(host: HostSnapshot, request: Request) -> str | None:
    """None if the host can run the job's kind of work, else why not (without the host name)."""
    if request.backend is not None:
        backend = host_backend(host)
        if backend != request.backend:
            have = BACKEND_NAMES.get(backend, backend) if backend else "no GPU runtime"
            return f"needs {BACKEND_NAMES[request.backend]}, host has {have}"
    if request.vendor is not None:
        vendors = sorted({gpu.vendor for gpu in host.gpus})
        if request.vendor not in vendors:
            have = (
                " and ".join(VENDOR_NAMES.get(v, v) for v in vendors) + " GPUs"
                if vendors
                else "no GPUs"
            )
            return f"needs {VENDOR_NAMES[request.vendor]} GPUs, host has {have}"
    if request.os is not None and host.os != request.os:
        return f"needs {OS_NAMES.get(request.os, request.os)}, host runs {_os(host.os)}"
    if request.arch is not None and host.arch != request.arch:
        return f"needs {request.arch}, host is {host.arch}"
    if request.min_driver is not None:
        have_driver = readable_version(host.driver_version)
        if have_driver is None:
            state = "unreadable" if host.driver_version else "unknown"
            shown_driver = f" ({shown(host.driver_version)})" if host.driver_version else ""
            return (
                f"needs driver {request.min_driver_text} or newer, "
                f"host's driver is {state}{shown_driver}"
            )
        if have_driver < request.min_driver:
            driver = host.driver_version
            return f"needs driver {request.min_driver_text} or newer, host has {driver}"
    if (
        request.compute_capability is not None
        and request.wants_gpu
        and not any(gpu_meets_capability(g.compute_capability, request) for g in host.gpus)
    ):
        known = sorted({_text(g.compute_capability) for g in host.gpus if g.compute_capability})
        have = "host GPUs have " + ", ".join(known) if known else "host's is unknown"
        return f"needs compute capability {request.compute_capability_text} or higher, {have}"
    return None


def _text(version: str) -> str:
    """A stored version as a reason shows it: as is when readable, else quoted and shortened."""
    return version if readable_version(version) is not None else shown(version)


def _os(name: str) -> str:
    return OS_NAMES.get(name, name)
