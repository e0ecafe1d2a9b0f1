"""The scheduler: the one place where fit is decided (docs/architecture.md, "Placement").

Pure functions over a snapshot of the fleets, without I/O or Temporal, used by the job
workflow's place step, manual selection, `gpuflow offers` and the dry run:

    place(job, snapshot, fleets=None) -> Placement | Unschedulable
    explain(job, snapshot, fleets=None) -> Offers
    apply_placement(snapshot, placement) / release_placement(snapshot, placement)
    plan_together(jobs, snapshot) -> [JobPlan]   (several jobs, each after the ones before it)
    admit(queues=, running=, waiting=, snapshot=, now=, reserved=) -> Decision   (one admission
        pass over the queues: who starts, who is preempted, why the others wait)
"""

from gpuflow.scheduler.admission import (
    Admitted,
    Decision,
    Held,
    Preemption,
    Reservation,
    Running,
    Waiting,
    admit,
)
from gpuflow.scheduler.blocks import blocks_busy
from gpuflow.scheduler.compat import compatibility
from gpuflow.scheduler.model import (
    FleetSnapshot,
    GpuSlot,
    HostSnapshot,
    NodePlacement,
    Placement,
    Rejection,
    Snapshot,
    TypicalRequest,
    Unschedulable,
)
from gpuflow.scheduler.offers import Offer, Offers
from gpuflow.scheduler.place import explain, place
from gpuflow.scheduler.request import Request, effective_backend, resolve
from gpuflow.scheduler.scorers import SCORER_NAMES
from gpuflow.scheduler.together import JobPlan, plan_together
from gpuflow.scheduler.usage import apply_placement, release_placement
from gpuflow.specs.scoring import DEFAULT_SCORER

offers = explain
"""Alias: what `gpuflow offers` calls."""

__all__ = [
    "DEFAULT_SCORER",
    "SCORER_NAMES",
    "Admitted",
    "Decision",
    "FleetSnapshot",
    "GpuSlot",
    "Held",
    "HostSnapshot",
    "JobPlan",
    "NodePlacement",
    "Offer",
    "Offers",
    "Placement",
    "Preemption",
    "Rejection",
    "Request",
    "Reservation",
    "Running",
    "Snapshot",
    "TypicalRequest",
    "Unschedulable",
    "Waiting",
    "admit",
    "apply_placement",
    "blocks_busy",
    "compatibility",
    "effective_backend",
    "explain",
    "offers",
    "place",
    "plan_together",
    "release_placement",
    "resolve",
]
