"""`place` and `explain`: one decision over a snapshot, for the workflow's place step, manual
selection, `gpuflow offers` and the dry run. Both run `_decide`, so they cannot disagree.

Fleets are tried in order (the `fleets` argument, else the job's `fleets`, else every fleet in
snapshot order); within a fleet, the fleet's scorer (or the job's) picks the best host, ties going
to the host listed first. The first fleet that can take the job wins.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field

from gpuflow.scheduler.filters import (
    GANG,
    Context,
    by_resources,
    select_fleets,
    static_filters,
    unknown_selected_hosts,
)
from gpuflow.scheduler.fit import Option
from gpuflow.scheduler.gangs import choose_gang, gang_shortfall
from gpuflow.scheduler.index import EPSILON, HostView, SnapshotIndex, index_of, is_ready
from gpuflow.scheduler.model import (
    FleetSnapshot,
    NodePlacement,
    Placement,
    Rejection,
    Snapshot,
    Unschedulable,
)
from gpuflow.scheduler.request import Request, resolve
from gpuflow.scheduler.scorers import Scoring, scoring_for
from gpuflow.specs import JobSpec
from gpuflow.specs.units import format_size_mib


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

    def verdict(self) -> Placement | Unschedulable:
        if self.placement is not None:
            return self.placement
        return Unschedulable(rejections=self.rejections)


Scored = tuple[float, int, HostView, Option]
"""(score, host order, host, option): sorts best first after negating the score."""


@dataclass
class _Fleet:
    fits: list[Scored] = field(default_factory=list)
    chosen: list[Scored] | None = None
    rejections: list[Rejection] = field(default_factory=list)


def place(
    job: JobSpec, snapshot: Snapshot, *, fleets: list[str] | None = None
) -> Placement | Unschedulable:
    """Where the job goes, or why it cannot go anywhere. Pure: reads the snapshot only."""
    placement, rejections, _ = _decide(job, snapshot, fleets, explain=False)
    if placement is not None:
        return placement
    return Unschedulable(rejections=rejections)


def explain(job: JobSpec, snapshot: Snapshot, *, fleets: list[str] | None = None) -> Offers:
    """Every host that fits with its score, every host that does not with its reason."""
    placement, rejections, fits = _decide(job, snapshot, fleets, explain=True)
    return Offers(fits=fits, rejections=rejections, placement=placement)


def _decide(
    job: JobSpec, snapshot: Snapshot, fleets: list[str] | None, *, explain: bool
) -> tuple[Placement | None, list[Rejection], list[Offer]]:
    request = resolve(job)
    index = index_of(snapshot)
    for attempt in range(3):
        candidates, rejections = select_fleets(index, job.fleets if fleets is None else fleets)
        rejections.extend(unknown_selected_hosts(index, request, candidates))
        offers: list[Offer] = []
        placement: Placement | None = None
        for fleet in candidates:
            scoring = scoring_for(index, fleet, request.scorer, request.name)
            result = _decide_fleet(request, index, fleet, scoring, explain=explain)
            if explain:
                offers.extend(_offer(scored) for scored in result.fits)
            if result.chosen is not None and placement is None:
                placement = _placement(fleet, result.chosen, scoring.name)
                if not _still_true(index, result.chosen):
                    break
                if not explain:
                    return placement, [], []
            if explain or placement is None:
                rejections.extend(result.rejections)
        else:
            # Host states are read in full before any "nothing fits" is believed.
            if placement is None and attempt == 0 and index.states_changed():
                continue
            return placement, rejections, offers
        # A chosen host changed state, or its usage was edited by hand: read everything again.
        index.states_changed()
        index.refresh_all()
    raise RuntimeError("the snapshot keeps changing while it is being placed on")


def _still_true(index: SnapshotIndex, chosen: list[Scored]) -> bool:
    """The chosen hosts are ready and their usage is what the index read."""
    return all(is_ready(s[2].host) and index.is_current(s[2]) for s in chosen)


def _decide_fleet(
    request: Request, index: SnapshotIndex, fleet: FleetSnapshot, scoring: Scoring, *,
    explain: bool,
) -> _Fleet:
    ctx = Context(request, index, fleet, explain)
    hosts, static_rejections = static_filters(index.fleet_hosts[fleet.name], ctx)
    keep_all = explain or request.nodes > 1
    candidates = hosts if keep_all else _contenders(hosts, ctx, per_host=scoring.per_host)
    survivors, dropped = by_resources(candidates, ctx)
    best, ranked = _score(survivors, ctx.options, scoring, request, index, keep_all=keep_all)
    result = _Fleet(fits=ranked)
    if request.nodes > 1:
        result.chosen = choose_gang(ranked, request.nodes)
    elif best is not None:
        result.chosen = [best]
    if result.chosen is None or explain:
        if not explain:  # the fast pass words no reasons; word them now
            ctx.explain = True
            _, dropped = by_resources(hosts, ctx)
        result.rejections = [*static_rejections, *dropped]
        if result.chosen is None and request.nodes > 1 and survivors:
            reason = gang_shortfall(len(survivors), request.nodes)
            result.rejections.append(index.rejection(f"fleet {fleet.name}", GANG, reason))
    return result


def _contenders(hosts: list[HostView], ctx: Context, *, per_host: bool) -> list[HostView]:
    """The hosts that can win, for the fast path: those of states that have room for this kind
    of request and, of hosts alike in class and usage, only the first (ties go to it anyway).

    Hosts left out would fit no better than one kept, so the verdict is the one the full list
    gives; when nothing fits, the caller runs the filters over every host to word the reasons.
    """
    request, index = ctx.request, ctx.index
    if request.selected_hosts is not None or len(hosts) < 64:
        return hosts
    pools = index.pools[ctx.fleet.name]
    if request.fraction is not None:
        groups = pools.with_share(request.fraction)
    elif request.wants_gpu and request.gpu_min > 0:
        groups = pools.with_whole(request.gpu_min)
    else:
        groups = pools.with_cpus(request.cpus)
    admitted = static_orders(index, ctx.fleet.name, hosts)
    members = index.members
    if admitted is None and not per_host:
        return [members[state_id][0] for group in groups for state_id in group]
    chosen: list[HostView] = []
    for state_id in (state_id for group in groups for state_id in group):
        for view in members[state_id]:
            if admitted is None or view.order in admitted:
                chosen.append(view)
                if not per_host:
                    break
    return chosen


def static_orders(index: SnapshotIndex, fleet: str, hosts: list[HostView]) -> set[int] | None:
    """Orders of the hosts that passed the static filters; None when all of the fleet did."""
    if len(hosts) == len(index.fleet_hosts[fleet]):
        return None
    key = ("orders", id(hosts))
    found = index.fit_memo.get(key)
    if found is None or found.get(-1) is not hosts:
        found = index.fit_memo[key] = {-1: hosts, 0: {view.order for view in hosts}}
    orders: set[int] = found[0]
    return orders


def _score(
    survivors: list[HostView],
    options: list[tuple[Option, ...]],
    scoring: Scoring,
    request: Request,
    index: SnapshotIndex,
    *,
    keep_all: bool,
) -> tuple[Scored | None, list[Scored]]:
    memo: dict[int, tuple[float, Option]] | None = None
    if not scoring.per_host and not request.selected_gpus:
        weights = tuple(sorted(scoring.weights.items()))
        key = ("score", scoring.name, weights, id(scoring.workload), request.key)
        memo = index.fit_memo.get(key)
        if memo is None:
            memo = index.fit_memo[key] = {}
    best: Scored | None = None
    ranked: list[Scored] = []
    for view, choices in zip(survivors, options, strict=True):
        found = memo.get(view.state_id) if memo is not None else None
        if found is None:
            top_score, top = -float("inf"), choices[0]
            for option in choices:
                value = scoring.score(view, option)
                if value > top_score:
                    top_score, top = value, option
            found = (top_score, top)
            if memo is not None:
                memo[view.state_id] = found
        score, option = found
        if best is None or score > best[0] or (score == best[0] and view.order < best[1]):
            best = (score, view.order, view, option)
        if keep_all:
            ranked.append((score, view.order, view, option))
    ranked.sort(key=lambda item: (-item[0], item[1]))
    return best, ranked


def _placement(fleet: FleetSnapshot, chosen: list[Scored], scorer: str) -> Placement:
    nodes = [
        NodePlacement(
            rank=rank,
            host_id=view.host.id,
            host_name=view.host.name,
            fleet=fleet.name,
            task_queue=view.host.task_queue,
            address=view.host.address,
            gpu_indices=list(option.gpus),
            gpu_names=[view.host.gpus[i].name for i in option.gpus],
            gpu_fraction=option.fraction,
            blocks=list(option.blocks),
            cpus=option.cpus,
            memory_mib=option.memory_mib,
            disk_mib=option.disk_mib,
            simulated=view.host.simulated,
        )
        for rank, (_, _, view, option) in enumerate(chosen)
    ]
    return Placement(
        fleet=fleet.name, nodes=nodes, score=sum(s[0] for s in chosen), scorer=scorer
    )


def _offer(scored: Scored) -> Offer:
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


def apply_placement(snapshot: Snapshot, placement: Placement) -> None:
    """Mark the placement's GPUs, shares, blocks, CPU, memory and disk as used.

    All or nothing: raises ValueError (and changes nothing) if any part is no longer free.
    """
    index = index_of(snapshot)
    views = [_view(index, node) for node in placement.nodes]
    for view, node in zip(views, placement.nodes, strict=True):
        problem = _conflict(view, node)
        if problem:
            raise ValueError(f"cannot apply placement on {view.host.name}: {problem}")
    for view, node in zip(views, placement.nodes, strict=True):
        host = view.host
        for i in node.gpu_indices:
            gpu = host.gpus[i]
            gpu.used = round(gpu.used + node.gpu_fraction, 9) if node.gpu_fraction else 1.0
        host.blocks_used.update(node.blocks)
        host.cpus_used = round(host.cpus_used + node.cpus, 9)
        host.memory_used_mib += node.memory_mib
        host.disk_used_mib += node.disk_mib
        index.refresh(view)


def release_placement(snapshot: Snapshot, placement: Placement) -> None:
    """Give back what `apply_placement` took (never below zero)."""
    index = index_of(snapshot)
    for node in placement.nodes:
        view = _view(index, node)
        host = view.host
        for i in node.gpu_indices:
            gpu = host.gpus[i]
            share = node.gpu_fraction or 1.0
            gpu.used = max(0.0, round(gpu.used - share, 9))
        host.blocks_used.difference_update(node.blocks)
        host.cpus_used = max(0.0, round(host.cpus_used - node.cpus, 9))
        host.memory_used_mib = max(0, host.memory_used_mib - node.memory_mib)
        host.disk_used_mib = max(0, host.disk_used_mib - node.disk_mib)
        index.refresh(view)


def _view(index: SnapshotIndex, node: NodePlacement) -> HostView:
    view = index.by_id.get(node.host_id)
    if view is None:
        raise ValueError(f"host {node.host_id} is not in the snapshot")
    if not index.is_current(view):
        index.refresh(view)
    return view


def _conflict(view: HostView, node: NodePlacement) -> str | None:
    host = view.host
    for i in node.gpu_indices:
        if not 0 <= i < len(host.gpus):
            return f"it has no GPU {i}"
        used = host.gpus[i].used
        if node.gpu_fraction:
            if used + node.gpu_fraction > 1 + EPSILON:
                return f"GPU {i} has {max(0.0, 1 - used):.2g} free, not {node.gpu_fraction:g}"
        elif used > EPSILON:
            return f"GPU {i} is taken"
    taken = set(node.blocks) & host.blocks_used
    if taken:
        return f"block {min(taken)} is taken"
    if host.cpus_used + node.cpus > host.cpus + EPSILON:
        return "not enough free CPUs"
    if host.memory_used_mib + node.memory_mib > host.memory_mib:
        return "not enough free memory"
    if host.disk_used_mib + node.disk_mib > host.disk_mib:
        return "not enough free disk"
    return None
