"""Rich rendering of jobs, fleets, offers, metrics and schedules. Pure functions of the client's
models and the terminal's width.

Every table fits the width it is given without cutting a name or an id: less important columns
are dropped first, then the columns that may wrap (reasons, host lists) wrap (`fitted_table`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from rich.cells import cell_len
from rich.console import Group, JustifyMethod
from rich.table import Table
from rich.text import Text

from gpuflow.cli.waiting import line_positions, queue_place, why_waiting
from gpuflow.specs.units import format_size_mib
from gpuflow.status import JobStatus

STATUS_STYLE = {
    JobStatus.PENDING: "yellow",
    JobStatus.PROVISIONING: "cyan",
    JobStatus.RUNNING: "green",
    JobStatus.DONE: "bold green",
    JobStatus.FAILED: "bold red",
    JobStatus.TERMINATED: "bold magenta",
    JobStatus.STOPPED: "dim",
}
SPARK = "▁▂▃▄▅▆▇█"
GAP = 2
"""Spaces between two columns (box-less tables, no padding at the edges)."""


# ---- ages and durations ---------------------------------------------------------------------


def short_duration(seconds: float) -> str:
    """The one rendering of ages and durations in tables: the largest unit only, `45s`, `3m`,
    `2h`, `5d` (exact durations are in `--json`)."""
    seconds = max(0, int(seconds))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def age(moment: datetime | None, *, now: datetime | None = None) -> str:
    """How long ago `moment` was, e.g. `3m`; `-` for never."""
    if moment is None:
        return "-"
    now = now or datetime.now(UTC)
    return short_duration((now - _aware(moment)).total_seconds())


def ago(moment: datetime | None, *, now: datetime | None = None) -> str:
    return "-" if moment is None else f"{age(moment, now=now)} ago"


def until(moment: datetime, *, now: datetime | None = None) -> str:
    """`in 3h` for a moment ahead; `now` for one that has come."""
    now = now or datetime.now(UTC)
    seconds = (_aware(moment) - now).total_seconds()
    return f"in {short_duration(seconds)}" if seconds >= 1 else "now"


def recorded_status(value: str) -> Text:
    """A status as a job's events record it (text), styled as `status_text` styles it."""
    known = {status.value: status for status in JobStatus}.get(value)
    return Text(value, style=STATUS_STYLE.get(known, "") if known else "")


def status_text(status: JobStatus, reason: str | None = None) -> Text:
    label = status.value
    if reason and status.is_final and reason != "done":
        label += f" ({reason})"
    return Text(label, style=STATUS_STYLE.get(status, ""))


# ---- fitting a table to the terminal --------------------------------------------------------


@dataclass(frozen=True)
class Column:
    header: str
    drop: int = 0
    """0: always shown; otherwise dropped when the table is too wide, highest number first."""
    wrap: bool = False
    """May wrap over several lines (free text); other cells stay whole on one line."""
    readable: int = 20
    """A wrapping column narrower than this reads badly: other columns are dropped first."""
    justify: JustifyMethod = "left"


Cell = str | Text


def _width(cell: Cell) -> int:
    text = cell.plain if isinstance(cell, Text) else cell
    return max((cell_len(line) for line in text.splitlines()), default=0)


def _longest_word(cell: Cell) -> int:
    text = cell.plain if isinstance(cell, Text) else cell
    return max((cell_len(word) for word in text.split()), default=0)


def fitted_table(columns: Sequence[Column], rows: Sequence[Sequence[Cell]], *, width: int) -> Table:
    """A box-less table of `rows` that fits `width` columns without cutting a cell."""
    natural = [
        max([cell_len(col.header)] + [_width(row[k]) for row in rows])
        for k, col in enumerate(columns)
    ]
    # A wrapped cell breaks between words; a word (a host name, say) is never broken.
    narrowest = [
        max([col.readable, cell_len(col.header)] + [_longest_word(row[k]) for row in rows])
        for k, col in enumerate(columns)
    ]
    keep = list(range(len(columns)))

    def total(indices: list[int], *, wrapped: bool) -> int:
        widths = [
            min(natural[k], narrowest[k]) if wrapped and columns[k].wrap else natural[k]
            for k in indices
        ]
        return sum(widths) + GAP * (len(indices) - 1)

    for k in sorted((k for k in keep if columns[k].drop), key=lambda k: -columns[k].drop):
        if total(keep, wrapped=True) <= width:
            break
        keep.remove(k)
    fits = total(keep, wrapped=True) <= width
    widths: dict[int, int] = {}
    if fits:
        # Every width decided here, so Rich has nothing to narrow (it cropped wrapped text
        # when left to share the width out itself): each column at its natural width, the
        # wrapped ones narrowed to their longest word, then given back what is left, the last
        # first (the free text a row ends with: why a job waits, how it ended).
        widths = {k: natural[k] for k in keep}
        for k in keep:
            if columns[k].wrap:
                widths[k] = min(natural[k], narrowest[k])
        spare = width - sum(widths.values()) - GAP * (len(keep) - 1)
        for k in reversed(keep):
            if columns[k].wrap and spare > 0:
                more = min(spare, natural[k] - widths[k])
                widths[k] += more
                spare -= more
    left = [columns[k].header for k in range(len(columns)) if k not in keep]
    caption = f"({', '.join(left)} left out to fit; --json has every field)" if left else None
    table = Table(
        box=None,
        header_style="bold",
        pad_edge=False,
        padding=(0, 1),
        caption=caption,
        caption_style="dim",
        caption_justify="left",
    )
    for k in keep:
        col = columns[k]
        table.add_column(
            col.header,
            justify=col.justify,
            no_wrap=not col.wrap,
            width=widths.get(k),
            # Never an ellipsis: if even the kept cells cannot fit, they fold onto a next line.
            overflow="fold",
        )
    for row in rows:
        # A plain string is data (names, reasons, messages a user wrote): never Rich markup.
        table.add_row(*(_data(row[k]) for k in keep))
    return table


