"""What `gpuflow offers` and the plan before `gpuflow apply` show.

Both read the scheduler's verdict (`Offers.placement`), never the list of hosts that fit on
their own: for a gang of N nodes, hosts that each fit are not a placement, and saying so would
contradict the scheduler.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape

from gpuflow.cli.render import gang_table, offers_table, titled
from gpuflow.scheduler.admission import QUOTA, QUOTA_HELD_FOR, RESERVED_FOR
from gpuflow.scheduler.together import JobPlan
from gpuflow.specs.job import JobSpec
from gpuflow.specs.units import format_duration

MAX_REASONS = 10


async def plan_jobs(client: Any, specs: list[JobSpec]) -> list[JobPlan]:
    """The jobs planned together, in order, on one snapshot of the fleets (by the control
    plane, which holds the fleets)."""
    plans: list[JobPlan] = await client.plan(specs)
    return plans


def _hosts(placement: Any) -> str:
    return ", ".join(node.host_name for node in placement.nodes)


def _jobs(names: list[str]) -> str:
    return ", ".join(names)


def _gpus(placement: Any) -> str:
    return "; ".join(
        f"{node.host_name}:{','.join(map(str, node.gpu_indices)) or '-'}"
        for node in placement.nodes
    )


def verdict(placement: Any, nodes: int) -> str:
    """One line: where the job would go."""
    if nodes > 1:
        return (
            f"a gang of {nodes} on {_hosts(placement)} (fleet {placement.fleet}, GPUs "
            f"{_gpus(placement)})"
        )
    gpus = ",".join(map(str, placement.nodes[0].gpu_indices)) or "-"
    return f"{_hosts(placement)} (fleet {placement.fleet}, GPUs {gpus})"


def print_plans(console: Console, plans: list[JobPlan]) -> None:
    """The plan of every job about to be submitted; each sees what the jobs above it take."""
    if len(plans) > 1:
        console.print(
            f"plan for {len(plans)} jobs, in submission order: each job's plan counts what "
            "the jobs above it take",
            highlight=False,
        )
    for k, plan in enumerate(plans):
        placed_before = [p.job.name for p in plans[:k] if _starts(p) is not None]
        print_plan(console, plan, after=placed_before)


def _starts(plan: JobPlan) -> Any:
    """Where the job would start: where admission would start it, when the plan says (a plan
    from the control plane does), else where it fits."""
    if plan.admitted is not None:
        return plan.admitted
    return plan.placement if plan.waits is None and not plan.preempts else None


def print_plan(console: Console, plan: JobPlan, *, after: list[str]) -> None:
    spec = plan.job
    labels = [option.resources.gpu_label for option in spec.resource_options()]
    asks = "no GPU" if labels == ["no GPU"] else f"GPU {' or '.join(labels)}"
    console.print(
        f"[bold]{escape(spec.name)}[/]: {spec.nodes} node(s), {escape(asks)}, "
        f"fleets {escape(', '.join(spec.fleets) or 'any')}",
        highlight=False,
    )
    if plan.queue_never is not None:
        console.print(
            f"  [red]{escape(plan.queue_never)}[/]: "
            + then(spec, "until a queue's quota changes (gpuflow queue apply)"),
            highlight=False,
        )
    placement, starts = plan.placement, _starts(plan)
    which = ""
    if len(labels) > 1 and plan.taken is not None:
        which = f"option {plan.taken + 1} ({labels[plan.taken]}): "
    if plan.preempts:
        victims = ", ".join(plan.preempts)
        lead = "[yellow]nothing fits now[/]; " if placement is None else ""
        on = f" on {escape(_hosts(starts))}" if starts is not None else ""
        console.print(
            f"  {lead}admission would preempt {escape(victims)} (preemptible) to start it{on}"
            + (":" if placement is None else ""),
            highlight=False,
        )
        if placement is not None:
            return
    elif starts is not None:
        console.print(
            f"  goes to {which}{verdict(starts, spec.nodes)}", highlight=False, markup=False
        )
        if plan.displaced and plan.alone is not None:
            console.print(
                f"  [dim](alone it would go to {escape(_hosts(plan.alone))}; "
                f"{escape(_jobs(after))} {'takes' if len(after) == 1 else 'take'} it first)[/]",
                highlight=False,
            )
        return
    elif placement is not None and plan.waits is not None:
        if plan.queue_never is None:
            held = held_line(_hosts(placement), plan.waits, plan.first, spec, plan.ahead)
            console.print(f"  {held}", highlight=False)
        else:
            console.print(f"  {never_line(_hosts(placement))} (above)", highlight=False)
        return
    elif plan.displaced and plan.alone is not None:
        console.print(
            f"  [yellow]nothing left for it[/] once {escape(_jobs(after))} "
            f"{'is' if len(after) == 1 else 'are'} placed "
            f"(alone it would go to {escape(_hosts(plan.alone))}); "
            + then(spec, "for capacity")
            + ":",
            highlight=False,
        )
    elif not plan.fits_idle:
        console.print(
            "  [red]nothing fits, even with every host of its fleets idle and ready[/]: only a "
            "change of the fleets (gpuflow fleet apply) makes room; " + then(spec, "for one") + ":",
            highlight=False,
        )
    else:
        console.print(
            "  [yellow]nothing fits now[/]"
            + (f" ({escape(in_line(plan.ahead, spec.queue))})" if spec.may_wait else "")
            + "; "
            + then(spec, "for capacity")
            + ":",
            highlight=False,
        )
    for k, offers in enumerate(plan.options):
        prefix = f"option {k + 1} ({labels[k]}): " if len(labels) > 1 else ""
        for rejection in offers.rejections[:MAX_REASONS]:
            console.print(f"    {prefix}{rejection}", highlight=False, markup=False)


def then(spec: JobSpec, waits: str) -> str:
    """What becomes of a job that cannot start now, by its retry policy: it waits (`waits`
    says for what) until its retry duration is spent, or it is refused."""
    if spec.may_wait and spec.retry is not None:
        until = format_duration(spec.retry.duration)
        return f"it waits {waits}, up to {until} after its submission"
    return "it would fail at once (its retry does not cover no-capacity)"


def waits_because(waits: str, first: int) -> str:
    """Why admission would hold a job that a host fits now (services/preview.py)."""
    if waits == QUOTA:
        return "the queue has no quota left for it (gpuflow queue list)"
    if waits.startswith(RESERVED_FOR):
        return f"the room it fits in is reserved for {waits.removeprefix(RESERVED_FOR)}"
    if waits.startswith(QUOTA_HELD_FOR):
        head = waits.removeprefix(QUOTA_HELD_FOR)
        return f"the quota it needs is held for {head}, waiting on quota before it"
    if first:
        jobs = "job waiting" if first == 1 else "jobs waiting"
        return f"{first} {jobs} before it would take the room it fits in"
    return "the jobs admitted before it take the room it fits in"


def in_line(ahead: int, queue: str) -> str:
    """Its place in its queue's line if it waits."""
    return f"#{ahead + 1} in line in queue {queue}"


