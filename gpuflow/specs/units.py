"""Parsing of the small value grammars users write (durations, memory sizes, ranges, versions)
and the bounds every value that enters gpuflow must keep.

Each grammar has one parser here, used by the job and fleet specs and the command-line flags
alike. Parsers take any value (whatever YAML or a caller produced) and either return a bounded,
finite value or raise ValueError with one short line; never another exception. Text is
length-checked before any regular expression sees it, and the expressions are linear.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, ValidationInfo, model_validator

from gpuflow.naming import RECORDED_KEY

MAX_DURATION_S = 366 * 86400
"""Longest duration anywhere (max_duration, retry.duration, --every): a year."""
MAX_SIZE_MIB = 1024**3
"""Largest size anywhere: 1 PiB (hosts' memory and disk, GPU memory, a job's ask)."""
MAX_MEMORY_MIB = 64 * 1024**2
"""Most memory of one host, and of one node of a job: 64 TiB (the largest machines sold have
32 TiB; a job asking more can never be placed, and is more likely a typo: 1000TB for 1000GB)."""
MAX_COUNT = 1_000_000
"""Largest count in a range (CPUs, GPUs) before a field's own, tighter bound."""
SHOWN_CHARS = 40
"""How much of a refused value a message shows."""

_SHORT_TEXT = 64
"""Longest duration, size or version text worth reading (`1d2h3m4s` is 8)."""
_DURATION = re.compile(r"([0-9]{1,9}(?:\.[0-9]{1,9})?)([dhms])")
_DURATION_SECONDS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
_VERSION = re.compile(r"[0-9]{1,6}(?:\.[0-9]{1,6}){0,3}")
_NUMBER = re.compile(r"[0-9]{1,15}(?:\.[0-9]{1,9})?")


def shown(value: Any) -> str:
    """`value` as a message shows it: its repr, on one line, at most SHOWN_CHARS + '…'."""
    if isinstance(value, str | bytes) and len(value) > 4 * SHOWN_CHARS:
        value = value[: 4 * SHOWN_CHARS]  # the repr of a huge value is never built
    elif isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return "a number of about " + str(int(value.bit_length() * 0.30103)) + " digits"
    elif isinstance(value, dict | list | tuple | set):
        items = "item" if len(value) == 1 else "items"
        return f"a {'mapping' if isinstance(value, dict) else 'list'} of {len(value)} {items}"
    try:
        text = repr(value)
    except Exception:  # a value without a readable repr is still refused in one line
        text = f"a {type(value).__name__}"
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + "…"


class _InMiB:
    """The mark of a size field (`SizeMiB`)."""

    def __repr__(self) -> str:
        return "IN_MIB"


IN_MIB = _InMiB()
SizeMiB = Annotated[int, IN_MIB]
"""An int field that holds a size in MiB, parsed from `80GB` and the like: a refusal of its
bounds says them as sizes (`at least 1MB`), as the file writes them (gpuflow/specs/messages.py)."""


def whole_count(value: Any, what: str, *, least: int | None = None, most: int | None = None) -> int:
    """A count written as a whole number (never a bool, a string or a float: `true` would read
    as 1 and `"2"` as 2) within `least..most`; one wording for a value of the wrong type and
    one out of range: ValueError `<value> is not a number of <what>; use a whole number, 1..8`."""
    if least is not None and most is not None:
        bounds = f", {least}..{most}"
    elif least is not None or most is not None:
        bounds = f", at least {least}" if least is not None else f", at most {most}"
    else:
        bounds = ""
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or (least is not None and value < least)
        or (most is not None and value > most)
    ):
        raise ValueError(f"{shown(value)} is not a number of {what}; use a whole number{bounds}")
    return value