def _data(cell: str | Text) -> Text:
    return Text(cell) if isinstance(cell, str) else cell


# ---- jobs -----------------------------------------------------------------------------------


def job_detail(job: Any, positions: dict[str, tuple[int, int]]) -> str:
    """Where a job runs, or why it waits (with its place in line), or how it ended."""
    place = queue_place(job)  # `queue/#position reason`, once an admission pass has ordered it
    if place is not None:
        return place
    if job.status == JobStatus.PENDING:
        position, waiting = positions.get(job.id, (0, 0))
        line = f"#{position} of {waiting} waiting; " if position else ""
        return line + why_waiting(job)
    if job.status == JobStatus.PROVISIONING:
        return why_waiting(job)
    where = ", ".join(job.hosts)  # a space between hosts: a long list wraps between them
    if job.status == JobStatus.RUNNING:
        return f"{where} ({job.gpus})" if where and job.gpus else where or "-"
    return str(job.message or where or "-")


def jobs_table(jobs: Sequence[Any], *, width: int, now: datetime | None = None) -> Table:
    positions = line_positions(jobs)
    attempts = any(job.attempt > 1 for job in jobs)
    columns = [
        # Always shown: a user reads a job by its name. The id holds it too (`job-<name>-<suffix>`),
        # so a narrow terminal drops the id before the short AGE (the caption says so).
        Column("NAME"),
        Column("STATUS", wrap=True, readable=10),
        Column("AGE", drop=1, justify="right"),
        Column("ID", drop=2),
        Column("ATTEMPT", drop=3, justify="right"),
        Column("FLEET", drop=4),
        Column("WHERE / WHY", wrap=True),
    ]
    rows = [
        [
            job.name,
            status_text(job.status, job.reason),
            age(job.submitted_at, now=now),
            Text(job.id, style="dim"),
            str(job.attempt),
            job.fleet or "-",
            job_detail(job, positions),
        ]
        for job in jobs
    ]
    if not attempts:  # a column of 1s says nothing
        columns.pop(4)
        for row in rows:
            row.pop(4)
    return fitted_table(columns, rows, width=width)


# ---- fleets ---------------------------------------------------------------------------------


def host_state(host: dict[str, Any]) -> str:
    """`ready`, `not_ready (agent not answering; last heartbeat 3m ago)`, `not_ready (declared)`
    (a sim host declared in that state has no heartbeat to show)."""
    detail = host.get("state_detail")
    return str(host["state"]) + (f" ({detail})" if detail else "")


def fleets_table(fleets: Sequence[Any], *, width: int) -> Table:
    split = any(host["blocks"] > 1 for fleet in fleets for host in fleet.hosts)
    columns = [
        Column("FLEET"),
        Column("HOST"),
        Column("STATE", wrap=True, readable=10),
        Column("GPUS", wrap=True),
        Column("GPU USE", drop=1, justify="right"),
        Column("CPU", drop=3, justify="right"),
        Column("MEMORY", drop=4, justify="right"),
        Column("BLOCKS", drop=2, justify="right"),
        Column("PLATFORM", drop=5),
    ]
    rows: list[list[Cell]] = []
    for fleet in fleets:
        if not fleet.hosts:
            rows.append([fleet.name, "-", "-", "no hosts", "-", "-", "-", "-", "-"])
        for host in fleet.hosts:
            gpus = host["gpus"]
            gpu_text = "-"
            if gpus:
                names = "/".join(sorted({g["name"] for g in gpus}))
                gpu_text = f"{len(gpus)}x{names} {format_size_mib(gpus[0]['memory_mib'])}"
            if host["simulated"]:
                gpu_text += " (simulated)"
            style = "green" if host["state"] == "ready" else "yellow"
            rows.append(
                [
                    fleet.name,
                    host["name"],
                    Text(host_state(host), style=style),
                    gpu_text,
                    f"{host['gpu_used']:g}/{len(gpus)}" if gpus else "-",
                    f"{host['cpus_used']:g}/{host['cpus']}",
                    f"{format_size_mib(host['memory_used_mib'])}/"
                    f"{format_size_mib(host['memory_mib'])}",
                    f"{host['blocks_busy']}/{host['blocks']} busy" if host["blocks"] > 1 else "-",
                    f"{host['os']}/{host['arch']}"
                    + (f" {host['backend']}" if host["backend"] else ""),
                ]
            )
    if not split:  # no host is split into blocks: the column would be all dashes
        columns.pop(7)
        for row in rows:
            row.pop(7)
    return fitted_table(columns, rows, width=width)


