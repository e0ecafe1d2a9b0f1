"""Validation errors as the one line a user reads: the file, where, what is wrong, what to write.

Pydantic's own wording ("Input should be a valid string", a union member's tag such as
`literal['auto']`, a model's class name) names its internals, not the file: each kind of
problem a file can hold is said here in the product's words, once, for every spec (job, fleet,
queue, profile, the SDK's mappings).
"""

from __future__ import annotations

import difflib
import re
import types
import typing
from collections.abc import Mapping
from typing import Any, cast, get_args

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails

from gpuflow.specs.units import IN_MIB, format_size_mib, shown

_MAX_PROBLEMS = 3
_SIMPLE_ITEM = re.compile(r"[A-Za-z0-9_./=:-]{1,40}")
"""Text that YAML reads as text inside `[...]` as written (for the hint `write [gpu-only]`)."""


def describe_validation_error(
    error: ValidationError,
    *,
    source: str,
    field_sources: dict[str, str] | None = None,
    model: type[BaseModel] | None = None,
    spellings: Mapping[tuple[Any, ...], tuple[str, Any]] | None = None,
) -> str:
    """One line: the file, where, the value, and what is allowed, for the first few problems.

    `field_sources` names the file a top-level field came from (a profile's, say), when it is
    not `source`; `model`, the model validated, lets an unknown field name the known ones;
    `spellings` (safe_yaml.Spellings) lets a text field given `off` or `123` say what YAML
    read and what to quote."""
    items = _merged_unions(error.errors(), model)
    first = items[0]["loc"][0] if items and items[0]["loc"] else None
    source = (field_sources or {}).get(str(first), source)
    problems = []
    listed: set[tuple[int | str, ...]] = set()  # where the known fields were named already
    for item in items[:_MAX_PROBLEMS]:
        loc = tuple(item["loc"])
        kind = item["type"]
        value = item.get("input")
        if kind == "extra_forbidden":
            message = unknown_field(model, loc, list_known=loc[:-1] not in listed)
            listed.add(loc[:-1])
        elif kind == "string_type" and _is_scalar(value):
            message = _not_text(loc, value, (spellings or {}).get(loc))
        else:
            message = _said(item, model)
        if loc[-1:] == ("[key]",):  # a mapping's key, not its value, is wrong
            named = "" if kind == "string_type" and _is_scalar(value) else f"{_yaml(loc[-2])} "
            message = f"the key {named}{message}"
            loc = loc[:-2]
        where = ".".join(map(_field, loc))
        quoted = _yaml(value)
        if kind in _BOUNDS and isinstance(value, int) and _is_size(model, loc):
            quoted = format_size_mib(value)  # the value as read, in MiB: said as a size
        shown_value = (
            ""
            if kind in ("missing", "string_type")
            or isinstance(value, dict | list)
            or quoted in message
            or (isinstance(value, bool) and repr(value) in message)  # a check's own words
            else f" (got {quoted})"
        )
        # A check of the whole spec names its fields in its message.
        problems.append(f"{where}: {message}{shown_value}" if where else message + shown_value)
    more = len(items) - _MAX_PROBLEMS
    tail = f"; and {more} more" if more > 0 else ""
    return f"{source}: " + "; ".join(problems) + tail


def _is_scalar(value: Any) -> bool:
    return isinstance(value, bool | int | float)


def _yaml(value: Any) -> str:
    """A value as a YAML file spells it: `false`, not Python's `False`."""
    return str(value).lower() if isinstance(value, bool) else shown(value)


def _read_as(value: Any) -> str:
    return f"the {'boolean' if isinstance(value, bool) else 'number'} {_yaml(value)}"


def _not_text(loc: tuple[Any, ...], value: Any, spelling: tuple[str, Any] | None) -> str:
    """A text field given a bool or a number: what YAML read, and what to quote. `spelling`,
    the text as written, is used only when it is the value refused (a flag or a profile may
    have replaced the file's)."""
    if spelling is not None and type(spelling[1]) is type(value) and spelling[1] == value:
        text = spelling[0]
        key = loc[-1] if loc else None
        field = f"{key}: " if isinstance(key, str) and key != "[key]" else ""
        return f'{text} was read by YAML as {_read_as(value)}; quote it: {field}"{text}"'
    if isinstance(value, bool):
        return (
            f"must be text, not {_read_as(value)} (in YAML a bare yes, no, on, off, true or "
            "false is a boolean: quote the text)"
        )
    return f'must be text, not {_read_as(value)} (quote it: "{_yaml(value)}")'


