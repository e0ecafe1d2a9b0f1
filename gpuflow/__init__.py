"""gpuflow: GPU jobs as durable Temporal workflows.

    from gpuflow import Client, JobSpec
    client = await Client.connect()
    job = await client.submit(JobSpec(name="train", commands=["python train.py"]))

Names are loaded on first use, so that pure modules (specs, scheduler, utilization) can be
imported by workflow code without pulling in the database or Temporal client layers.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpuflow.client import (
        AppliedQueue,
        Client,
        FleetInfo,
        JobDescription,
        JobEvent,
        JobEvents,
        JobInfo,
        JobOutcome,
        JobPlan,
        Offers,
        OptionOffers,
        Progress,
        QueueInfo,
        StopOutcome,
        StopStep,
        UtilizationState,
    )
    from gpuflow.errors import (
        ConnectionFailed,
        GpuflowError,
        NotFoundError,
        SpecError,
        UnschedulableError,
        WaitTimeout,
    )
    from gpuflow.specs import (
        FleetSpec,
        JobSpec,
        QueueSpec,
        ResourcesSpec,
        RetrySpec,
        UtilizationPolicy,
    )
    from gpuflow.status import JobStatus, TerminationReason

__version__ = "0.1.0"

_EXPORTS = {
    "AppliedQueue": "gpuflow.client",
    "Client": "gpuflow.client",
    "FleetInfo": "gpuflow.client",
    "JobDescription": "gpuflow.client",
    "JobEvent": "gpuflow.client",
    "JobEvents": "gpuflow.client",
    "JobInfo": "gpuflow.client",
    "JobOutcome": "gpuflow.client",
    "JobPlan": "gpuflow.client",
    "Offers": "gpuflow.client",
    "OptionOffers": "gpuflow.client",
    "Progress": "gpuflow.client",
    "QueueInfo": "gpuflow.client",
    "StopOutcome": "gpuflow.client",
    "StopStep": "gpuflow.client",
    "UtilizationState": "gpuflow.client",
    "ConnectionFailed": "gpuflow.errors",
    "GpuflowError": "gpuflow.errors",
    "NotFoundError": "gpuflow.errors",
    "SpecError": "gpuflow.errors",
    "UnschedulableError": "gpuflow.errors",
    "WaitTimeout": "gpuflow.errors",
    "FleetSpec": "gpuflow.specs",
    "JobSpec": "gpuflow.specs",
    "QueueSpec": "gpuflow.specs",
    "ResourcesSpec": "gpuflow.specs",
    "RetrySpec": "gpuflow.specs",
    "UtilizationPolicy": "gpuflow.specs",
    "JobStatus": "gpuflow.status",
    "TerminationReason": "gpuflow.status",
}

__all__ = [
    "AppliedQueue",
    "Client",
    "ConnectionFailed",
    "FleetInfo",
    "FleetSpec",
    "GpuflowError",
    "JobDescription",
    "JobEvent",
    "JobEvents",
    "JobInfo",
    "JobOutcome",
    "JobPlan",
    "JobSpec",
    "JobStatus",
    "NotFoundError",
    "Offers",
    "OptionOffers",
    "Progress",
    "QueueInfo",
    "QueueSpec",
    "ResourcesSpec",
    "RetrySpec",
    "SpecError",
    "StopOutcome",
    "StopStep",
    "TerminationReason",
    "UnschedulableError",
    "UtilizationPolicy",
    "UtilizationState",
    "WaitTimeout",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'gpuflow' has no attribute {name!r}")
    return getattr(import_module(module), name)