# ---- offers ---------------------------------------------------------------------------------


def titled(title: str, table: Table) -> Group:
    """A table under a bold title line (a table's own title is cut to the table's width)."""
    return Group(Text(title, style="bold"), table)


def offers_table(offers: Any, *, width: int) -> Table:
    columns = [
        Column("#", justify="right"),
        Column("FLEET"),
        Column("HOST"),
        Column("GPUS", wrap=True),
        Column("SCORE", drop=1, justify="right"),
    ]
    rows = [
        [str(i), offer.fleet, offer.host, offer.gpus or "-", f"{offer.score:.3f}"]
        for i, offer in enumerate(offers.fits, 1)
    ]
    return fitted_table(columns, rows, width=width)


def gang_table(placement: Any, *, width: int) -> Group:
    """The hosts a gang would take, one per node rank."""
    columns = [
        Column("NODE", justify="right"),
        Column("HOST"),
        Column("GPUS", wrap=True),
    ]
    rows = [
        [str(node.rank), node.host_name, ",".join(map(str, node.gpu_indices)) or "-"]
        for node in placement.nodes
    ]
    title = f"gang of {len(placement.nodes)} in fleet {placement.fleet}"
    return titled(title, fitted_table(columns, rows, width=width))


# ---- metrics --------------------------------------------------------------------------------


def sparkline(values: list[float], *, top: float = 100.0, width: int = 30) -> str:
    values = values[-width:]
    if not values:
        return ""
    out = []
    for value in values:
        level = 0 if top <= 0 else int(min(max(value / top, 0), 1) * (len(SPARK) - 1))
        out.append(SPARK[level])
    return "".join(out)


def metrics_table(state: Any, placement: Any | None, *, width: int, spark: int = 16) -> Table:
    columns = [
        Column("NODE", justify="right"),
        Column("HOST"),
        Column("GPU", justify="right"),
        Column("UTIL", justify="right"),
        Column("UTIL RECENT", drop=2),
        Column("MEMORY", justify="right"),
        Column("MEMORY RECENT", drop=3),
        Column("SOURCE"),
    ]
    hosts = {n.rank: n.host_name for n in placement.nodes} if placement else {}
    rows: list[list[Cell]] = []
    for window in sorted(state.gpus.values(), key=lambda w: (w.node, w.gpu)):
        utils = [point[1] for point in window.recent]
        mems = [float(point[2]) for point in window.recent]
        total = window.memory_total_mib or max(mems or [1.0])
        rows.append(
            [
                str(window.node),
                hosts.get(window.node, "-"),
                str(window.gpu),
                f"{window.utilization:.0f}%",
                Text(sparkline(utils, width=spark), style="green"),
                f"{format_size_mib(window.memory_used_mib)}/"
                f"{format_size_mib(window.memory_total_mib)}",
                Text(sparkline(mems, top=float(total), width=spark), style="cyan"),
                "simulated" if window.simulated else "NVML",
            ]
        )
    return fitted_table(columns, rows, width=width)


# ---- schedules ------------------------------------------------------------------------------


def schedules_table(
    schedules: Sequence[dict[str, Any]], *, width: int, now: datetime | None = None
) -> Table:
    columns = [
        Column("SCHEDULE"),
        Column("JOB", drop=2),
        Column("WHEN", drop=1, wrap=True, readable=10),
        Column("NEXT", drop=3),
        Column("RECENT JOBS"),
    ]
    rows = [
        [
            item["id"],
            item.get("job") or "-",
            item.get("when") or "-",
            "\n".join(until(datetime.fromisoformat(t), now=now) for t in item["next"]) or "-",
            "\n".join(item["recent"]) or "-",
        ]
        for item in schedules
    ]
    return fitted_table(columns, rows, width=width)
