"""The filters, in their fixed order. Each has one shape: `filter(hosts, ctx) -> (survivors,
rejections)`, and its rejections are what the user reads when nothing fits.

Order: fleet selection (`select_fleets`, once per call), then per fleet: manual selection, host
state, labels and taints, compatibility, resource fit. A host is rejected by the first filter it
fails, so it is explained once.

Labels and taints are kept simple: every `key: value` in the job's `labels` must be on the host,
and every taint of the host must be tolerated by the job. A toleration `key=value` tolerates that
taint; a toleration `key` tolerates every taint with that key. Hosts carry no implicit taints: a
GPU host without an explicit taint accepts CPU-only jobs too (taint it, e.g. `gpu-only`, to stop
that).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import repeat
from operator import attrgetter, eq

from gpuflow.scheduler.compat import compatibility
from gpuflow.scheduler.fit import Fit, Option, fit, matching_gpus
from gpuflow.scheduler.index import HostClass, HostView, SnapshotIndex, is_ready
from gpuflow.scheduler.model import FleetSnapshot, HostSnapshot, Rejection
from gpuflow.scheduler.request import Request
from gpuflow.status import HostState

FLEET = "fleet"
SELECTION = "selection"
STATE = "state"
LABELS = "labels"
COMPATIBILITY = "compatibility"
RESOURCES = "resources"
GANG = "gang"


@dataclass
class Context:
    """What the filters of one fleet share during one placement call."""

    request: Request
    index: SnapshotIndex
    fleet: FleetSnapshot
    explain: bool
    """Word the resource rejections too (they are only read when nothing fits)."""
    options: list[tuple[Option, ...]] = field(default_factory=list)
    """Set by `by_resources`: the ways each survivor can take the node, aligned with survivors."""

    def reject(self, view: HostView, stage: str, reason: str) -> Rejection:
        return self.index.rejection(view.host.name, stage, reason)


Filter = Callable[[list[HostView], Context], tuple[list[HostView], list[Rejection]]]


def select_fleets(
    index: SnapshotIndex, names: list[str]
) -> tuple[list[FleetSnapshot], list[Rejection]]:
    """Fleets to try, in order: those named (empty: every fleet, in snapshot order)."""
    if not names:
        return list(index.fleets.values()), []
    chosen: list[FleetSnapshot] = []
    rejections: list[Rejection] = []
    known = ", ".join(index.fleets) or "none"
    for name in dict.fromkeys(names):
        fleet = index.fleets.get(name)
        if fleet is None:
            rejections.append(
                index.rejection(f"fleet {name}", FLEET, f"no such fleet (fleets: {known})")
            )
        else:
            chosen.append(fleet)
    return chosen, rejections


def unknown_selected_hosts(
    index: SnapshotIndex, request: Request, fleets: list[FleetSnapshot]
) -> list[Rejection]:
    """Named hosts that none of the candidate fleets has."""
    if request.selected_hosts is None:
        return []
    present = {view.host.name for fleet in fleets for view in index.fleet_hosts[fleet.name]}
    where = ", ".join(fleet.name for fleet in fleets) or "none"
    return [
        index.rejection(name, SELECTION, f"no such host in fleet {where}")
        for name in sorted(request.selected_hosts - present)
    ]


def by_selection(hosts: list[HostView], ctx: Context) -> tuple[list[HostView], list[Rejection]]:
    """Manual selection: only the hosts (or the hosts of the GPUs) the user named."""
    request = ctx.request
    if request.selected_hosts is None:
        return hosts, []
    survivors: list[HostView] = []
    rejections: list[Rejection] = []
    for view in hosts:
        if view.host.name not in request.selected_hosts:
            continue
        allowed = request.allowed_gpus(view.host.name)
        missing = sorted(i for i in allowed or () if i >= len(view.host.gpus))
        if missing:
            have = f"GPUs 0-{len(view.host.gpus) - 1}" if view.host.gpus else "no GPUs"
            shown = ", ".join(str(i) for i in missing)
            rejections.append(ctx.reject(view, SELECTION, f"has no GPU {shown} (it has {have})"))
        else:
            survivors.append(view)
    return survivors, rejections


def state_reason(host: HostSnapshot) -> str | None:
    """Why a host in this state takes no job; None for a ready host."""
    if is_ready(host):
        return None
    words = {
        HostState.NOT_READY: "not ready",
        HostState.UNREACHABLE: "unreachable",
        HostState.MAINTENANCE: "in maintenance",
        HostState.PROVISIONING: "provisioning",
    }
    text = words.get(HostState(host.state), str(host.state))
    return f"{text} ({host.state_detail})" if host.state_detail else text


_HOST_STATE = attrgetter("host.state")


def by_state(hosts: list[HostView], ctx: Context) -> tuple[list[HostView], list[Rejection]]:
    """Only ready hosts, named or not."""
    if all(map(eq, map(_HOST_STATE, hosts), repeat(HostState.READY))):
        return hosts, []
    survivors: list[HostView] = []
    rejections: list[Rejection] = []
    for view in hosts:
        reason = state_reason(view.host)
        if reason is None:
            survivors.append(view)
        else:
            rejections.append(ctx.reject(view, STATE, reason))
    return survivors, rejections


def labels_reason(host: HostSnapshot, request: Request) -> str | None:
    for key, value in request.labels:
        have = host.labels.get(key)
        if have != value:
            found = f"has {key}={have}" if have is not None else f"has no label {key}"
            return f"job requires label {key}={value}, host {found}"
    for taint in host.taints:
        key = taint.partition("=")[0]
        if taint not in request.tolerations and key not in request.tolerations:
            return f"has taint {taint}, which the job does not tolerate"
    return None


def by_labels(hosts: list[HostView], ctx: Context) -> tuple[list[HostView], list[Rejection]]:
    return _by_class(hosts, ctx, LABELS, labels_reason)


def by_compatibility(hosts: list[HostView], ctx: Context) -> tuple[list[HostView], list[Rejection]]:
    return _by_class(hosts, ctx, COMPATIBILITY, compatibility)


def _by_class(
    hosts: list[HostView],
    ctx: Context,
    stage: str,
    check: Callable[[HostSnapshot, Request], str | None],
) -> tuple[list[HostView], list[Rejection]]:
    """A static check, decided once per host class (alike hosts get the same verdict)."""
    memo_key = (stage, ctx.request.key)
    verdicts: dict[int, str | None] = {}
    for cls in ctx.index.classes.values():
        if memo_key in cls.memo:
            verdicts[cls.id] = cls.memo[memo_key]
        else:
            verdicts[cls.id] = cls.memo[memo_key] = check(cls.sample, ctx.request)
    if all(reason is None for reason in verdicts.values()):
        return hosts, []
    survivors: list[HostView] = []
    rejections: list[Rejection] = []
    for view in hosts:
        reason = verdicts[view.cls.id]
        if reason is None:
            survivors.append(view)
        else:
            rejections.append(ctx.reject(view, stage, reason))
    return survivors, rejections


STATIC_FILTERS: tuple[Filter, ...] = (by_selection, by_state, by_labels, by_compatibility)
"""The filters whose verdict does not depend on usage, in order (resource fit comes last)."""


def static_filters(hosts: list[HostView], ctx: Context) -> tuple[list[HostView], list[Rejection]]:
    """Selection, state, labels and compatibility, remembered per fleet and request."""
    memo_key = (ctx.fleet.name, ctx.request.key)
    found = ctx.index.static_memo.get(memo_key)
    if found is not None:
        return found
    rejections: list[Rejection] = []
    for step in STATIC_FILTERS:
        hosts, dropped = step(hosts, ctx)
        rejections.extend(dropped)
    ctx.index.static_memo[memo_key] = (hosts, rejections)
    return hosts, rejections


def by_resources(hosts: list[HostView], ctx: Context) -> tuple[list[HostView], list[Rejection]]:
    """Resource fit; survivors' options go to `ctx.options`. Decided once per host state."""
    request = ctx.request
    memo: dict[int, Fit] | None = None
    if not request.selected_gpus:
        memo = fit_memo(ctx.index, request)
        if ctx.explain:
            known = _known_refusal(hosts, ctx, memo)
            if known is not None:
                ctx.options = []
                return [], known
    survivors: list[HostView] = []
    options: list[tuple[Option, ...]] = []
    rejections: list[Rejection] = []
    explain = ctx.explain
    refused = _ClassRefusals(request)
    for view in hosts:
        result: Fit | None = refused[view.cls]
        if result is not None:
            pass
        elif memo is None:
            result = fit(view, request, request.allowed_gpus(view.host.name))
        else:
            result = memo.get(view.state_id)
            if result is None:
                result = memo[view.state_id] = fit(view, request, None)
        if isinstance(result, str):
            if explain:
                never = refused[view.cls] is not None  # its GPUs could serve it at no usage
                rejections.append(_worded(view, result, ctx, COMPATIBILITY if never else None))
        else:
            survivors.append(view)
            options.append(result)
    ctx.options = options
    if explain and memo is not None and not survivors:
        ctx.index.refusals[(id(hosts), request.key)] = _Refusal(
            hosts, ctx.index.journal_end, rejections
        )
    return survivors, rejections


