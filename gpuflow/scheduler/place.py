"""`place` and `explain`: one decision over a snapshot, for the workflow's place step, manual
selection, `gpuflow offers` and the dry run. Both run `_decide`, so they cannot disagree.

Fleets are tried in order (the `fleets` argument, else the job's `fleets`, else every fleet in
snapshot order); within a fleet, the fleet's scorer (or the job's) picks the best host, ties going
to the host listed first. The first fleet that can take the job wins.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuflow.scheduler.contenders import contender_states, contenders, room_of
from gpuflow.scheduler.filters import (
    GANG,
    Context,
    by_resources,
    fit_memo,
    select_fleets,
    static_filters,
    unknown_selected_hosts,
)
from gpuflow.scheduler.fit import Option, fit, matching_gpus
from gpuflow.scheduler.gangs import choose_gang, gang_shortfall
from gpuflow.scheduler.index import HostView, SnapshotIndex, index_of, is_ready
from gpuflow.scheduler.model import (
    FleetSnapshot,
    NodePlacement,
    Placement,
    Rejection,
    Snapshot,
    Unschedulable,
)
from gpuflow.scheduler.offers import Offer, Offers, Scored, offer_of
from gpuflow.scheduler.ranking import Ranking
from gpuflow.scheduler.request import Request, resolve
from gpuflow.scheduler.scorers import Scoring, scoring_for
from gpuflow.specs import JobSpec


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
    # Built without validation: the rejections are Rejection values already (a full
    # explanation names every host, and placement passes that fail are frequent).
    return Unschedulable.model_construct(rejections=rejections)


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
                offers.extend(offer_of(scored) for scored in result.fits)
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
    request: Request,
    index: SnapshotIndex,
    fleet: FleetSnapshot,
    scoring: Scoring,
    *,
    explain: bool,
) -> _Fleet:
    ctx = Context(request, index, fleet, explain)
    hosts, static_rejections = static_filters(index.fleet_hosts[fleet.name], ctx)
    keep_all = explain or request.nodes > 1
    states = None
    if not keep_all and not scoring.per_host and not request.selected_gpus:
        states = contender_states(hosts, ctx)
    survivors: list[HostView] = []
    ranked: list[Scored] = []
    dropped: list[Rejection] = []
    if states is not None:  # the fast path: one pass over usage states
        best = _best_state(states, request, index, scoring, fleet.name)
    else:
        candidates = hosts if keep_all else contenders(hosts, ctx, per_host=scoring.per_host)
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
        memo = _score_memo(index, scoring, request)
    best: Scored | None = None
    ranked: list[Scored] = []
    for view, choices in zip(survivors, options, strict=True):
        found = memo.get(view.state_id) if memo is not None else None
        if found is None:
            found = _best_option(view, choices, scoring)
            if memo is not None:
                memo[view.state_id] = found
        score, option = found
        if best is None or score > best[0] or (score == best[0] and view.order < best[1]):
            best = (score, view.order, view, option)
        if keep_all:
            ranked.append((score, view.order, view, option))
    ranked.sort(key=lambda item: (-item[0], item[1]))
    return best, ranked


def _best_state(
    states: list[set[int]], request: Request, index: SnapshotIndex, scoring: Scoring, fleet: str
) -> Scored | None:
    """`_score`'s winner over the shortlist of usage states (each stands for its first host):
    a state's fit and score are memoized per request, and the ranking of the states that fit
    is kept between placements (ranking.py), so only states new since the last look are scored."""
    fits = fit_memo(index, request)
    scores = _score_memo(index, scoring, request)
    members = index.members
    pools, room = index.pools[fleet], room_of(request)

    def score(state_id: int) -> tuple[float, Option] | None:
        found = scores.get(state_id)
        if found is None:
            if not pools.has_room(state_id, room):
                return None
            view = members[state_id][0]
            if isinstance(matching_gpus(view.cls, request), str):
                return None  # the host's GPU models can never serve it: no need to look
            choices = fits.get(state_id)
            if choices is None:
                choices = fits[state_id] = fit(view, request, None)
            if isinstance(choices, str):
                return None
            found = scores[state_id] = _best_option(view, choices, scoring)
        return found

    key = (fleet, scoring.name, scoring.weights_key, id(scoring.workload), request.key)
    ranking: Ranking | None = index.rankings.get(key)
    if ranking is None or not ranking.catch_up(index, score):
        shortlist = (state_id for group in states for state_id in group)
        ranking = index.rankings[key] = Ranking(index, shortlist, score)
    best = ranking.best(index)
    if best is None:
        return None
    best_score, order, state_id = best
    return best_score, order, members[state_id][0], scores[state_id][1]


def _best_option(
    view: HostView, choices: tuple[Option, ...], scoring: Scoring
) -> tuple[float, Option]:
    """The option the scorer likes best on this host (the first of equals)."""
    top_score, top = -float("inf"), choices[0]
    for option in choices:
        value = scoring.score(view, option)
        if value > top_score:
            top_score, top = value, option
    return top_score, top


def _score_memo(
    index: SnapshotIndex, scoring: Scoring, request: Request
) -> dict[int, tuple[float, Option]]:
    """Host state id -> (score, best option) for this scorer and request."""
    key = ("score", scoring.name, scoring.weights_key, id(scoring.workload), request.key)
    memo = index.fit_memo.get(key)
    if memo is None:
        memo = index.fit_memo[key] = {}
    return memo


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
    return Placement(fleet=fleet.name, nodes=nodes, score=sum(s[0] for s in chosen), scorer=scorer)
