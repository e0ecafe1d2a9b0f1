"""The reference pages (docs/reference) are generated from the spec models and cannot drift."""

from __future__ import annotations

import re
import typing
from functools import cache
from pathlib import Path
from typing import Literal

import pytest
from pydantic import BaseModel, Field, field_validator

from gpuflow.errors import SpecError
from gpuflow.specs import FleetSpec, HostDecl, JobSpec, QueueSpec, RetrySpec
from gpuflow.specs.job import check_name
from gpuflow.specs.load import PROFILE_FIELDS, load_fleet, load_job, load_queue
from gpuflow.specs.reference import COMMAND, fields, pages
from gpuflow.specs.reference.__main__ import main
from gpuflow.specs.reference.fields import Section, _probe, rows, sections
from gpuflow.specs.resources import BACKENDS, VENDORS
from gpuflow.specs.scoring import DEFAULT_WEIGHTS, SCORERS
from gpuflow.specs.units import format_duration, format_size_mib, parse_duration
from gpuflow.status import RetryEvent

DOCS = Path(__file__).resolve().parents[2] / "docs" / "reference"


@cache
def _pages() -> dict[str, str]:
    return pages()


def _table(page: str, heading: str) -> dict[str, dict[str, str]]:
    """Field name -> column -> cell, from the table under `## heading`."""
    text = _pages()[page].split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in text.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    table = {}
    for line in lines[2:]:
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
        table[cells[0].strip("`")] = dict(zip(header, cells, strict=True))
    return table


def _ticked(values: typing.Iterable[str]) -> str:
    return ", ".join(f"`{v}`" for v in values)


def _allowed(cell: dict[str, str]) -> list[str]:
    """The parts of an Allowed cell (choices, bounds, rules)."""
    return cell["Allowed"].split("; ")


def test_committed_pages_are_what_the_models_generate() -> None:
    generated = _pages()
    stale = [
        name
        for name, text in generated.items()
        if not (DOCS / name).is_file() or (DOCS / name).read_text() != text
    ]
    assert not stale, (
        f"docs/reference/{', '.join(stale)} no longer match gpuflow/specs; run `{COMMAND}`"
    )
    assert sorted(p.name for p in DOCS.glob("*.md")) == sorted(generated)


@pytest.mark.parametrize(
    ("model", "label", "page"), [(JobSpec, "job", "job.md"), (FleetSpec, "fleet", "fleet.md")]
)
def test_every_field_of_every_nested_model_has_a_row(
    model: type[BaseModel], label: str, page: str
) -> None:
    found = sections(model, label)
    assert len(found) >= 4  # the nested models are walked, not only the top one
    for section in found:
        assert set(_table(page, section.label)) == set(section.model.model_fields)


def test_the_queue_page_has_every_field_and_the_example_queues() -> None:
    assert set(_table("queue.md", "queue")) == set(QueueSpec.model_fields)
    page = _pages()["queue.md"]
    assert "### examples/queue-prod.yaml" in page and "### examples/queue-research.yaml" in page
    assert "### examples/queue-prod.yaml" not in _pages()["job.md"]


def test_the_profile_page_lists_exactly_the_fields_a_profile_may_set() -> None:
    table = _table("profile.md", "profile")
    assert set(table) == PROFILE_FIELDS
    assert table["retry"]["Type"].endswith("[retry](job.md#retry)")


