"""What `gpuflow offers` and the dry run show: the hosts that fit (with their scores), the
rejections of those that do not, and the placement `place` would return."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from gpuflow.scheduler.fit import Option
from gpuflow.scheduler.index import HostView
from gpuflow.scheduler.model import Placement, Rejection, Unschedulable
from gpuflow.specs.units import format_size_mib

Scored = tuple[float, int, HostView, Option]
"""(score, host order, host, option): sorts best first after negating the score."""


class Offer(BaseModel):
    """A host that fits the job, with its score (higher is better)."""

    model_config = ConfigDict(frozen=True)

    host: str
    host_id: str
    fleet: str
    score: float
    gpus: str
    """What the node would get, e.g. `2x A100 80GB (0,1)`, `0.5 of T4 16GB (3)`, or ``."""
    gpu_indices: list[int] = Field(default_factory=list)
    gpu_fraction: float | None = None
    blocks: list[int] = Field(default_factory=list)
    cpus: float = 0
    memory_mib: int = 0


class Offers(BaseModel):
    """Everything `gpuflow offers` and the dry run show: what fits, what does not and why, and
    the placement `place` would return."""

    model_config = ConfigDict(frozen=True)

    fits: list[Offer]
    """Hosts that fit, best first within each fleet (fleets in the order they are tried)."""
    rejections: list[Rejection]
    placement: Placement | None = None
    fits_total: int | None = None
    """How many hosts fit, when `fits` holds only the first of them (`bounded`)."""
    rejections_total: int | None = None
    """How many hosts (and fleets) do not fit, when `rejections` is grouped by reason."""
    fits_idle: bool | None = None
    """For a job placed nowhere: whether it would place with every host of its fleets idle
    and ready (False: only a change of the fleets makes room); None when not asked."""
    queue_never: str | None = None
    """Why the job's queue could never admit it (quota.py `never_admitted`); None when it
    could, or when not asked."""
    waits: str | None = None
    """Why an admission pass run now would leave it waiting though a host fits (no_capacity,
    quota, reserved_for:<job> or quota_held_for:<job>; services/preview.py), when the caller
    looked."""
    ahead: int = 0
    """Jobs that would still wait ahead of it in its queue, when it would wait."""
    first: int = 0
    """Jobs waiting now that the pass would start instead, when it would wait."""
    preempts: list[str] = Field(default_factory=list)
    """The running jobs an admission pass run now would preempt to start it, when the caller
    looked; it would start on `starts` once they have stopped."""
    starts: Placement | None = None
    """Where that pass would start it, when it would preempt for it."""

    def verdict(self) -> Placement | Unschedulable:
        if self.placement is not None:
            return self.placement
        return Unschedulable(rejections=self.rejections)

    def bounded(self, most: int, *, fits: int | None = None) -> Offers:
        """At most `fits` (default `most`) hosts that fit and `most` lines of rejections,
        grouped by reason when there are more (`by_reason`); the totals say what was left out.
        A dry run's answer travels in one Temporal payload (2 MiB at most): on a fleet of
        thousands of hosts, every host of every option would not fit in it."""
        shown = most if fits is None else fits
        update: dict[str, object] = {}
        if len(self.fits) > shown:
            update.update(fits=self.fits[:shown], fits_total=len(self.fits))
        if len(self.rejections) > most:
            update.update(
                rejections=by_reason(self.rejections, most),
                rejections_total=sum(r.hosts for r in self.rejections),
            )
        return self.model_copy(update=update) if update else self


NAMED = 3
"""Hosts a line of rejections grouped by reason names; it counts the rest."""


def by_reason(rejections: list[Rejection], most: int | None = None) -> list[Rejection]:
    """One line per reason, in the order reasons first appear, naming the first NAMED hosts
    (`N hosts (a, b, c, ...): why`); past `most` lines, the last counts the rest."""
    groups: dict[str, list[Rejection]] = {}
    for rejection in rejections:
        groups.setdefault(rejection.reason, []).append(rejection)
    lines: list[Rejection] = []
    for reason, group in groups.items():
        if len(group) == 1:
            lines.append(group[0])
            continue
        names = [r.host for r in group if r.hosts == 1][:NAMED]
        hosts = sum(r.hosts for r in group)
        shown = ", ".join(names) + (", ..." if hosts > len(names) else "")
        lines.append(Rejection(host=shown, filter=group[0].filter, reason=reason, hosts=hosts))
    if most is not None and len(lines) > most:
        rest = lines[max(0, most - 1) :]
        other = f"{len(rest):,} other reasons"
        lines[max(0, most - 1) :] = [
            Rejection(host="", filter="", reason=other, hosts=sum(r.hosts for r in rest))
        ]
    return lines


def offer_of(scored: Scored) -> Offer:
    score, _, view, option = scored
    return Offer(
        host=view.host.name,
        host_id=view.host.id,
        fleet=view.fleet,
        score=round(score, 6),
        gpus=describe_gpus(view, option),
        gpu_indices=list(option.gpus),
        gpu_fraction=option.fraction,
        blocks=list(option.blocks),
        cpus=option.cpus,
        memory_mib=option.memory_mib,
    )


def describe_gpus(view: HostView, option: Option) -> str:
    if not option.gpus:
        return ""
    gpus = [view.host.gpus[i] for i in option.gpus]
    kinds = sorted({f"{g.name} {format_size_mib(g.memory_mib)}" for g in gpus})
    where = ",".join(str(i) for i in option.gpus)
    if option.fraction is not None:
        return f"{option.fraction:g} of {kinds[0]} ({where})"
    return f"{len(gpus)}x {' + '.join(kinds)} ({where})"
