"""What the Temporal UI shows of a job: its search attributes and its current details. Pure: the
workflow decides when, this module decides what."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from temporalio.common import (
    SearchAttributeKey,
    SearchAttributePair,
    SearchAttributeUpdate,
    TypedSearchAttributes,
)

from gpuflow import utilization
from gpuflow.scheduler.model import Placement
from gpuflow.specs.job import JobSpec
from gpuflow.status import JobStatus

SA_STATUS = SearchAttributeKey.for_keyword("GpuflowStatus")
SA_FLEET = SearchAttributeKey.for_keyword("GpuflowFleet")
SA_GPU = SearchAttributeKey.for_keyword("GpuflowGpu")
SA_PRIORITY = SearchAttributeKey.for_int("GpuflowPriority")
SA_QUEUE = SearchAttributeKey.for_keyword("GpuflowQueue")
SEARCH_ATTRIBUTES: Mapping[str, str] = MappingProxyType(
    {
        "GpuflowStatus": "Keyword",
        "GpuflowFleet": "Keyword",
        "GpuflowGpu": "Keyword",
        "GpuflowPriority": "Int",
        "GpuflowQueue": "Keyword",
    }
)


def initial_search_attributes(spec: JobSpec) -> TypedSearchAttributes:
    """What a job's workflow starts with (the client sets them, so the UI lists the job as
    pending from its first moment, and the workflow needs no upsert of its own)."""
    return TypedSearchAttributes(
        [
            SearchAttributePair(SA_STATUS, JobStatus.PENDING.value),
            SearchAttributePair(SA_PRIORITY, spec.priority),
            SearchAttributePair(SA_QUEUE, spec.queue),
        ]
    )


def search_attribute_updates(
    status: JobStatus, placement: Placement | None = None, priority: int | None = None
) -> list[SearchAttributeUpdate[Any]]:
    updates: list[SearchAttributeUpdate[Any]] = [SA_STATUS.value_set(status.value)]
    if placement is not None:
        updates.append(SA_FLEET.value_set(placement.fleet))
        names = sorted({name for n in placement.nodes for name in n.gpu_names})
        if names:
            updates.append(SA_GPU.value_set(",".join(names)))
    if priority is not None:
        updates.append(SA_PRIORITY.value_set(priority))
    return updates


def details(
    *,
    status: JobStatus,
    attempt: int,
    message: str,
    placement: Placement | None,
    state: utilization.UtilizationState,
) -> str:
    """The job's current details (markdown) as the UI shows them on its page."""
    lines = [f"**status** {status.value} (attempt {attempt})"]
    if message:
        lines.append(message)
    if placement is not None:
        for node in placement.nodes:
            gpus = ",".join(str(i) for i in node.gpu_indices) or "none"
            sim = " (simulated)" if node.simulated else ""
            lines.append(f"node {node.rank}: {node.host_name} GPUs {gpus}{sim}")
    for gpu in utilization.summarize(state):
        sim = " simulated" if gpu.simulated else ""
        lines.append(
            f"node {gpu.node} GPU {gpu.gpu}: {gpu.utilization:.0f}%{sim} util, "
            f"{gpu.memory_used_mib}/{gpu.memory_total_mib} MiB"
        )
    return "\n\n".join(lines)
