"""What an admission pass (admission.py) reads and decides: the running and waiting jobs, and
its decision."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuflow.scheduler.model import Placement
from gpuflow.scheduler.quota import gpu_count
from gpuflow.scheduler.reservation import Reservation
from gpuflow.specs import JobSpec


@dataclass(frozen=True)
class Running:
    """A job that holds capacity (its placement is applied in the snapshot)."""

    name: str
    queue: str
    placement: Placement
    priority: int = 0
    preemptible: bool = False
    started_at: float = 0.0
    ends_at: float | None = None
    """Start + the job's max_duration, when it declares one; None: unknown."""

    @classmethod
    def admitted(cls, job: Waiting, placement: Placement, now: float) -> Running:
        """The waiting job admitted at `now` on `placement`."""
        duration = job.job.max_duration
        return cls(
            name=job.name,
            queue=job.queue,
            placement=placement,
            priority=job.priority,
            preemptible=job.preemptible,
            started_at=now,
            ends_at=None if duration is None else now + duration,
        )


@dataclass(frozen=True)
class Waiting:
    """A job waiting in a queue; `job` carries its resources, nodes and max_duration."""

    name: str
    queue: str
    job: JobSpec
    submitted_at: float
    priority: int = 0
    preemptible: bool = False
    options: tuple[JobSpec, ...] = ()
    """The job once per resource option, tried in order (JobSpec.resource_options); empty:
    `job` alone. Reservations and preemption plan for the first."""
    may_wait: bool = True
    """False: a pass that cannot admit it refuses it, so it reserves nothing (a reservation
    would hold the others back for a job that leaves)."""
    claims: bool = False
    """An earlier pass preempted running jobs for it: the room they free is its own, before any
    reservation (otherwise they would have been stopped for nothing)."""


@dataclass(frozen=True)
class Admitted:
    job: Waiting
    placement: Placement
    victims: tuple[str, ...] = ()
    """Running jobs preempted to make room for it (already released in the snapshot)."""
    backfill: bool = False
    """Admitted while a reservation for an earlier job stood."""


@dataclass(frozen=True)
class Preemption:
    victim: str
    for_job: str


@dataclass(frozen=True)
class Held:
    """A job left waiting: why (no_capacity, quota, reserved_for:<job> or
    quota_held_for:<job>) and its position in
    the order of this pass (0 first)."""

    job: Waiting
    reason: str
    position: int


@dataclass
class Decision:
    admitted: list[Admitted] = field(default_factory=list)
    """In the order they were decided (a victim is released just before its preemptor)."""
    preemptions: list[Preemption] = field(default_factory=list)
    waiting: list[Held] = field(default_factory=list)
    reservation: Reservation | None = None


def queue_order(job: Waiting) -> tuple[float, float, str]:
    """A queue's order: higher priority first, then earlier submission, then name."""
    return (-job.priority, job.submitted_at, job.name)


def victim_order(job: Running) -> tuple[float, int, float, str]:
    """Preferred victims first: fewest GPUs, lowest priority, most recently started."""
    return (gpu_count(job.placement), job.priority, -job.started_at, job.name)
