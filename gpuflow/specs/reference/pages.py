"""The Markdown pages: job.md, fleet.md, queue.md and profile.md."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from gpuflow.specs import load, resources, units
from gpuflow.specs.fleet import FleetSpec
from gpuflow.specs.job import JobSpec
from gpuflow.specs.queue import QueueSpec
from gpuflow.specs.reference.fields import Row, Section, rows, sections

COMMAND = "python -m gpuflow.specs.reference --write docs/reference"
EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
_HEADER = ("Field", "Type", "Default", "Allowed", "Description", "Example")

# Written forms of each value grammar; the pages show what the parsers make of them, so the
# examples cannot disagree with the code.
_DURATIONS = ("90", "30s", "10m", "1h30m", "7d")
_SIZES = ("512MB", "24GB", "1.5TB", "80")
_RANGES = ("2", "1..4", "8..", "..4", "24GB..80GB")


@dataclass(frozen=True)
class ExampleFile:
    name: str
    kind: str  # job, fleet, queue or profile
    text: str
    data: dict[str, Any]


def example_files(folder: Path = EXAMPLES) -> list[ExampleFile]:
    """Every example file with its kind; each is loaded as gpuflow loads it, so a broken
    example stops the pages from being generated."""
    found = []
    for path in sorted(folder.glob("*.yaml")):
        data = load.read_yaml(path)
        if data.get("type") == "fleet":
            kind = "fleet"
            load.load_fleet(path)
        elif data.get("type") == "queue":
            kind = "queue"
            load.load_queue(path)
        elif "commands" in data or "name" in data:
            kind = "job"
            load.load_job(path)
        else:
            kind = "profile"
            load.load_profile(path)
        found.append(ExampleFile(path.name, kind, path.read_text(), data))
    return found


def _table(found: list[Row]) -> list[str]:
    lines = ["| " + " | ".join(_HEADER) + " |", "|" + "---|" * len(_HEADER)]
    for row in found:
        cells = (row.field, row.type, row.default, row.allowed, row.description, row.example)
        lines.append("| " + " | ".join(cell or "" for cell in cells) + " |")
    return lines


def _where(section: Section) -> str:
    places = [
        "each entry of " + "`" + ".".join(p)[:-2] + "`"
        if p[-1].endswith("[]")
        else f"`{'.'.join(p)}`"
        for p in section.paths
    ]
    return "Written at " + " and ".join(places) + "."


def _grammars(found: list[Row], parts: list[Section]) -> list[str]:
    """How durations, sizes and ranges are written, for the kinds the page's fields use."""
    types = " ".join(row.type for row in found)
    lines = ["## Values", ""]
    if "text" in types:
        lines += [
            "**Text** is written as it is, or in quotes. YAML reads a bare `yes`, `no`, `on`, "
            "`off`, `true` or `false` as a boolean and a bare number (`123`, `1_000`, `0x1F`, "
            '`1:30`) as a number, so text spelled like one is quoted: `name: "off"`, '
            '`name: "123"`. A text field given a boolean or a number is refused, naming the '
            "field and what to quote"
            + (
                " (except `env` values, which keep what the file wrote: `DEBUG: yes` is `yes`)."
                if any(row.field == "`env`" for row in found)
                else "."
            ),
            "",
        ]
    if "duration" in types:
        shown = ", ".join(f"`{d}` = {units.parse_duration(d)} s" for d in _DURATIONS)
        lines += ["**Durations** are seconds, written with units d, h, m, s: " + shown + ".", ""]
    if "size" in types:
        shown = ", ".join(f"`{s}` = {units.parse_size_mib(s)} MiB" for s in _SIZES)
        lines += [
            "**Sizes** are MiB, written with MB, GB or TB (a bare number is GB): " + shown + ".",
            "",
        ]
    if "range" in types:
        shown = ", ".join(f"`{r}` = {_range_meaning(r)}" for r in _RANGES)
        lines += [
            "**Ranges** are inclusive: one value, `MIN..MAX`, `MIN..` (no upper bound) or "
            f"`..MAX`; sizes in a range take units as above: {shown}.",
            "",
        ]
    if any(section.model is resources.GPUSpec for section in parts):
        grammar = (inspect.getdoc(resources) or "").split("\n\n", 1)[-1]
        lines += [
            "**GPUs** (`resources.gpu`) are a mapping (above) or text:",
            "",
            "```text",
            grammar,
            "```",
            "",
        ]
    return lines if len(lines) > 2 else []


def _range_meaning(text: str) -> str:
    sized = any(c.isalpha() for c in text)
    value = units.parse_range(text, parse_one=units.parse_size_mib if sized else float)
    unit = " MiB" if sized else ""
    if value.max is None:
        return f"{value.min:g}{unit} or more"
    if value.max == value.min:
        return f"{value.min:g}{unit}"
    return f"{value.min:g} to {value.max:g}{unit}"