def _said(item: ErrorDetails, model: type[BaseModel] | None) -> str:
    """Pydantic's message for one problem, in the product's words."""
    kind, ctx, value = item["type"], item.get("ctx") or {}, item.get("input")
    if kind == "missing":
        return "required field is missing"
    if kind in ("int_type", "int_parsing", "int_from_float"):
        return "must be a whole number"
    if kind in ("float_type", "float_parsing"):
        return "must be a number"
    if kind == "finite_number":
        return "must be a finite number"
    if kind in ("bool_type", "bool_parsing"):
        return "must be true or false"
    if kind == "string_type":
        return f"must be text, not {_kind(value)}"
    if kind == "list_type":
        if isinstance(value, str) and _SIMPLE_ITEM.fullmatch(value):
            return f"must be a list; for one item write [{value}]"
        return "must be a list" + (", not a mapping" if isinstance(value, dict) else "")
    if kind == "dict_type":
        return f"must be a mapping (key: value), not {_kind(value)}"
    if kind in ("model_type", "model_attributes_type", "dataclass_type"):
        known = _fields_at(model, tuple(item["loc"])) if model is not None else []
        listed = f" ({', '.join(known[:8])}{', ...' if len(known) > 8 else ''})" if known else ""
        return f"must be a mapping of fields{listed}, not {_kind(value)}"
    if kind in _BOUNDS and _BOUNDS[kind][0] in ctx:
        key, word = _BOUNDS[kind]
        bound = ctx[key]
        if isinstance(bound, int) and _is_size(model, tuple(item["loc"])):
            return f"must be {word} {format_size_mib(bound)}"
        return (
            f"must be {word} {bound:g}" if isinstance(bound, float) else f"must be {word} {bound}"
        )
    if kind == "too_short" and "min_length" in ctx:
        return f"needs at least {_items(ctx['min_length'])}"
    if kind == "too_long" and "max_length" in ctx and "actual_length" in ctx:
        return f"has {_items(ctx['actual_length'])}; at most {_items(ctx['max_length'])}"
    if kind in ("string_too_short", "string_too_long"):
        most = ctx.get("min_length" if kind == "string_too_short" else "max_length")
        word = "at least" if kind == "string_too_short" else "at most"
        return f"must be {word} {most} characters"
    if kind in ("literal_error", "enum") and "expected" in ctx:
        return f"must be {ctx['expected']}"
    message = str(item["msg"]).removeprefix("Value error, ").removeprefix("Assertion failed, ")
    return re.sub(r"^Input should be ", "must be ", message)


_BOUNDS = {
    "greater_than_equal": ("ge", "at least"),
    "greater_than": ("gt", "above"),
    "less_than_equal": ("le", "at most"),
    "less_than": ("lt", "below"),
}
"""Pydantic's kinds of bound errors: the key of the bound in the error, and its words."""


def _is_size(model: type[BaseModel] | None, loc: tuple[Any, ...]) -> bool:
    """Whether the field at `loc` holds a size in MiB (units.SizeMiB), so that its bounds and
    the value refused are said as sizes (`1MB`), not as counts of MiB."""
    field = _field_at(model, loc) if model is not None else None
    return field is not None and IN_MIB in field.metadata


def _kind(value: Any) -> str:
    if value is None:
        return "empty (null)"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return f"text {shown(value)}"
    return _read_as(value) if _is_scalar(value) else f"a {type(value).__name__}"


def _items(count: Any) -> str:
    return f"{count} item" + ("" if count == 1 else "s")


# ---- unions: one problem, not one per member of the union -----------------------------------