def fit_memo(index: SnapshotIndex, request: Request) -> dict[int, Fit]:
    """Host state id -> resource fit, for this request (not for one naming exact GPUs)."""
    key = (RESOURCES, request.key)
    memo = index.fit_memo.get(key)
    if memo is None:
        memo = index.fit_memo[key] = {}
    return memo


def _worded(view: HostView, reason: str, ctx: Context, stage: str | None = None) -> Rejection:
    """The host's rejection, by the stage that decided it: `compatibility` for GPUs that can
    never serve the request (model, memory, capability), else `gang` or `resources`."""
    worded = ctx.index.resource_rejections
    rejection = worded.get((view.host.name, reason))
    if rejection is None:
        if stage is None:
            stage = GANG if reason.startswith("busy, and") else RESOURCES
        rejection = worded[(view.host.name, reason)] = ctx.reject(view, stage, reason)
    return rejection


class _ClassRefusals(dict[HostClass, str | None]):
    """Per host class, the reason its GPUs can never serve the request whatever their usage
    (model, memory, capability: what `fit` checks first), or None; looked up once per class."""

    def __init__(self, request: Request) -> None:
        super().__init__()
        self.request = request

    def __missing__(self, cls: HostClass) -> str | None:
        matched = matching_gpus(cls, self.request)
        found = self[cls] = matched if isinstance(matched, str) else None
        return found


