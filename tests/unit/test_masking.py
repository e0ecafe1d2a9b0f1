"""Masking secret values in log bytes: every occurrence, values cut by a chunk's end, multi-line
values, and values too short to mask."""

from __future__ import annotations

from gpuflow.agent.masking import mask, maskable
from gpuflow.secrets import MIN_MASKED_LENGTH


def _read_in_chunks(data: bytes, values: list[bytes], size: int) -> bytes:
    """What a reader gets reading `data` `size` bytes at a time while it is still being
    written (never final), then once more at the end (final)."""
    out, offset = b"", 0
    while offset < len(data):
        masked, consumed = mask(data[offset : offset + size], values, final=False)
        out += masked
        offset += consumed
        if consumed == 0:  # all of it held back: the writer has not written more yet
            break
    masked, consumed = mask(data[offset:], values, final=True)
    return out + masked


def test_every_occurrence_is_masked() -> None:
    values = maskable(["hunter22"])
    masked, consumed = mask(b"a hunter22 b hunter22\n", values, final=True)
    assert (masked, consumed) == (b"a *** b ***\n", 22)


def test_a_value_cut_by_any_chunk_size_never_shows() -> None:
    value = "tok-0123456789"
    data = f"start {value} middle {value}{value} end tok-01 x".encode()
    for size in range(1, len(data) + 1):
        out = _read_in_chunks(data, maskable([value]), size)
        assert value.encode() not in out, size
        assert out == b"start *** middle ****** end tok-01 x", size


def test_only_a_possible_start_of_a_value_is_held_back() -> None:
    values = maskable(["secret-value"])
    masked, consumed = mask(b"output ends in secr", values, final=False)
    assert (masked, consumed) == (b"output ends in ", 15)
    masked, consumed = mask(b"output ends in sex", values, final=False)
    assert (masked, consumed) == (b"output ends in sex", 18)
    masked, consumed = mask(b"output ends in secr", values, final=True)
    assert consumed == 19  # the job has ended: nothing more can come


def test_a_multi_line_value_is_masked_whole_and_line_by_line() -> None:
    key = "-----BEGIN KEY-----\nabcdefgh\n-----END KEY-----"
    values = maskable([key])
    whole, _ = mask(f"key: {key}\n".encode(), values, final=True)
    assert whole == b"key: ***\n"
    lines, _ = mask(b"abcdefgh\r\n", values, final=True)
    assert lines == b"***\r\n"


def test_values_shorter_than_the_minimum_are_not_masked() -> None:
    short = "x" * (MIN_MASKED_LENGTH - 1)
    assert maskable([short, "abcd\nab"]) == [b"abcd\nab", b"abcd"]
    masked, _ = mask(f"{short} abcd".encode(), maskable([short, "abcd"]), final=True)
    assert masked == f"{short} ***".encode()


def test_the_longest_value_wins_where_values_overlap() -> None:
    values = maskable(["abcd", "abcdefgh"])
    masked, _ = mask(b"abcdefgh abcd", values, final=True)
    assert masked == b"*** ***"


def test_an_unfinished_utf8_character_waits_for_its_last_bytes() -> None:
    data = "café".encode()
    masked, consumed = mask(data[:-1], [], final=False)
    assert (masked, consumed) == (b"caf", 3)
    masked, consumed = mask(data, [], final=False)
    assert consumed == len(data)