def _merged_unions(items: list[ErrorDetails], model: type[BaseModel] | None) -> list[ErrorDetails]:
    """The problems with union members' tags (`blocks.int`, `blocks.literal['auto']`) taken out
    of their places, those of one place merged: `must be a whole number or 'auto'`."""
    if model is None:
        return items
    merged: list[ErrorDetails] = []
    at: dict[tuple[Any, ...], int] = {}  # where the problem of a union's place is in `merged`
    for item in items:
        loc, tagged = _untagged(model, tuple(item["loc"]))
        if not tagged:
            merged.append(item)
            continue
        said = _said(item, model)
        if loc in at:
            before = merged[at[loc]]["msg"]
            merged[at[loc]]["msg"] = before + " or " + said.removeprefix("must be ")
            continue
        at[loc] = len(merged)
        merged.append(cast(ErrorDetails, {**item, "loc": loc, "msg": said, "type": "union"}))
    return merged


def _untagged(model: type[BaseModel], loc: tuple[Any, ...]) -> tuple[tuple[Any, ...], bool]:
    """`loc` without the tags pydantic puts after a union (`int`, `literal['auto']`), found by
    following the model's fields; whether there were any."""
    kept: list[Any] = []
    current: Any = model
    tagged = False
    for part in loc:
        current = _without_none(current)
        origin = typing.get_origin(current)
        if origin in (typing.Union, types.UnionType):  # this part names the member
            tagged = True
            found = [a for a in get_args(current) if getattr(a, "__name__", None) == part]
            current = found[0] if found else None
            continue
        kept.append(part)
        if isinstance(current, type) and issubclass(current, BaseModel):
            field = current.model_fields.get(part) if isinstance(part, str) else None
            current = field.annotation if field is not None else None
        elif origin in (list, dict) and part != "[key]":
            current = get_args(current)[-1]
        else:
            current = None
    return tuple(kept), tagged


def _without_none(annotation: Any) -> Any:
    """`X | None` as X: pydantic tags no member of it (it does with two or more besides None)."""
    args = get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return rest[0] if len(rest) == 1 else annotation
    return annotation


# ---- unknown fields -------------------------------------------------------------------------


def unknown_field(
    model: type[BaseModel] | None, loc: tuple[int | str, ...], *, list_known: bool = True
) -> str:
    """The message for a field the model does not have: the closest known name, or the known
    names (a few, once per message: `list_known`), when the model at that place is known."""
    known = _fields_at(model, loc[:-1]) if model is not None else None
    if not known:
        return "unknown field (check the spelling)"
    close = difflib.get_close_matches(str(loc[-1]), known, n=1, cutoff=0.6)
    if close:
        return f"unknown field; did you mean {close[0]}?"
    if not list_known:
        return "unknown field"
    listed = ", ".join(known[:12]) + (", ..." if len(known) > 12 else "")
    return f"unknown field (known here: {listed})"


def _fields_at(model: type[BaseModel], path: tuple[int | str, ...]) -> list[str]:
    """The field names of the model found at `path` inside `model` (list indexes and dict keys
    skipped), or [] when the path leads to no single model."""
    current: Any = model
    for part in path:
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            return []
        if isinstance(part, int) or part not in current.model_fields:
            continue  # an index into a list, or a key of a mapping: the same model below
        current = _model_in(current.model_fields[part].annotation)
    if isinstance(current, type) and issubclass(current, BaseModel):
        return [info.alias or name for name, info in current.model_fields.items()]
    return []


def _field_at(model: type[BaseModel], loc: tuple[Any, ...]) -> FieldInfo | None:
    """The field that `loc` ends at inside `model` (list indexes skipped), if it is a field."""
    current: Any = model
    found: FieldInfo | None = None
    for part in loc:
        found = None
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            return None
        if isinstance(part, int) or part not in current.model_fields:
            continue
        found = current.model_fields[part]
        current = _model_in(found.annotation)
    return found


def _model_in(annotation: Any) -> Any:
    """The one model type inside an annotation (X | None, list[X], dict[str, X]), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    models = {m for arg in get_args(annotation) if (m := _model_in(arg)) is not None}
    return models.pop() if len(models) == 1 else None


def _field(part: Any) -> str:
    """A part of a field's location as written, or quoted and shortened when it is odd (a key
    of 5,000 characters, or one holding a newline, is a typo or an attack)."""
    if isinstance(part, int) or (isinstance(part, str) and part.isprintable() and len(part) <= 40):
        return str(part)
    return shown(part)
