"""Cron expressions as gpuflow's schedules take them (gpuflow/client/schedules.py): Temporal's
grammar, checked before Temporal sees it, so that a mistake is one line in gpuflow's words that
names the flag or argument (`--cron`, `cron`), not the job file."""

from __future__ import annotations

import re

from gpuflow.errors import SpecError

__all__ = ["CRON_FIELDS", "check_cron"]

CRON_FIELDS = "5 fields: minute hour day-of-month month day-of-week"
_CRON_WORDS = ("@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly")
"""Temporal's shorthands for a 5-field cron (`@daily` is `0 0 * * *`)."""
_MONTHS = (
    *("january", "february", "march", "april", "may", "june", "july", "august"),
    *("september", "october", "november", "december"),
)
_DAYS = ("sunday", "monday", "tuesday", "wednesday", "thursday", "friday", "saturday")
_CRON_RANGES = (
    ("minute", 0, 59, "0-59"),
    ("hour", 0, 23, "0-23"),
    ("day of month", 1, 31, "1-31"),
    ("month", 1, 12, "1-12 or jan..dec"),
    ("day of week", 0, 7, "0-7 (0 and 7: Sunday) or sun..sat"),
)
"""Each field of a cron, in order: its name, its values and how they are written."""
_ZONE = re.compile(r"[A-Za-z0-9_+./-]{1,64}")


def check_cron(cron: str, *, name: str = "cron") -> str:
    """The cron expression as Temporal takes it (trimmed), or a one-line SpecError naming `name`
    (`--cron` for the CLI) and what to write: five fields in UTC, or one of Temporal's `@daily`
    shorthands, after an optional `CRON_TZ=<zone>`. An interval (`@every`) is refused: it could
    run more often than once a minute; `every` is the way to one. Temporal also takes 6 and 7
    fields (a year; seconds and a year), which gpuflow does not: seconds would run more often
    than once a minute, and a Quartz-style 6-field cron would be read with a year."""
    if not isinstance(cron, str):
        raise SpecError(f"{name} is text, e.g. '0 3 * * *', not {type(cron).__name__}")
    text = cron.strip()
    if not text:
        raise SpecError(f"{name} is empty: give {CRON_FIELDS}, e.g. '0 3 * * *'")
    body = text
    if body.startswith(("CRON_TZ=", "TZ=")):
        zone, _, body = body.partition(" ")
        _check_zone(zone.partition("=")[2], f"{name} {text!r}")
        body = body.strip()
    if body.lower().startswith("@every"):
        every = name.replace("cron", "every")  # the CLI's flag, or the client's argument
        raise SpecError(f"{name} {text!r}: an interval is given with {every}, not in {name}")
    if body in _CRON_WORDS:
        return text
    fields = body.split()
    if len(fields) != len(_CRON_RANGES):
        raise SpecError(f"{name}: {text!r} is not a cron expression ({CRON_FIELDS})")
    for field, (what, low, high, written) in zip(fields, _CRON_RANGES, strict=True):
        problem = _cron_field(field, what, low, high)
        if problem == "range":
            problem = f"the {what} must be {written}"
        if problem is not None:
            raise SpecError(f"{name} {text!r}: {problem}")
    return text


def _cron_field(field: str, what: str, low: int, high: int) -> str | None:
    """What is wrong with one field of a cron (`range`: a value outside low..high), None if
    nothing; Temporal's grammar: `*`, a value, `a-b`, each with an optional `/step`, and lists
    of them."""
    malformed = f"the {what} {field!r} is not *, a value, a range (1-5) or a step (*/15), or a list"
    for item in field.split(","):
        base, slash, step = item.partition("/")
        if slash and not step.isdigit():
            return malformed
        if slash and int(step) < 1:
            return f"the {what} step in {item!r} must be 1 or more"
        if base == "*":
            continue
        bounds = base.split("-")
        if len(bounds) > 2:
            return malformed
        values = [v for v in (_cron_value(bound, what) for bound in bounds) if v is not None]
        if len(values) < len(bounds):
            return malformed
        if any(not low <= value <= high for value in values):
            return "range"
        if len(values) == 2 and values[0] > values[1]:
            return f"the {what} range {base!r} goes down; write it low-high"
    return None


def _cron_value(text: str, what: str) -> int | None:
    """A value of a cron field: a number, or (Temporal's way) a month's first three or more
    letters, a day's first two or more; None if it is neither."""
    if text.isdigit():
        return int(text)
    lower = text.lower()
    if what == "month" and len(lower) >= 3:
        return next((i for i, month in enumerate(_MONTHS, 1) if month.startswith(lower)), None)
    if what == "day of week" and len(lower) >= 2:
        return next((i for i, day in enumerate(_DAYS) if day.startswith(lower)), None)
    return None


def _check_zone(zone: str, what: str) -> None:
    """A `CRON_TZ=` zone the time zone database knows (when this machine has one: else
    Temporal decides)."""
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

    if not _ZONE.fullmatch(zone):
        raise SpecError(f"{what}: CRON_TZ= takes a time zone name, e.g. Europe/Berlin")
    try:
        ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError):
        if available_timezones():
            raise SpecError(f"{what}: unknown time zone {zone!r}, e.g. Europe/Berlin") from None
