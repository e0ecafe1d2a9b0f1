"""Pydantic models of what users write: jobs, fleets, resources and policies."""

from gpuflow.specs.flags import JobFlags
from gpuflow.specs.fleet import SCORERS, FleetSpec, GpuDecl, HostDecl, SimulatedUtilization
from gpuflow.specs.job import JobSpec, RetrySpec, Selection, UtilizationPolicy
from gpuflow.specs.load import load_fleet, load_job, load_queue, merge_job, read_yaml
from gpuflow.specs.queue import QueueSpec
from gpuflow.specs.resources import GPUSpec, ResourcesSpec
from gpuflow.specs.units import Range, format_duration, parse_duration, parse_size_mib

__all__ = [
    "SCORERS",
    "FleetSpec",
    "GPUSpec",
    "GpuDecl",
    "HostDecl",
    "JobFlags",
    "JobSpec",
    "QueueSpec",
    "Range",
    "ResourcesSpec",
    "RetrySpec",
    "Selection",
    "SimulatedUtilization",
    "UtilizationPolicy",
    "format_duration",
    "load_fleet",
    "load_job",
    "load_queue",
    "merge_job",
    "parse_duration",
    "parse_size_mib",
    "read_yaml",
]
