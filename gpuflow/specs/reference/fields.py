"""Reading the spec models: one Row per field, one Section per (nested) model.

Types and defaults come from the fields; allowed values from Literal and Enum types, from
constraints (ge, le, lengths, patterns) and from what a validator answers to a value it refuses;
descriptions from field descriptions or attribute docstrings; examples from a field's own
`examples`, else from the example files. Nothing here changes a model.
"""

from __future__ import annotations

import ast
import enum
import inspect
import itertools
import re
import textwrap
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from gpuflow.specs import load, units

_PROBE = "Zz-9"  # text no vocabulary, name or HOST:INDEX rule accepts
_EXAMPLE_WIDTH = 48


@dataclass(frozen=True)
class Section:
    """One model on a page: its heading and the paths where files write it."""

    label: str
    model: type[BaseModel]
    paths: tuple[tuple[str, ...], ...]

    @property
    def anchor(self) -> str:
        return _anchor(self.label)


def _anchor(heading: str) -> str:
    """The anchor GitHub gives a heading."""
    return re.sub(r"[^a-z0-9 _-]", "", heading.lower()).replace(" ", "-")


def _unwrap(annotation: Any) -> tuple[Any, list[Any]]:
    """The annotation without Annotated and None, with the Annotated metadata."""
    metadata: list[Any] = []
    while typing.get_origin(annotation) is typing.Annotated:
        annotation, *extra = typing.get_args(annotation)
        metadata += extra
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(members) == 1:
            return _unwrap(members[0])[0], metadata
    return annotation, metadata


def _nested(annotation: Any) -> tuple[type[BaseModel] | None, str]:
    """The model a field holds (directly, or as list items) and the path step to it."""
    annotation, _ = _unwrap(annotation)
    suffix = ""
    if typing.get_origin(annotation) is list:
        annotation, _ = _unwrap(typing.get_args(annotation)[0])
        suffix = "[]"
    is_model = isinstance(annotation, type) and issubclass(annotation, BaseModel)
    if is_model and annotation is not units.Range:
        return annotation, suffix
    return None, ""


def sections(model: type[BaseModel], label: str) -> list[Section]:
    """The model and every model nested in it, depth first: in the order a file reads them."""
    found: dict[type[BaseModel], list[tuple[str, ...]]] = {}
    labels: dict[type[BaseModel], str] = {}

    def visit(current: type[BaseModel], path: tuple[str, ...], name: str) -> None:
        if current in found:
            found[current].append(path)
            return
        found[current], labels[current] = [path], name
        for field_name, field in current.model_fields.items():
            inner, suffix = _nested(field.annotation)
            if inner is not None:
                step = (*path, field_name + suffix)
                visit(inner, step, ".".join(step))

    visit(model, (), label)
    return [Section(labels[m], m, tuple(paths)) for m, paths in found.items()]