def test_allowed_values_come_from_types_constraints_and_validators() -> None:
    job, fleet = _table("job.md", "job"), _table("fleet.md", "fleet")
    schema = JobSpec.model_json_schema()["properties"]
    for name in ("nodes", "priority"):
        low, high = schema[name]["minimum"], schema[name]["maximum"]
        assert f"{low}..{high}" in _allowed(job[name])
    assert _ticked(SCORERS) in _allowed(job["scorer"])
    events = _ticked(e.value for e in RetryEvent)
    assert events in _allowed(_table("job.md", "retry")["on_events"])
    assert _ticked(VENDORS) in _allowed(_table("job.md", "resources.gpu")["vendor"])
    assert _ticked(BACKENDS) in _allowed(_table("job.md", "resources")["backend"])
    assert _ticked(DEFAULT_WEIGHTS) in _allowed(fleet["scorer_weights"])
    states = typing.get_args(HostDecl.model_fields["state"].annotation)
    assert _ticked(states) in _allowed(_table("fleet.md", "hosts[]")["state"])
    with pytest.raises(ValueError) as refused:
        check_name("Zz-9")
    rule = str(refused.value).split("'Zz-9' ", 1)[1]
    assert rule in _allowed(job["name"]) and rule in _allowed(fleet["name"])


def test_types_and_defaults_read_as_a_user_writes_them() -> None:
    job, retry = _table("job.md", "job"), _table("job.md", "retry")
    assert job["name"]["Default"] == "**required**"
    assert retry["duration"]["Type"] == "duration"
    assert retry["duration"]["Default"] == f"`{format_duration(RetrySpec().duration)}`"
    assert job["retry"]["Type"] == "`true` or mapping, see [retry](#retry)"
    assert job["commands"]["Type"] == "text or list of text"
    resources = _table("job.md", "resources")
    assert resources["gpu"]["Type"].startswith("text or mapping")
    assert (resources["cpu"]["Type"], resources["memory"]["Type"]) == ("range", "size range")
    host = _table("fleet.md", "hosts[]")
    default_memory = HostDecl.model_fields["memory"].default
    assert host["memory"] == host["memory"] | {
        "Type": "size",
        "Default": f"`{format_size_mib(default_memory)}`",
    }
    assert "Written at each entry of `hosts[].gpus`." in _pages()["fleet.md"]


def test_type_is_required_on_the_pages_of_files_refused_without_it(tmp_path: Path) -> None:
    """queue.md and fleet.md showed `type` with the default `queue` / `fleet`, while such a
    file without `type` is refused; a job file may leave out its `type: task`."""
    assert _table("queue.md", "queue")["type"]["Default"] == "**required**"
    assert _table("fleet.md", "fleet")["type"]["Default"] == "**required**"
    assert _table("job.md", "job")["type"]["Default"] == "`task`"
    (tmp_path / "queue.yaml").write_text("name: research\ngpus: 8\n")
    (tmp_path / "fleet.yaml").write_text("name: here\nkind: local\n")
    for load, path in ((load_queue, "queue.yaml"), (load_fleet, "fleet.yaml")):
        with pytest.raises(SpecError, match="type is missing"):
            load(tmp_path / path)
    (tmp_path / "job.yaml").write_text("name: train\ncommands: [x]\n")
    assert load_job(tmp_path / "job.yaml").type == "task"