def held_line(hosts: str, waits: str, first: int, spec: JobSpec, ahead: int) -> str:
    """A job a host fits that admission would hold: where it fits, its place, why (or that it
    would fail, for a job that may not wait)."""
    why = escape(waits_because(waits, first))
    if not spec.may_wait:
        return (
            f"[yellow]fits on {escape(hosts)} now, but would fail at once[/]: {why}, and its "
            "retry does not cover no-capacity"
        )
    line = escape(in_line(ahead, spec.queue))
    return f"[yellow]fits on {escape(hosts)} now, but waits[/], {line}: {why}"


def never_line(hosts: str) -> str:
    """A job a host fits that its queue could never admit (`queue_never` says why)."""
    return f"[yellow]fits on {escape(hosts)} now, but its queue could never admit it[/]"


def print_offers(console: Console, offers: Any, *, spec: JobSpec) -> None:
    """One resource option of `gpuflow offers`: the verdict, what fits and why the rest do not."""
    width, nodes = console.width, spec.nodes
    if nodes > 1:
        _print_gang(console, offers, spec=spec, width=width)
    elif offers.fits:
        console.print(titled("fits", offers_table(offers, width=width)))
        _more_fit(console, offers)
        if offers.placement is not None:
            _goes_to(console, offers, spec=spec)
    elif offers.preempts:  # room is there once its victims stop: not "nothing fits"
        console.print("[yellow]nothing fits now[/]")
    else:
        console.print("[bold red]nothing fits[/]")
    if offers.preempts and offers.placement is None:
        _say_preempts(console, offers, spec=spec)
    if offers.queue_never is not None:
        console.print(
            f"[red]{escape(offers.queue_never)}[/]: "
            + then(spec, "until a queue's quota changes (gpuflow queue apply)"),
            highlight=False,
        )
    if offers.placement is None and offers.fits_idle is False:
        console.print(
            "[red]nor would it with every host of its fleets idle and ready[/]: only a change "
            "of the fleets (gpuflow fleet apply) makes room"
        )
    if offers.rejections:
        grouped = offers.rejections_total
        console.print(
            ("[bold]does not fit now[/]" if offers.preempts else "[bold]does not fit[/]")
            + (f" ({grouped:,} hosts, grouped by reason)" if grouped is not None else "")
        )
        for rejection in offers.rejections:
            console.print(f"  {rejection}", highlight=False, markup=False)


def _say_preempts(console: Console, offers: Any, *, spec: JobSpec) -> None:
    victims = ", ".join(offers.preempts)
    on = f" on {verdict(offers.starts, spec.nodes)}" if offers.starts is not None else ""
    console.print(
        f"admission would preempt {victims} (preemptible) to start it{on}",
        highlight=False,
        markup=False,
    )


def _goes_to(console: Console, offers: Any, *, spec: JobSpec) -> None:
    """Where the job goes, or, when admission would hold it, where it fits and why it waits,
    or whom it would preempt."""
    if offers.preempts:
        _say_preempts(console, offers, spec=spec)
    elif offers.waits is None:
        where = verdict(offers.placement, spec.nodes)
        console.print(f"goes to {where}", highlight=False, markup=False)
    elif offers.queue_never is None:
        held = held_line(_hosts(offers.placement), offers.waits, offers.first, spec, offers.ahead)
        console.print(held, highlight=False)
    else:
        console.print(f"{never_line(_hosts(offers.placement))} (below)", highlight=False)


def _print_gang(console: Console, offers: Any, *, spec: JobSpec, width: int) -> None:
    nodes = spec.nodes
    if offers.placement is not None:
        console.print(gang_table(offers.placement, width=width))
        _goes_to(console, offers, spec=spec)
        return
    console.print(
        f"[bold red]no gang of {nodes} whole idle hosts in one fleet[/] "
        f"(a {nodes}-node job takes {nodes} idle hosts of one fleet, or nothing)",
        highlight=False,
    )
    if offers.fits:
        title = f"idle hosts that could each take one node (fewer than {nodes} in each fleet)"
        console.print(titled(title, offers_table(offers, width=width)))
        _more_fit(console, offers)


def _more_fit(console: Console, offers: Any) -> None:
    """Says so when the table shows only the best of the hosts that fit."""
    if offers.fits_total is not None:
        console.print(
            f"the best {len(offers.fits):,} of {offers.fits_total:,} hosts that fit "
            "(--limit shows more)",
            highlight=False,
        )