def finite_number(value: Any, what: str) -> float:
    """A finite int or float (never a bool, a string or NaN); ValueError otherwise."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{what} {shown(value)} is not a number")
    if isinstance(value, int) and abs(value) > 2**53:
        raise ValueError(f"{what} {shown(value)} is too large")
    if not math.isfinite(value):
        raise ValueError(f"{what} {shown(value)} is not a finite number")
    return float(value)


def _short_text(value: str, what: str, example: str) -> str:
    if len(value) > _SHORT_TEXT:
        raise ValueError(f"{shown(value)} is not a {what}; use e.g. {example}")
    return value.strip().lower()


def parse_duration(
    value: Any, *, minimum: int = 0, maximum: int = MAX_DURATION_S, too_short: str = ""
) -> int:
    """Seconds from `90`, `"90s"`, `"10m"`, `"1h30m"`, `"7d"`, from `minimum` to `maximum` (a
    year); `too_short` is added to the refusal of a value below `minimum` (what it would mean)."""
    example = "30s, 10m, 2h or 7d"
    if isinstance(value, str):
        text = _short_text(value, "duration", example).replace(" ", "")
        if _NUMBER.fullmatch(text):
            seconds = float(text)
        else:
            parts = _DURATION.findall(text)
            if not parts or "".join(n + u for n, u in parts) != text:
                raise ValueError(f"{shown(value)} is not a duration; use e.g. {example}")
            seconds = sum(float(n) * _DURATION_SECONDS[u] for n, u in parts)
    elif isinstance(value, int) and not isinstance(value, bool) and value > maximum:
        seconds = float(maximum + 1)  # too large to be a float, and too long anyway
    else:
        try:
            seconds = finite_number(value, "duration")
        except ValueError:
            raise ValueError(f"{shown(value)} is not a duration; use e.g. {example}") from None
    if seconds < minimum or seconds < 0:
        if minimum <= 0:
            raise ValueError(f"{shown(value)} is negative; a duration must be at least 0")
        # A fraction of a second below the minimum is refused as written, not rounded up.
        raise ValueError(f"{shown(value)} is shorter than {format_duration(minimum)}{too_short}")
    if seconds > maximum:
        raise ValueError(f"{shown(value)} is longer than {format_duration(maximum)}")
    return int(seconds)


def format_duration(seconds: float) -> str:
    """`600` -> `10m`, `5400` -> `1h30m`, `45` -> `45s`."""
    seconds = int(seconds)
    if seconds == 0:
        return "0s"
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size:
            parts.append(f"{seconds // size}{unit}")
            seconds %= size
    return "".join(parts)


_SIZE = re.compile(r"([0-9]{1,15}(?:\.[0-9]{1,9})?)(tb|gb|mb|t|g|m)?")
_SIZE_MIB = {"tb": 1024 * 1024, "t": 1024 * 1024, "gb": 1024, "g": 1024, "mb": 1, "m": 1}


def parse_size_mib(value: Any, *, default_unit: str = "gb") -> int:
    """MiB from `"80GB"`, `"512MB"`, `"1TB"` or a bare number in `default_unit` (GB = GiB),
    from 0 to MAX_SIZE_MIB."""
    example = "24GB, 512MB or 1TB"
    if isinstance(value, str):
        text = _short_text(value, "size", example).replace(" ", "")
        if not (match := _SIZE.fullmatch(text)):
            raise ValueError(f"{shown(value)} is not a size; use e.g. {example}")
        number, unit = float(match.group(1)), (match.group(2) or default_unit)
    else:
        try:
            number, unit = finite_number(value, "size"), default_unit
        except ValueError:
            raise ValueError(f"{shown(value)} is not a size; use e.g. {example}") from None
    if number < 0:
        raise ValueError(f"size {shown(value)} is negative")
    mib = number * _SIZE_MIB[unit]
    if mib > MAX_SIZE_MIB:
        raise ValueError(f"size {shown(value)} is above {format_size_mib(MAX_SIZE_MIB)}")
    return int(mib)


def format_size_mib(mib: int) -> str:
    if mib >= 1024 * 1024 and mib % (1024 * 1024) == 0:
        return f"{mib // (1024 * 1024)}TB"
    if mib >= 1024:
        gib = mib / 1024
        return f"{gib:g}GB" if gib == int(gib) else f"{gib:.1f}GB"
    return f"{mib}MB"


def parse_count(value: Any, what: str = "count") -> float:
    """A finite, non-negative count (`2`, `"2"`, `0.5`) of at most MAX_COUNT."""
    if isinstance(value, str):
        text = value.strip()
        if not _NUMBER.fullmatch(text):
            raise ValueError(f"{what} {shown(value)} is not a number")
        number = float(text)
    else:
        number = finite_number(value, what)
    if number < 0:
        raise ValueError(f"{what} {shown(value)} is negative")
    if number > MAX_COUNT:
        raise ValueError(f"{what} {shown(value)} is above {MAX_COUNT}")
    return number


def parse_version(value: Any, what: str = "version") -> tuple[int, ...]:
    """`"535.104.05"` -> (535, 104, 5), `"8.0"` -> (8, 0): dot-separated ASCII numbers, so
    versions compare numerically. ValueError for anything else, numbers included (YAML reads
    535.40 as 535.4: a version belongs in quotes)."""
    if not isinstance(value, str):
        hint = "; put it in quotes" if isinstance(value, int | float) else ""
        raise ValueError(f"{what} {shown(value)} is not text{hint}, e.g. '535.104.05' or '8.0'")
    text = value.strip()
    if len(text) > _SHORT_TEXT or not _VERSION.fullmatch(text):
        raise ValueError(
            f"{what} {shown(value)} is not a version: write numbers joined by dots, "
            "e.g. 535.104.05 or 8.0"
        )
    return tuple(int(part) for part in text.split("."))


def readable_version(value: str | None) -> tuple[int, ...] | None:
    """The version's numbers, or None when it is missing or unreadable (stored host facts)."""
    if value is None:
        return None
    try:
        return parse_version(value)
    except ValueError:
        return None