@dataclass
class _Refusal:
    """The last full explanation of a request that no host could take."""

    hosts: list[HostView]
    journal_end: int
    rejections: list[Rejection]
    positions: dict[int, int] | None = None


def _known_refusal(
    hosts: list[HostView], ctx: Context, memo: dict[int, Fit]
) -> list[Rejection] | None:
    """When the same request was refused by all of these hosts before, only the hosts whose
    usage changed since need a new look; None if one of them now fits (or nothing is known)."""
    index = ctx.index
    refusal: _Refusal | None = index.refusals.get((id(hosts), ctx.request.key))
    if refusal is None or refusal.hosts is not hosts:
        return None
    changed = index.changed_since(refusal.journal_end)
    if changed is None:
        return None
    if refusal.positions is None:
        refusal.positions = {view.order: i for i, view in enumerate(hosts)}
    rejections = refusal.rejections
    copied = False
    refused = _ClassRefusals(ctx.request)
    for view in dict.fromkeys(changed):  # a host's current usage is what counts: look once
        position = refusal.positions.get(view.order)
        if position is None or refused[view.cls] is not None:
            continue  # not a candidate, or refused whatever its usage: the same rejection
        result = memo.get(view.state_id)
        if result is None:
            result = memo[view.state_id] = fit(view, ctx.request, None)
        if not isinstance(result, str):
            return None
        rejection = _worded(view, result, ctx)
        if rejection is not rejections[position]:
            if not copied:
                rejections, copied = list(rejections), True
            rejections[position] = rejection
    refusal.rejections = rejections
    refusal.journal_end = index.journal_end
    return rejections