def _attribute_docs(model: type[BaseModel]) -> dict[str, str]:
    """Attribute docstrings (a string right under a field) of the model's own fields."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(model)))
    except (OSError, TypeError):
        return {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    docs = {}
    for node, after in itertools.pairwise(body):
        is_doc = isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and is_doc:
            value = after.value.value  # type: ignore[attr-defined]
            if isinstance(value, str):
                docs[node.target.id] = inspect.cleandoc(value)
    return docs


def _one_line(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _probe(model: type[BaseModel], name: str, value: Any) -> list[tuple[str, str]]:
    """What validating `value` as the field says: (error type, message), none if accepted."""
    try:
        model.model_validate({name: value})
    except ValidationError as exc:
        return [
            (str(item["type"]), str(item["msg"]).removeprefix("Value error, "))
            for item in exc.errors()
            if item["loc"][:1] == (name,)
        ]
    except Exception as exc:  # a validator that breaks on a probe refuses it all the same
        return [("exception", str(exc))]
    return []


def _accepts(model: type[BaseModel], name: str, value: Any) -> bool:
    return not _probe(model, name, value)


# ---- one row per field ---------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    field: str
    type: str
    default: str
    allowed: str
    description: str
    example: str


_BOUND_ERRORS = frozenset({"greater_than", "greater_than_equal", "less_than", "less_than_equal"})


def _parses(model: type[BaseModel], name: str, *written: str) -> bool:
    """Whether the field reads any of these written values (a value it reads but finds out of
    bounds counts: `2h` is a duration even where the most allowed is 1h)."""
    return any(
        all(kind in _BOUND_ERRORS for kind, _ in _probe(model, name, value)) for value in written
    )


def _grammar(model: type[BaseModel], name: str, annotation: Any) -> str | None:
    """`duration`, `size`, `size range` or `range` for fields that parse a written value."""
    if annotation is int:
        if _parses(model, name, "2h", "30s"):
            return "duration"
        if _parses(model, name, "2GB", "512MB"):
            return "size"
    if annotation is units.Range:
        return "size range" if _parses(model, name, "2GB..4GB") else "range"
    return None


def _type_name(annotation: Any, links: dict[type[BaseModel], str]) -> str:
    annotation, _ = _unwrap(annotation)
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a, links) for a in args if a is not type(None))
    if origin is Literal:
        return " or ".join(f"`{a}`" for a in args) if len(args) == 1 else "text"
    if origin is list:
        inner = _type_name(args[0], links)
        return f"list of {inner.replace('mapping,', 'mappings,')}"
    if origin is dict:
        return f"mapping of {_type_name(args[0], links)} to {_type_name(args[1], links)}"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return f"mapping, see {links[annotation]}" if annotation in links else "mapping"
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return "text"
    plain = {str: "text", int: "integer", float: "number", bool: "true or false"}
    return plain.get(annotation, getattr(annotation, "__name__", str(annotation)))


def _choices(annotation: Any) -> list[str]:
    """Values from Literal and Enum types anywhere in the annotation."""
    annotation, _ = _unwrap(annotation)
    if typing.get_origin(annotation) is Literal:
        return [str(a) for a in typing.get_args(annotation)]
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return [str(member.value) for member in annotation]
    return [c for a in typing.get_args(annotation) for c in _choices(a)]


def _bounds(metadata: list[Any], *, items: bool, grammar: str | None = None) -> list[str]:
    """ge/gt/le/lt, lengths and patterns from constraint metadata, in words; bounds of sizes
    and durations in their units."""
    unit_of = {"size": units.format_size_mib, "duration": units.format_duration}.get(grammar or "")
    found: dict[str, Any] = {}
    for item in metadata:
        for key in ("ge", "gt", "le", "lt", "min_length", "max_length", "pattern"):
            if getattr(item, key, None) is not None:
                found[key] = getattr(item, key)

    def shown(key: str) -> str:
        return unit_of(found[key]) if unit_of else f"{found[key]}"

    words = []
    if "ge" in found and "le" in found:
        words.append(f"{shown('ge')}..{shown('le')}")
    else:
        for key, word in (("ge", "at least"), ("gt", "above"), ("le", "at most"), ("lt", "below")):
            words += [f"{word} {shown(key)}"] if key in found else []
    unit = "item" if items else "character"
    for key, word in (("min_length", "at least"), ("max_length", "at most")):
        if key in found:
            words.append(f"{word} {found[key]} {unit}{'' if found[key] == 1 else 's'}")
    if "pattern" in found:
        words.append(f"matches `{found['pattern']}`")
    return words


def _rule(model: type[BaseModel], name: str, annotation: Any) -> str | None:
    """What a validator says about a value it refuses, for text fields and text collections."""
    bare, _ = _unwrap(annotation)
    origin, args = typing.get_origin(bare), typing.get_args(bare)
    if bare is str:
        probe: Any = _PROBE
    elif origin is list and _unwrap(args[0])[0] is str:
        probe = [_PROBE]
    elif origin is dict:
        value = {str: _PROBE, float: 1.0, int: 1}.get(_unwrap(args[1])[0], _PROBE)
        probe = {_PROBE: value}
    else:
        return None
    # Only a validator's own words: built-in checks (types, bounds) are listed from the type.
    said = [message for kind, message in _probe(model, name, probe) if kind == "value_error"]
    if not said:
        return None
    message = said[0]
    if "allowed: " in message:
        return ", ".join(f"`{v}`" for v in message.split("allowed: ", 1)[1].split(", "))
    for shown in (repr(_PROBE), repr(_PROBE.lower())):
        if shown in message:
            message = message.split(shown, 1)[1].lstrip(" ;:,")
    if message.startswith("is not ") and ": " in message:  # "is not a version: write ..."
        message = message.split(": ", 1)[1]
    return message


def _allowed(model: type[BaseModel], name: str, field: FieldInfo, grammar: str | None) -> str:
    annotation, item_metadata = _unwrap(field.annotation)
    # choices of a union with other types (`int | Literal["auto"]`) are in its type already
    is_union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
    listed = [] if is_union else _choices(annotation)
    words = [", ".join(f"`{c}`" for c in listed)] if listed else []
    is_collection = typing.get_origin(annotation) in (list, dict)
    words += _bounds(list(field.metadata), items=is_collection, grammar=grammar)
    if is_collection:
        inner = [_unwrap(a)[1] for a in typing.get_args(annotation)]
        words += [f"each {w}" for w in _bounds([m for ms in inner for m in ms], items=False)]
    words += _bounds(item_metadata, items=False, grammar=grammar)
    if not _choices(annotation):
        rule = _rule(model, name, field.annotation)
        words += [rule] if rule else []
    return _one_line("; ".join(words))


def _plain(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return _plain(value.model_dump(mode="json", exclude_defaults=True))
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def _yaml(value: Any) -> str:
    text = yaml.safe_dump(_plain(value), default_flow_style=True, width=10**6, sort_keys=False)
    return text.removesuffix("\n").removesuffix("\n...").strip()


def _range_text(value: units.Range, grammar: str) -> str:
    if grammar != "size range" or (value.min == 0 and value.max is None):
        return str(value)
    return units.format_size_range(value)


def _default(model: type[BaseModel], name: str, field: FieldInfo, grammar: str | None) -> str:
    # A fleet or queue file without `type` is refused by its loader, whatever the model's
    # default (which code that builds the model relies on).
    if field.is_required() or (name == "type" and model in load.SAYS_ITS_TYPE):
        return "**required**"
    value = field.get_default(call_default_factory=True)
    if value is None:
        return "none"
    if grammar == "duration":
        return f"`{units.format_duration(value)}`"
    if grammar == "size":
        return f"`{units.format_size_mib(value)}`"
    if isinstance(value, BaseModel) and not isinstance(value, units.Range):
        return "its fields' defaults"
    if isinstance(value, units.Range):
        return f"`{_range_text(value, grammar or 'range')}`"
    return f"`{_yaml(value)}`"


def _values_at(data: Any, path: tuple[str, ...]) -> Iterator[Any]:
    """Every value a file writes at `path` (a step ending in [] walks each list item)."""
    if not path:
        yield data
        return
    step, rest = path[0], path[1:]
    key = step.removesuffix("[]")
    if not isinstance(data, dict) or key not in data:
        return
    value = data[key]
    items = value if step.endswith("[]") and isinstance(value, list) else [value]
    for item in items:
        yield from _values_at(item, rest)


def _is_mapping(value: Any) -> bool:
    """Mappings (and lists of them) are a nested section's to show, not a cell's."""
    items = value if isinstance(value, list) else [value]
    return bool(items) and all(isinstance(item, dict) for item in items)


def _example(
    field: FieldInfo, paths: list[tuple[str, ...]], files: list[dict[str, Any]], *, nested: bool
) -> str:
    """The field's own example, else the shortest value the example files write for it."""
    if field.examples:
        return _one_line(f"`{_yaml(field.examples[0])}`")
    values = [v for data in files for path in paths for v in _values_at(data, path)]
    shown = sorted(
        {_yaml(v) for v in values if not (nested and _is_mapping(v))},
        key=lambda text: (len(text), text),
    )
    if not shown:
        return ""
    text = shown[0]
    text = text if len(text) <= _EXAMPLE_WIDTH else text[: _EXAMPLE_WIDTH - 1] + "…"
    return _one_line(f"`{text}`")


def rows(
    section: Section,
    *,
    links: dict[type[BaseModel], str],
    files: list[dict[str, Any]],
    only: frozenset[str] | None = None,
) -> list[Row]:
    model, docs, result = section.model, _attribute_docs(section.model), []
    for name, field in model.model_fields.items():
        if only is not None and name not in only:
            continue
        bare, _ = _unwrap(field.annotation)
        grammar = _grammar(model, name, bare)
        kind = grammar or _type_name(field.annotation, links)
        nested = _nested(field.annotation)[0]
        if grammar is None and (nested or typing.get_origin(bare) is list):
            # validators that also take a shorter form: `gpu: A100:1`, `retry: true`, a command
            kind = "text or " * _accepts(model, name, "1") + kind
            kind = "`true` or " * _accepts(model, name, True) + kind
        paths = [(*p, name) for p in section.paths]
        result.append(
            Row(
                field=f"`{name}`",
                type=kind,
                default=_default(model, name, field, grammar),
                allowed=_allowed(model, name, field, grammar),
                description=_one_line(field.description or docs.get(name, "")),
                example=_example(field, paths, files, nested=nested is not None),
            )
        )
    return result
