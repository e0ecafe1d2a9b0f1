"""Rich rendering of jobs, fleets, offers and metrics. Pure functions of the client's models."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from rich.table import Table
from rich.text import Text

from gpuflow.specs.units import format_duration, format_size_mib
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


def status_text(status: JobStatus, reason: str | None = None) -> Text:
    label = status.value
    if reason and status.is_final and reason != "done":
        label += f" ({reason})"
    return Text(label, style=STATUS_STYLE.get(status, ""))


def ago(moment: datetime | None) -> str:
    if moment is None:
        return "-"
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return format_duration(max(0, (datetime.now(UTC) - moment).total_seconds())) + " ago"


def jobs_table(jobs: list[Any]) -> Table:
    table = Table(box=None, header_style="bold")
    for column in ("NAME", "STATUS", "FLEET", "HOSTS", "GPUS", "ATTEMPT", "SUBMITTED", "ID"):
        table.add_column(column)
    for job in jobs:
        table.add_row(
            job.name,
            status_text(job.status, job.reason),
            job.fleet or "-",
            ",".join(job.hosts) or "-",
            job.gpus or "-",
            str(job.attempt),
            ago(job.submitted_at),
            Text(job.id, style="dim"),
        )
    return table


def fleets_table(fleets: list[Any]) -> Table:
    table = Table(box=None, header_style="bold")
    for column in (
        "FLEET",
        "HOST",
        "STATE",
        "PLATFORM",
        "GPUS",
        "GPU USE",
        "CPU",
        "MEMORY",
        "BLOCKS",
    ):
        table.add_column(column)
    for fleet in fleets:
        if not fleet.hosts:
            table.add_row(fleet.name, "-", "-", "-", "-", "-", "-", "-", "-")
        for host in fleet.hosts:
            gpus = host["gpus"]
            if gpus:
                names = sorted({g["name"] for g in gpus})
                mem = format_size_mib(gpus[0]["memory_mib"])
                gpu_text = f"{len(gpus)}x{'/'.join(names)} {mem}"
            else:
                gpu_text = "-"
            if host["simulated"]:
                gpu_text += " (simulated)"
            state = host["state"] + (f" ({host['state_detail']})" if host["state_detail"] else "")
            style = "green" if host["state"] == "ready" else "yellow"
            blocks = f"{host['blocks_busy']}/{host['blocks']} busy" if host["blocks"] > 1 else "-"
            table.add_row(
                fleet.name,
                host["name"],
                Text(state, style=style),
                f"{host['os']}/{host['arch']}" + (f" {host['backend']}" if host["backend"] else ""),
                gpu_text,
                f"{host['gpu_used']:g}/{len(gpus)}" if gpus else "-",
                f"{host['cpus_used']:g}/{host['cpus']}",
                f"{format_size_mib(host['memory_used_mib'])}/{format_size_mib(host['memory_mib'])}",
                blocks,
            )
    return table


def offers_table(offers: Any) -> Table:
    table = Table(box=None, header_style="bold", title="fits", title_justify="left")
    for column in ("#", "FLEET", "HOST", "GPUS", "SCORE"):
        table.add_column(column)
    for i, offer in enumerate(offers.fits, 1):
        table.add_row(str(i), offer.fleet, offer.host, offer.gpus or "-", f"{offer.score:.3f}")
    return table


def sparkline(values: list[float], *, top: float = 100.0, width: int = 30) -> str:
    values = values[-width:]
    if not values:
        return ""
    out = []
    for value in values:
        level = 0 if top <= 0 else int(min(max(value / top, 0), 1) * (len(SPARK) - 1))
        out.append(SPARK[level])
    return "".join(out)


def metrics_table(state: Any, placement: Any | None) -> Table:
    table = Table(box=None, header_style="bold")
    for column in ("NODE", "HOST", "GPU", "UTIL", "", "MEMORY", "", "SOURCE"):
        table.add_column(column)
    hosts = {n.rank: n.host_name for n in placement.nodes} if placement else {}
    for window in sorted(state.gpus.values(), key=lambda w: (w.node, w.gpu)):
        utils = [point[1] for point in window.recent]
        mems = [float(point[2]) for point in window.recent]
        total = window.memory_total_mib or max(mems or [1.0])
        table.add_row(
            str(window.node),
            hosts.get(window.node, "-"),
            str(window.gpu),
            f"{window.utilization:.0f}%",
            Text(sparkline(utils), style="green"),
            f"{format_size_mib(window.memory_used_mib)}/{format_size_mib(window.memory_total_mib)}",
            Text(sparkline(mems, top=float(total)), style="cyan"),
            "simulated" if window.simulated else "NVML",
        )
    return table
