"""Masking secret values in log bytes before they leave the host, as CI systems do: every
occurrence of a value a job was given is replaced with `***`.

Log bytes are read in chunks, so a value may be cut by a chunk's end: the tail that could be the
start of a value is held back (not returned, not consumed) until the next read shows the rest,
or the job has ended and no rest can come.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from gpuflow.secrets import MIN_MASKED_LENGTH

MASK = b"***"


def maskable(values: Iterable[str]) -> list[bytes]:
    """The byte strings to mask for these secret values, longest first: each value, and each
    line of a multi-line value (a job that prints it line by line shows it that way), dropping
    any shorter than MIN_MASKED_LENGTH."""
    found: set[bytes] = set()
    for value in values:
        for part in (value, *value.splitlines()):
            part = part.strip("\r\n")
            if len(part) >= MIN_MASKED_LENGTH:
                found.add(part.encode())
    return sorted(found, key=len, reverse=True)


def mask(data: bytes, values: list[bytes], *, final: bool) -> tuple[bytes, int]:
    """`data` with every value replaced by MASK, and how many bytes of `data` that covers.

    Unless `final`, the longest tail of `data` after the last masked value that is a proper
    start of a value is left out (the count stops before it), and so is an unfinished UTF-8
    character: the next read starts there."""
    if not values:
        consumed = _whole_characters(data, final=final)
        return data[:consumed], consumed
    pattern = re.compile(b"|".join(re.escape(v) for v in values))
    last_end = 0
    for match in pattern.finditer(data):
        last_end = match.end()
    consumed = len(data)
    if not final:
        longest = max(len(v) for v in values) - 1
        for size in range(min(longest, len(data) - last_end), 0, -1):
            tail = data[len(data) - size :]
            if any(len(v) > size and v.startswith(tail) for v in values):
                consumed = len(data) - size
                break
        consumed = min(consumed, _whole_characters(data, final=False))
    return pattern.sub(MASK, data[:consumed]), consumed


def _whole_characters(data: bytes, *, final: bool) -> int:
    """How many bytes of `data` end on a whole UTF-8 character (all of it when `final`)."""
    if final:
        return len(data)
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte < 0x80:
            return len(data)  # ASCII: whole
        if byte >= 0xC0:  # a lead byte: is its sequence complete?
            needed = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return len(data) if back >= needed else len(data) - back
    return len(data)