def check_text(value: str, what: str, *, max_length: int, allow_empty: bool = False) -> str:
    """Text that can go anywhere: no NUL, at most `max_length` characters."""
    if not value and not allow_empty:
        raise ValueError(f"{what} is empty")
    if len(value) > max_length:
        raise ValueError(f"{what} {shown(value)} is longer than {max_length} characters")
    if "\x00" in value:
        raise ValueError(f"{what} {shown(value)} holds a NUL character")
    return value


MAX_TAINT_KEY = 253
MAX_TAINT_VALUE = 63
_TAINT_KEY = re.compile(r"(?:[A-Za-z0-9._-]+/)?[A-Za-z0-9._-]+")
_TAINT_VALUE = re.compile(r"[A-Za-z0-9._-]+")
TAINT_FORM = (
    f"key=value or key (letters, digits, '-', '_', '.'; the key at most {MAX_TAINT_KEY} "
    f"characters, after an optional prefix/; the value at most {MAX_TAINT_VALUE})"
)
"""A host's taint and a job's toleration, as Kubernetes spells taint keys and values: the
scheduler matches them as text (gpuflow/scheduler/filters.py), so one spelled otherwise
(`=x`, `a=b=c`, ` key`, `key=`) would never match anything."""


def check_taints(values: list[str], what: str, info: ValidationInfo) -> list[str]:
    """A fleet host's taints or a job's tolerations, each `key=value` or `key` (TAINT_FORM);
    ValueError naming the first that is not. A recorded one, written before the check, is read
    as it is."""
    if recorded(info):
        return values
    for value in values:
        key, sep, rest = value.partition("=")
        if len(key) > MAX_TAINT_KEY:
            problem = f"has a key longer than {MAX_TAINT_KEY} characters; it "
        elif len(rest) > MAX_TAINT_VALUE:
            problem = f"has a value longer than {MAX_TAINT_VALUE} characters; it "
        elif _TAINT_KEY.fullmatch(key) and (not sep or _TAINT_VALUE.fullmatch(rest)):
            continue
        else:
            problem = ""
        raise ValueError(f"{what} {shown(value)} {problem}must be {TAINT_FORM}")
    return values


class Range(BaseModel):
    """An inclusive range; `max=None` means unbounded. Written as `2`, `1..4`, `24GB..`, `..8`."""

    model_config = ConfigDict(frozen=True, allow_inf_nan=False)

    min: float = 0
    max: float | None = None

    @model_validator(mode="after")
    def _ordered(self) -> Range:
        if self.min < 0:
            raise ValueError(f"range minimum {self.min:g} is negative")
        if max(self.min, self.max or 0) > MAX_SIZE_MIB:
            raise ValueError(f"range {self} is above {MAX_SIZE_MIB}, the largest bound")
        if self.max is not None and self.max < self.min:
            raise ValueError(
                f"range {self.min:g}..{self.max:g} is empty: the minimum is above the maximum"
            )
        return self

    def contains(self, value: float) -> bool:
        return value >= self.min and (self.max is None or value <= self.max)

    def __str__(self) -> str:
        if self.max is not None and self.max == self.min:
            return f"{self.min:g}"
        return f"{self.min:g}..{'' if self.max is None else f'{self.max:g}'}"


def format_size_range(value: Range) -> str:
    """A size range as a file writes it: `24GB..80GB`, `16GB..`, `..80GB`, `80GB`."""
    lo = format_size_mib(int(value.min)) if value.min else ""
    hi = "" if value.max is None else format_size_mib(int(value.max))
    return lo if value.max == value.min else f"{lo}..{hi}"


def parse_range(value: Any, *, parse_one: Any = parse_count) -> Range:
    """A Range from `2`, `"1..4"`, `"24GB.."`, `"..80GB"` or `{min:, max:}`."""
    if isinstance(value, Range):
        return value
    if isinstance(value, dict):
        # Numbers in the mapping form are already in the base unit (MiB, cores, GPUs): this is
        # also the form a Range serializes to, so it must read back unchanged.
        unknown = set(value) - {"min", "max"}
        if unknown:
            names = ", ".join(sorted(shown(k) for k in unknown))
            raise ValueError(f"a range takes only min and max, not {names}")

        def one(item: Any) -> float:
            if isinstance(item, int | float) and not isinstance(item, bool):
                return finite_number(item, "range bound")
            return float(parse_one(item))

        lo, hi = value.get("min"), value.get("max")
        return Range(min=one(lo) if lo is not None else 0, max=one(hi) if hi is not None else None)
    if isinstance(value, str) and ".." in value:
        lo_text, _, hi_text = value.partition("..")
        return Range(
            min=parse_one(lo_text) if lo_text.strip() else 0,
            max=parse_one(hi_text) if hi_text.strip() else None,
        )
    one = parse_one(value)
    return Range(min=one, max=one)


def recorded(info: ValidationInfo) -> bool:
    """Whether the value is read back from where gpuflow recorded it (the `RECORDED`
    context: a workflow's history, the store), where checks of new input added since it was
    written do not apply (gpuflow/payloads.py)."""
    return isinstance(info.context, dict) and info.context.get(RECORDED_KEY) is True