def test_a_fields_own_example_wins_over_the_example_files(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(
        "name: alpha\ncommands: [run]\nmax_duration: 3h\nresources: {gpu: L4:2, cpu: 4..}\n"
    )
    (tmp_path / "p.yaml").write_text("priority: 7\n")
    generated = pages(tmp_path)
    job = generated["job.md"]
    assert "| `max_duration` | duration | none |" in job
    own = JobSpec.model_fields["max_duration"].examples
    assert own and own[0] != "3h"
    assert re.search(rf"\| `max_duration` \|.*\| `{own[0]}` \|$", job, re.MULTILINE)
    assert "### examples/a.yaml" in job and "### examples/p.yaml" not in job
    assert "### examples/p.yaml" in generated["profile.md"]


def test_examples_come_from_the_example_files_when_a_field_has_none() -> None:
    files = [{"color": "blue", "count": 12}, {"count": 3}, {"mode": "slow"}]
    found = {row.field: row for row in rows(Section("toy", _Toy, ((),)), links={}, files=files)}
    assert found["`count`"].example == "`3`"  # the shortest of the values the files write
    assert (found["`color`"].example, found["`mode`"].example) == ("`blue`", "`slow`")
    assert found["`wait`"].example == ""  # no file writes it


def _every_field() -> list[tuple[str, type[BaseModel], str]]:
    return [
        (f"{section.label}.{name}", section.model, name)
        for model, label in ((JobSpec, "job"), (FleetSpec, "fleet"))
        for section in sections(model, label)
        for name in section.model.model_fields
    ]


@pytest.mark.parametrize(("where", "model", "name"), _every_field(), ids=lambda v: str(v))
def test_every_field_has_a_description_and_an_example_it_accepts(
    where: str, model: type[BaseModel], name: str
) -> None:
    field = model.model_fields[name]
    row = {r.field: r for r in rows(Section(where, model, ((),)), links={}, files=[])}[f"`{name}`"]
    assert len(row.description) >= 20, f"{where} has no useful description"
    # descriptions speak YAML: a user writes nothing or `null`, never Python's None
    assert not re.search(r"\bNone\b", row.description), f"{where}: {row.description}"
    assert field.examples, f"{where} has no example: add Field(examples=[...])"
    assert row.example, f"{where} shows no example"
    # the example is a value the field reads (other fields may still be missing)
    assert _probe(model, name, field.examples[0]) == [], f"{where} refuses its example"


def test_write_names_fields_without_a_description_or_an_example(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert main(["--write", str(tmp_path)]) == 0
    assert "no description" not in capsys.readouterr().out
    monkeypatch.setattr(JobSpec.model_fields["nodes"], "description", None)
    monkeypatch.setattr(JobSpec.model_fields["nodes"], "examples", None)
    monkeypatch.setattr(fields, "_attribute_docs", lambda model: {})
    assert main(["--write", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "no description: " in out and "job.nodes" in out.split("no description: ")[1]
    assert "job.nodes" in out.split("no example of their own: ")[1]


def test_a_broken_example_stops_the_pages(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text("name: bad\ncommands: [x]\nnodes: 0\n")
    with pytest.raises(SpecError, match="nodes"):
        pages(tmp_path)


class _Toy(BaseModel):
    """A model with one field of each kind the generator reads."""

    mode: Literal["fast", "slow"] = "fast"
    """How fast."""
    code: str = Field(default="a1", pattern=r"^[a-z]\d$", description="A short code.")
    color: str = "red"
    count: int = Field(default=2, ge=1)
    wait: int = Field(default=60, le=3600)

    @field_validator("wait", mode="before")
    @classmethod
    def _wait(cls, value: object) -> int:
        return parse_duration(value)

    @field_validator("color")
    @classmethod
    def _color(cls, value: str) -> str:
        if value not in ("red", "blue"):
            raise ValueError(f"unknown color {value!r}; allowed: red, blue")
        return value


def test_rows_read_descriptions_choices_patterns_and_validator_answers() -> None:
    found = {row.field: row for row in rows(Section("toy", _Toy, ((),)), links={}, files=[])}
    assert (found["`mode`"].allowed, found["`mode`"].description) == ("`fast`, `slow`", "How fast.")
    assert found["`code`"].allowed == "matches `^[a-z]\\d$`"
    assert found["`code`"].description == "A short code."
    assert found["`color`"].allowed == "`red`, `blue`"
    assert found["`color`"].default == "`red`"
    assert (found["`count`"].type, found["`count`"].allowed) == ("integer", "at least 1")
    assert (found["`wait`"].type, found["`wait`"].default) == ("duration", "`1m`")
    assert found["`wait`"].allowed == "at most 1h"


def test_check_fails_on_stale_pages_and_names_the_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--check", str(tmp_path)]) == 1
    assert COMMAND in capsys.readouterr().err
    assert main(["--write", str(tmp_path)]) == 0
    assert main(["--check", str(tmp_path)]) == 0
    (tmp_path / "job.md").write_text((tmp_path / "job.md").read_text() + "edited by hand\n")
    assert main(["--check", str(tmp_path)]) == 1