def _page(
    title: str,
    intro: list[str],
    parts: list[Section],
    files: list[ExampleFile],
    *,
    links: dict[type[BaseModel], str],
    only: frozenset[str] | None = None,
    extra_examples: list[ExampleFile] | None = None,
) -> str:
    datas = [f.data for f in [*files, *(extra_examples or [])]]
    lines = [
        f"# {title}",
        "",
        " ".join(intro),
        "",
        f"Generated from the models in `gpuflow/specs` by `{COMMAND}`; do not edit.",
        "",
    ]
    every: list[Row] = []
    for number, section in enumerate(parts):
        found = rows(section, links=links, files=datas, only=only if number == 0 else None)
        every += found
        lines += [f"## {section.label}", ""]
        if number:
            lines += [_where(section), ""]
        doc = section.model.__doc__ if "__doc__" in vars(section.model) else None
        if doc and only is None:
            lines += [" ".join(inspect.cleandoc(doc).split()), ""]
        lines += [*_table(found), ""]
    lines += _grammars(every, parts)
    if files:
        lines += ["## Examples", ""]
        for file in files:
            lines += [f"### examples/{file.name}", "", "```yaml", file.text.rstrip("\n"), "```", ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def pages(folder: Path = EXAMPLES) -> dict[str, str]:
    """File name -> Markdown, for job.md, fleet.md, queue.md and profile.md."""
    files = example_files(folder)
    job_parts, fleet_parts = sections(JobSpec, "job"), sections(FleetSpec, "fleet")
    queue_parts = sections(QueueSpec, "queue")
    job_links = {s.model: f"[{s.label}](#{s.anchor})" for s in job_parts}
    fleet_links = {s.model: f"[{s.label}](#{s.anchor})" for s in fleet_parts}
    profile_links = {s.model: f"[{s.label}](job.md#{s.anchor})" for s in job_parts}
    kinds = ("job", "fleet", "queue", "profile")
    of = {kind: [f for f in files if f.kind == kind] for kind in kinds}
    return {
        "job.md": _page(
            "Job files",
            [
                "A job file describes one job: what it runs, what it needs and how it is placed,",
                "retried and monitored (`gpuflow apply -f job.yaml`). Unknown fields are errors.",
                "A job may name a [profile](profile.md) whose fields it inherits.",
            ],
            job_parts,
            of["job"],
            links=job_links,
        ),
        "fleet.md": _page(
            "Fleet files",
            [
                "A fleet file declares a fleet of hosts (`gpuflow fleet apply -f fleet.yaml`):",
                "`local` is this machine, `sim` declared hosts without real GPUs, `ssh` hosts",
                "reached over SSH. Unknown fields are errors.",
            ],
            fleet_parts,
            of["fleet"],
            links=fleet_links,
        ),
        "queue.md": _page(
            "Queue files",
            [
                "A queue file declares a queue that jobs wait in (`gpuflow queue apply -f",
                "queue.yaml`; a job names it in `queue`), with a nominal GPU quota and what it",
                "borrows from and lends to the other queues of its cohort. The `default` queue",
                "exists without a file, with no quota limit and no cohort; applying a file named",
                "`default` replaces it. Unknown fields are errors.",
            ],
            queue_parts,
            of["queue"],
            links={s.model: f"[{s.label}](#{s.anchor})" for s in queue_parts},
        ),
        "profile.md": _page(
            "Profile files",
            [
                "A profile holds defaults that jobs inherit: the subset of [job fields](job.md)",
                "below, with the same meaning. A job names it with `profile:` in the job file",
                "(or `--profile`): a path if it holds a '/' or ends in .yaml (relative to the job",
                "file, or to the current directory for `--profile`), else a name, read from",
                "GPUFLOW_HOME/profiles/NAME.yaml. The job file's values win over the profile's,",
                "and command-line flags over both: mappings merge field by field; lists and",
                "other values are replaced.",
            ],
            [Section("profile", JobSpec, ((),))],
            of["profile"],
            links=profile_links,
            only=load.PROFILE_FIELDS,
            extra_examples=of["job"],
        ),
    }


def _every_field() -> list[tuple[str, Row, FieldInfo]]:
    """(`section.field`, row, field) for every field of job, fleet and queue files."""
    found = []
    for model, label in ((JobSpec, "job"), (FleetSpec, "fleet"), (QueueSpec, "queue")):
        for section in sections(model, label):
            for row in rows(section, links={}, files=[]):
                name = row.field.strip("`")
                found.append((f"{section.label}.{name}", row, section.model.model_fields[name]))
    return found


def undescribed() -> list[str]:
    """Fields of job, fleet and queue files that have neither a description nor a docstring yet."""
    return [where for where, row, _ in _every_field() if not row.description]


def unexampled() -> list[str]:
    """Fields of job, fleet and queue files without an example of their own (`Field(examples=...)`):
    the example files may not write every field, and may change."""
    return [where for where, _, field in _every_field() if not field.examples]
