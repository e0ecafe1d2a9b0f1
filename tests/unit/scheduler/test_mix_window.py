"""The jobs a fleet's mix is learned from (gpuflow/scheduler/mix.py `window`): a function of the
jobs alone that moves only at checkpoint jobs."""

from __future__ import annotations

import zlib

from hypothesis import given
from hypothesis import strategies as st

from gpuflow.scheduler.mix import (
    CHECKPOINT_DRIFT,
    CHECKPOINT_REACH,
    checkpoint_every,
    effective_jobs,
    is_checkpoint,
    saturation,
    window,
    window_reads,
)


def _ids(count: int, start: int = 0) -> list[str]:
    """Job ids, oldest first."""
    return [f"job-{n}" for n in range(start, start + count)]


def test_a_young_fleet_s_window_is_every_job() -> None:
    ids = _ids(30)
    assert checkpoint_every(30, 64) == 1
    assert window(ids[::-1], 256, 64) == ids


def test_effective_jobs_is_the_decayed_count() -> None:
    assert effective_jobs(1, 64) == 1
    assert abs(effective_jobs(64, 64) - sum(2 ** (-a / 64) for a in range(64))) < 1e-9
    every = checkpoint_every(5000, 6212)
    assert every == int(CHECKPOINT_DRIFT * effective_jobs(5000, 6212)) and every > 40


def test_the_window_ends_at_the_newest_checkpoint_and_holds_limit_jobs() -> None:
    limit, life = 1000, 1000.0
    every = checkpoint_every(limit, life)
    ids = _ids(limit + CHECKPOINT_REACH * every)
    assert window_reads(limit, life) == len(ids)
    newest_first = ids[::-1]
    found = window(newest_first, limit, life)
    assert len(found) == limit
    assert is_checkpoint(found[-1], every)
    anchor = newest_first.index(found[-1])
    assert not any(is_checkpoint(job, every) for job in newest_first[:anchor])
    assert found == newest_first[anchor : anchor + limit][::-1]


def test_the_window_moves_only_at_checkpoints() -> None:
    """Jobs arrive one at a time: the window changes exactly when a checkpoint job arrives, about
    once per `every` jobs."""
    limit, life = 400, 400.0
    every = checkpoint_every(limit, life)
    assert every > 1
    history = _ids(limit + CHECKPOINT_REACH * every)
    before = window(history[::-1], limit, life)
    moves = 0
    arrivals = _ids(50 * every, start=len(history))
    for job in arrivals:
        history.append(job)
        now = window(history[-window_reads(limit, life) :][::-1], limit, life)
        assert (now != before) == is_checkpoint(job, every)
        moves += now != before
        before = now
    assert 25 <= moves <= 100  # about 50


def test_a_checkpoint_is_a_hash_of_the_job_id() -> None:
    assert is_checkpoint("anything", 1)
    every = 7
    for job in _ids(100):
        assert is_checkpoint(job, every) == (zlib.crc32(job.encode()) % every == 0)


def test_without_a_checkpoint_in_reach_the_newest_job_anchors() -> None:
    limit, life = 400, 400.0
    every = checkpoint_every(limit, life)
    plain = [job for job in _ids(20 * limit) if not is_checkpoint(job, every)]
    newest_first = plain[: window_reads(limit, life)][::-1]
    assert window(newest_first, limit, life) == newest_first[:limit][::-1]


@given(st.integers(1, 6000), st.integers(1, 20_000), st.integers(0, 7000))
def test_past_saturation_the_count_of_jobs_changes_no_checkpoint(
    limit: int, gpus: int, jobs: int
) -> None:
    """A count of jobs capped at `saturation` gives the checkpoints a count capped at the
    window's limit gives, and no smaller cap would (so a reader may stop counting there)."""
    life = float(max(64, gpus))
    enough = saturation(limit, life)
    assert 1 <= enough <= limit
    assert checkpoint_every(min(jobs, enough), life) == checkpoint_every(min(jobs, limit), life)
    if enough > 1:
        assert checkpoint_every(enough - 1, life) < checkpoint_every(limit, life)
