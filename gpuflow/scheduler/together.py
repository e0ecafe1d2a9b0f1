"""Planning several jobs at once (`gpuflow apply -f a.yaml -f b.yaml`): each job is explained on
the snapshot less what the jobs before it would take, so a plan never promises two jobs the same
GPUs. Pure: the caller's snapshot is changed (the planned placements are applied to it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from gpuflow.scheduler.model import Placement, Snapshot
from gpuflow.scheduler.offers import Offers
from gpuflow.scheduler.place import explain, place
from gpuflow.scheduler.usage import apply_placement, release_placement
from gpuflow.specs import JobSpec
from gpuflow.status import HostState


@dataclass(frozen=True)
class JobPlan:
    """One job's dry run within a plan of several."""

    job: JobSpec
    options: list[Offers]
    """One entry per resource option (`resources`, then `alternatives`), in the order tried."""
    taken: int | None
    """Index into `options` of the option the job would run with; None when none places."""
    alone: Placement | None = None
    """What the job would get if the jobs before it did not exist, when that differs."""
    alone_fits: bool = False
    """Whether the job would place at all if the jobs before it did not exist."""
    fits_idle: bool = True
    """Whether the job would place on its fleets with nothing running and every host ready;
    False: no job's end or host's recovery can make room, only a change of the fleets."""
    queue_never: str | None = None
    """Why the job's queue could never admit it (quota.py `never_admitted`), when the caller
    looked (the control plane's plan does); None otherwise."""
    admitted: Placement | None = None
    """Where an admission pass would start it as it enters (services/preview.py), when the
    caller looked and the pass would."""
    preempts: list[str] = field(default_factory=list)
    """The running jobs an admission pass run now would preempt to start it (services/
    preview.py), when the caller looked."""
    waits: str | None = None
    """Why an admission pass run now would leave it waiting (no_capacity, quota,
    reserved_for:<job> or quota_held_for:<job>), when the caller looked; None: it would start
    (or preempt)."""
    ahead: int = 0
    """Jobs that would still wait ahead of it in its queue, when it would wait."""
    first: int = 0
    """Jobs waiting now that the pass would start instead, when it would wait."""

    @property
    def placement(self) -> Placement | None:
        return self.options[self.taken].placement if self.taken is not None else None

    @property
    def displaced(self) -> bool:
        """The jobs before it send it to other hosts, or leave it nowhere to go."""
        return self.alone_fits and _key(self.alone) != _key(self.placement)


def taken_index(options: list[Offers]) -> int | None:
    """The first option that places (a whole gang, for a multi-node job), as the job tries."""
    return next((k for k, offers in enumerate(options) if offers.placement is not None), None)


Outcome = tuple[Sequence[Placement], Sequence[Placement]]
"""What a job's entry changed: the placements admitted, the placements preempted."""


def plan_together(
    jobs: list[JobSpec], snapshot: Snapshot, outcomes: Sequence[Outcome] | None = None
) -> list[JobPlan]:
    """Each job's dry run, in the order given (the order they are submitted in), on `snapshot`
    less the placements planned for the jobs before it: by default each job's own; with
    `outcomes` (one per job: what an admission pass would do when it enters, services/
    preview.py), what those passes admitted and preempted."""
    alone = [[explain(option, snapshot) for option in job.resource_options()] for job in jobs]
    idle: Snapshot | None = None
    plans: list[JobPlan] = []
    taken_before = False
    for job, alone_options in zip(jobs, alone, strict=True):
        options = alone_options
        if taken_before:
            options = [explain(option, snapshot) for option in job.resource_options()]
        taken = taken_index(options)
        first_alone = taken_index(alone_options)
        alone_placement = alone_options[first_alone].placement if first_alone is not None else None
        fits_idle = True
        if alone_placement is None:
            idle = idle or idle_fleets(snapshot)
            fits_idle = fits_when_idle(job.resource_options(), idle)
        plan = JobPlan(
            job=job,
            options=options,
            taken=taken,
            alone=alone_placement,
            alone_fits=alone_placement is not None,
            fits_idle=fits_idle,
        )
        plans.append(plan)
        if outcomes is not None:
            took, freed = outcomes[len(plans) - 1]
            for placement in freed:
                release_placement(snapshot, placement)
            for placement in took:
                apply_placement(snapshot, placement)
            taken_before = taken_before or bool(took or freed)
        elif plan.placement is not None:
            apply_placement(snapshot, plan.placement)
            taken_before = True
    return plans


def fits_when_idle(options: list[JobSpec], idle: Snapshot) -> bool:
    """Whether one of the options places on `idle` (`idle_fleets`): False means no job's end
    and no host's return can make room for it, only a change of the fleets (what `apply`'s
    plan and `gpuflow offers` say of a job that fits nowhere now)."""
    return any(isinstance(place(option, idle), Placement) for option in options)


def idle_fleets(snapshot: Snapshot) -> Snapshot:
    """The snapshot's fleets with nothing allocated and every host ready: the most room they
    could ever offer without a change of the fleets themselves."""
    return Snapshot(
        fleets=[
            replace(
                fleet,
                hosts=[
                    replace(
                        host,
                        state=HostState.READY,
                        state_detail=None,
                        blocks_used=set(),
                        cpus_used=0.0,
                        memory_used_mib=0,
                        disk_used_mib=0,
                        gpus=[replace(gpu, used=0.0) for gpu in host.gpus],
                    )
                    for host in fleet.hosts
                ],
            )
            for fleet in snapshot.fleets
        ]
    )


def _key(placement: Placement | None) -> tuple[str, ...]:
    """The hosts a placement takes (other GPUs of the same hosts are no news to the user)."""
    return tuple(n.host_id for n in placement.nodes) if placement is not None else ()
