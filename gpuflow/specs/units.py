"""Parsing of the small value grammars users write: durations, memory sizes and ranges."""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)\s*(d|h|m|s)")
_DURATION_SECONDS = {"d": 86400, "h": 3600, "m": 60, "s": 1}


def parse_duration(value: Any) -> int:
    """Seconds from `90`, `"90s"`, `"10m"`, `"1h30m"`, `"7d"`. Raises ValueError otherwise."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration; use e.g. 30s, 10m, 2h or 7d")
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError(f"{value!r} is negative; a duration must be at least 0")
        return int(value)
    if not isinstance(value, str):
        raise ValueError(f"{value!r} is not a duration; use e.g. 30s, 10m, 2h or 7d")
    text = value.strip().lower()
    if text.isdigit():
        return int(text)
    pos = 0
    total = 0.0
    for match in _DURATION_PART.finditer(text):
        if match.start() != pos and text[pos : match.start()].strip():
            break
        total += float(match.group(1)) * _DURATION_SECONDS[match.group(2)]
        pos = match.end()
    if pos == 0 or text[pos:].strip():
        raise ValueError(f"{value!r} is not a duration; use e.g. 30s, 10m, 2h or 7d")
    return int(total)


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


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(tb|gb|mb|t|g|m)?\s*$", re.IGNORECASE)
_SIZE_MIB = {"tb": 1024 * 1024, "t": 1024 * 1024, "gb": 1024, "g": 1024, "mb": 1, "m": 1}


def parse_size_mib(value: Any, *, default_unit: str = "gb") -> int:
    """MiB from `"80GB"`, `"512MB"`, `"1TB"` or a bare number in `default_unit` (GB = GiB)."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a size; use e.g. 24GB, 512MB or 1TB")
    if isinstance(value, int | float):
        return int(value * _SIZE_MIB[default_unit])
    if not isinstance(value, str) or not (match := _SIZE.match(value)):
        raise ValueError(f"{value!r} is not a size; use e.g. 24GB, 512MB or 1TB")
    unit = (match.group(2) or default_unit).lower()
    return int(float(match.group(1)) * _SIZE_MIB[unit])


def format_size_mib(mib: int) -> str:
    if mib >= 1024 * 1024 and mib % (1024 * 1024) == 0:
        return f"{mib // (1024 * 1024)}TB"
    if mib >= 1024:
        gib = mib / 1024
        return f"{gib:g}GB" if gib == int(gib) else f"{gib:.1f}GB"
    return f"{mib}MB"


class Range(BaseModel):
    """An inclusive range; `max=None` means unbounded. Written as `2`, `1..4`, `24GB..`, `..8`."""

    model_config = ConfigDict(frozen=True)

    min: float = 0
    max: float | None = None

    @model_validator(mode="after")
    def _ordered(self) -> Range:
        if self.min < 0:
            raise ValueError(f"range minimum {self.min:g} is negative")
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


def parse_range(value: Any, *, parse_one: Any = float) -> Range:
    """A Range from `2`, `"1..4"`, `"24GB.."`, `"..80GB"` or `{min:, max:}`."""
    if isinstance(value, Range):
        return value
    if isinstance(value, dict):
        # Numbers in the mapping form are already in the base unit (MiB, cores, GPUs): this is
        # also the form a Range serializes to, so it must read back unchanged.
        unknown = set(value) - {"min", "max"}
        if unknown:
            raise ValueError(f"a range takes only min and max, not {', '.join(sorted(unknown))}")

        def one(item: Any) -> float:
            return float(item) if isinstance(item, int | float) else float(parse_one(item))

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
