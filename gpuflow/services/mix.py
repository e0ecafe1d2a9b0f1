"""A fleet's learned request mix, read from its recent jobs (gpuflow/scheduler/mix.py decides
how; this module only reads the jobs).

A fleet's jobs are those placed on it (JobRow.fleet) and those still pending without a fleet
(their requests are the ones its free capacity is kept for). What a job asked for is its spec's
first resource option as the scheduler reads it. The newest `WINDOW_HALF_LIVES` half-lives of
jobs up to the newest checkpoint job are read (scheduler/mix.py `window`), at most `MAX_JOBS`
rows; a job's spec is read once per process (a job's spec never changes), when it is first
read, so a checkpoint does not parse the jobs since the last one all at once, and only its
`resources` and `nodes` are parsed, once per distinct ask (`_kind_of_spec`). The mix of a
window is kept per fleet: until the next checkpoint a read returns the same LearnedMix object,
and the scorer keeps what it prepared for it.

The mix placements score with is not that learned mix itself but `mix_in_use`: the one a
placement transaction stored for the fleet (FleetMixRow), replaced by the learned mix once the
two differ by `DRIFT` (total variation), as `MixLearner.refreshed` replaces a scheduler's mix.
Every new mix costs the scorer what it prepared for the last one; the learned mix moves a
little at every checkpoint, the one in use only when it has really moved. Stored, the mix in
use is the same for every control worker and every cold read, without coordination beyond the
placement lock its writer holds.

The two are compared at every other checkpoint job (`checkpoint_at`; every DRIFT / 4 of the
effective history, as the pure function's `MixLearner.refreshed`): the stored row says at
which job they were compared last (`checked`, written by a placement transaction), so a
transaction reads several hundred job ids, and the window's thousands and their re-learning
only when a comparison is due. A change to older jobs of the window alone (a pending job
refused, a job deleted) is noticed at the next comparison.
"""

from __future__ import annotations

import json
import logging
import math
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import bindparam
from sqlalchemy import select as sa_select
from sqlmodel import Session, col, select

from gpuflow.scheduler.mix import (
    COMPARE_SPACING,
    DRIFT,
    Kind,
    LearnedMix,
    MixLearner,
    checkpoint_every,
    checkpoint_reads,
    drift,
    half_life,
    kind_of,
    newest_checkpoint,
    saturation,
    shares_of,
    window,
    window_reads,
)
from gpuflow.scheduler.model import FleetSnapshot, Snapshot, TypicalRequest
from gpuflow.services.newest_jobs import JobCounts, count_jobs, newest_few, newest_ids
from gpuflow.specs import JobSpec
from gpuflow.store.bulk import IDS_PER_STATEMENT
from gpuflow.store.db import PLACEMENT
from gpuflow.store.tables import FleetMixRow, JobRow

log = logging.getLogger(__name__)

WINDOW_HALF_LIVES = 4
"""Jobs older than this many half-lives weigh under 2**-4 each: not read."""
MAX_JOBS = 5000
"""Rows read per fleet and snapshot at most (every placement reads a snapshot)."""
FIRST_INTERVALS = 3
"""Checkpoint intervals of ids `checkpoint_at` reads first (of `CHECKPOINT_REACH`)."""

_KINDS: dict[str, dict[str, tuple[Kind, int] | None]] = {}
"""Per database: job id -> what the job asks per node, and for how many nodes (one shared
tuple per distinct ask: a full garbage collection walks a few hundred, not one per job)."""
_SHARED: dict[tuple[Kind, int], tuple[Kind, int]] = {}
_BY_ASK: dict[str, tuple[Kind, int] | None] = {}
"""`resources` and `nodes` of a stored spec, as JSON -> its kind (`_kind_of_spec`)."""
_MAX_ASKS = 10_000
_MAX_KINDS = 50_000
_MIXES: dict[tuple[str, str, float], tuple[list[str], LearnedMix]] = {}
"""(database, fleet, half-life) -> the window last learned from and its mix."""


def fleet_mix(
    session: Session, fleet: str, fleet_gpus: int, known: JobCounts | None = None
) -> LearnedMix:
    """The mix the fleet's recent jobs make (the built-in mix when there are none); the same
    object as the last read's while the jobs it was learned from are the same. `known`: see
    `checkpoint_at`; the window's ids make it exact again."""
    life = half_life(fleet_gpus)
    limit = _limit(life)
    newest = newest_ids(session, fleet, window_reads(limit, life))
    if known is not None:
        # the window reads at least `saturation` ids (it is at most the window's limit)
        known.seen(fleet, newest, saturation(limit, life))
    database = str(session.get_bind().engine.url)
    kinds = _read_kinds(session, database, newest)
    ids = window(newest, limit, life)  # oldest first
    key = (database, fleet, life)
    found = _MIXES.get(key)
    if found is not None and found[0] == ids:
        return found[1]
    learner = MixLearner(life)
    asked = [kinds.get(job_id, _UNREAD) for job_id in ids]
    # a job whose spec is not written yet: learn again next time
    complete = not any(kind is _UNREAD for kind in asked)
    learner.observe_all(kind for kind in asked if kind is not None and kind is not _UNREAD)
    mix = learner.mix()
    if complete:
        _MIXES[key] = (ids, mix)
    return mix


_UNREAD: Any = object()


def checkpoint_at(
    session: Session, fleet: str, fleet_gpus: int, known: JobCounts | None = None
) -> str:
    """The job at which the fleet's stored mix is compared with the learned one: the newest
    checkpoint job `COMPARE_SPACING` checkpoints apart (scheduler/mix.py `anchor`), "" for no
    jobs. Read from the newest several hundred ids (and, for a fleet with fewer jobs than a
    window holds, their number), not the window's thousands.

    `known`: what the caller (a control worker's warm state) knows of its fleets' numbers of
    jobs (newest_jobs.py `JobCounts`), so that the count is made only where that falls short; a
    cold reader counts."""
    life = half_life(fleet_gpus)
    limit = _limit(life)
    most = checkpoint_reads(limit, life)
    # The newest checkpoint job is about one interval back: the ids of `FIRST_INTERVALS` are
    # read first, the rest of the reach only when none of them is one (e**-3 of the time).
    first = min(most, FIRST_INTERVALS * checkpoint_every(limit, life) * COMPARE_SPACING)
    newest = newest_few(session, fleet, first)
    if not newest:
        return ""
    # Past `saturation` jobs the count no longer moves the anchor: counted up to there only,
    # and not at all when the ids read already reach it (a small fleet's every job counts).
    enough = saturation(limit, life)
    jobs = len(newest)
    if jobs == first and jobs < enough:
        jobs = count_jobs(session, fleet, newest, enough, known)
    jobs = min(jobs, enough)
    found = newest_checkpoint(newest, jobs, life, spacing=COMPARE_SPACING)
    if found is None and len(newest) == first < most:
        newest = newest_few(session, fleet, most)
        found = newest_checkpoint(newest, jobs, life, spacing=COMPARE_SPACING)
    return newest[found or 0]


def _limit(life: float) -> int:
    """The most jobs a window holds."""
    return min(MAX_JOBS, math.ceil(WINDOW_HALF_LIVES * life))


def _read_kinds(
    session: Session, database: str, job_ids: Sequence[str]
) -> dict[str, tuple[Kind, int] | None]:
    """The database's parsed kinds, after parsing the specs of these jobs not parsed yet."""
    kinds = _KINDS.setdefault(database, {})
    unknown = [job_id for job_id in job_ids if job_id not in kinds]
    if not unknown:
        return kinds
    if sum(map(len, _KINDS.values())) + len(unknown) > _MAX_KINDS:
        _KINDS.clear()
        _SHARED.clear()
        _BY_ASK.clear()
        kinds = _KINDS.setdefault(database, {})
        unknown = list(job_ids)
    for start in range(0, len(unknown), IDS_PER_STATEMENT):
        chunk = unknown[start : start + IDS_PER_STATEMENT]
        query = select(JobRow.id, JobRow.spec).where(col(JobRow.id).in_(chunk))
        for job_id, spec in session.exec(query).all():
            if spec:  # an empty spec may be written later: read it again then
                kinds[job_id] = _kind_of_spec(spec)
    return kinds


def note_specs(session: Session, specs: Mapping[str, JobSpec]) -> None:
    """Jobs whose rows the caller's transaction writes, with their specs as parsed: the mix
    reads their kinds without parsing the specs back from the rows. (Job ids are never reused
    for another spec, so a rolled-back write leaves nothing wrong behind.)"""
    kinds = _KINDS.setdefault(str(session.get_bind().engine.url), {})
    if sum(map(len, _KINDS.values())) + len(specs) > _MAX_KINDS:
        return  # `_read_kinds` starts afresh soon: it parses them then
    for job_id, spec in specs.items():
        kinds[job_id] = _kind_of_job(spec)


def _kind_of_spec(spec: object) -> tuple[Kind, int] | None:
    """What a stored spec asks per node: its `resources` and `nodes`, read as a job's are
    (nothing else of a spec changes its kind); None when they cannot be read (a spec written
    by another version, or not a mapping at all): the job is left out. Every reader, warm or
    cold, reads the same parts, and what an earlier spec asked is not parsed again (a fleet's
    jobs ask one of a few hundred things)."""
    if not isinstance(spec, Mapping):
        return None
    resources = spec.get("resources", {})  # none written: the default resources
    if not isinstance(resources, Mapping):
        return None
    nodes = spec.get("nodes", 1)
    ask = json.dumps([resources, nodes], sort_keys=True, default=str)
    if ask in _BY_ASK:
        return _BY_ASK[ask]
    try:
        job = JobSpec.model_validate(
            {"name": "ask", "commands": ["true"], "resources": resources, "nodes": nodes}
        )
    except ValueError:
        found = None
    else:
        found = _kind_of_job(job)
    if len(_BY_ASK) >= _MAX_ASKS:
        _BY_ASK.clear()
    _BY_ASK[ask] = found
    return found


def _kind_of_job(job: JobSpec) -> tuple[Kind, int] | None:
    """`kind_of`, as one tuple shared by every job that asks the same (a full garbage
    collection walks a few hundred, not one per job); None when it cannot be read."""
    try:
        kind = kind_of(job)
    except ValueError:
        return None
    return _SHARED.setdefault(kind, kind)


def fleet_gpus(fleet: FleetSnapshot) -> int:
    return sum(len(host.gpus) for host in fleet.hosts)


_STORED: dict[tuple[str, str], tuple[str, LearnedMix]] = {}
"""(database, fleet) -> the token of the stored mix last read and that mix."""
_DRIFTED: dict[tuple[str, str], tuple[LearnedMix, str, bool]] = {}
"""(database, fleet) -> the learned mix and stored token last compared, and whether they differ
by DRIFT (compared again only when either changes)."""


def mix_in_use(
    session: Session, fleet: str, fleet_gpus: int, known: JobCounts | None = None
) -> LearnedMix:
    """The mix placements on the fleet score with (see the module docstring): the stored one
    until the learned one has drifted from it by DRIFT, then the learned one, which a placement
    transaction stores. They are compared when the fleet's checkpoint job (`checkpoint_at`) is
    not the one they were last compared at; a placement transaction stores that it compared.
    The same object as the last call's while neither changed. `known`: see `checkpoint_at`."""
    database = str(session.get_bind().engine.url)
    key = (database, fleet)
    at = checkpoint_at(session, fleet, fleet_gpus, known)
    stored = _stored_mix(session, key)
    if stored is not None and stored[2] == at:
        return stored[1]  # compared at this checkpoint already
    learned = fleet_mix(session, fleet, fleet_gpus, known)
    if stored is not None:
        token, mix, _ = stored
        moved = False
        if learned.source == "learned":  # else no history (any more): the stored mix stays
            seen = _DRIFTED.get(key)
            if seen is not None and seen[0] is learned and seen[1] == token:
                moved = seen[2]
            else:
                # The stored side from its requests as stored, so every reader computes the same.
                moved = drift(shares_of(mix.requests), _shares(learned)) >= DRIFT
                _DRIFTED[key] = (learned, token, moved)
        if not moved:
            if session.info.get(PLACEMENT):
                _checked(session, key, token, at)
            return mix
    elif learned.source != "learned":
        return learned  # the built-in mix: nothing to store
    if session.info.get(PLACEMENT):
        _store(session, key, learned, at)
    return learned


def _shares(mix: LearnedMix) -> dict[Kind, float]:
    return mix.shares if mix.shares is not None else shares_of(mix.requests)


def _stored_mix(
    session: Session, key: tuple[str, str]
) -> tuple[str, LearnedMix, str | None] | None:
    """The fleet's stored mix, its token, and the checkpoint job it was last compared at (None
    when none is stored). Its token is read in every transaction; the mix itself only when the
    token is new to this process."""
    table = FleetMixRow.__table__.c  # type: ignore[attr-defined]
    row = session.connection().execute(_TOKEN, {"fleet": key[1]}).first()
    if row is None:
        return None
    token, checked = row
    found = _STORED.get(key)
    if found is not None and found[0] == token:
        return (*found, checked)
    # Columns, not the row: a row object in the session's identity map could be older.
    columns = sa_select(table.token, table.source, table.jobs, table.observed, table.requests)
    row = session.connection().execute(columns.where(table.fleet == key[1])).first()
    if row is None:  # deleted between the two reads (PostgreSQL reads committed rows)
        return None
    token, source, jobs, observed, items = row
    try:
        requests = tuple(_request_of(item) for item in items)
    except (TypeError, ValueError, AttributeError):
        # Written by another version in a form this one cannot read: as if none were stored,
        # so the next placement stores the learned mix in this one's form.
        log.warning("the stored mix of fleet %s is unreadable: learning it again", key[1])
        return None
    _STORED[key] = (token, LearnedMix(requests, source, jobs, observed))
    return (*_STORED[key], checked)


_MIX_COLUMNS = FleetMixRow.__table__.c  # type: ignore[attr-defined]
_TOKEN = sa_select(_MIX_COLUMNS.token, _MIX_COLUMNS.checked).where(
    _MIX_COLUMNS.fleet == bindparam("fleet")
)


def _checked(session: Session, key: tuple[str, str], token: str, at: str) -> None:
    """The stored mix (this token) was compared at checkpoint job `at`, in the caller's
    placement transaction."""
    table = FleetMixRow.__table__  # type: ignore[attr-defined]
    update = table.update().where(table.c.fleet == key[1], table.c.token == token)
    session.connection().execute(update.values(checked=at))


def _store(session: Session, key: tuple[str, str], mix: LearnedMix, at: str) -> None:
    """Make `mix` the fleet's stored mix, compared at checkpoint job `at`, in the caller's
    placement transaction."""
    row = session.get(FleetMixRow, key[1])
    if row is None:
        row = FleetMixRow(fleet=key[1], token="", source=mix.source)
    row.token = uuid.uuid4().hex
    row.source, row.jobs, row.observed = mix.source, mix.jobs, mix.observed
    row.requests = [request_json(item) for item in mix.requests]
    row.checked = at
    session.add(row)
    session.flush()
    # Read back by the token: a rolled-back write's token is never in the database.
    _STORED[key] = (row.token, mix)


def request_json(item: TypicalRequest) -> dict[str, Any]:
    """A request of a mix as JSON (stored, and shown by `gpuflow fleet list --json`)."""
    return {
        "weight": item.weight,
        "gpus": item.gpus,
        "gpu_fraction": item.gpu_fraction,
        "cpus": item.cpus,
        "memory_mib": item.memory_mib,
        "gpu_names": sorted(item.gpu_names),
    }


def _request_of(item: Mapping[str, Any]) -> TypicalRequest:
    """`request_json` read back."""
    return TypicalRequest(**{**item, "gpu_names": frozenset(item.get("gpu_names", ()))})


def forget_mix_in(session: Session, fleet: str) -> None:
    """The fleet is deleted: so is its stored mix."""
    row = session.get(FleetMixRow, fleet)
    if row is not None:
        session.delete(row)


def fill_workloads(session: Session, snapshot: Snapshot) -> None:
    """Give every fleet of the snapshot the mix in use."""
    for fleet in snapshot.fleets:
        fleet.workload = list(mix_in_use(session, fleet.name, fleet_gpus(fleet)).requests)


def mix_info(session: Session, fleet: FleetSnapshot) -> dict[str, Any]:
    """The fleet's mix as `gpuflow fleet list --json` shows it: where it comes from, how many
    jobs (decayed) went into it, and its requests by weight, heaviest first."""
    mix = mix_in_use(session, fleet.name, fleet_gpus(fleet))
    requests = sorted(mix.requests, key=lambda r: -r.weight)
    return {
        "source": mix.source,
        "jobs": round(mix.jobs, 2),
        "half_life_jobs": half_life(fleet_gpus(fleet)),
        "requests": [{**request_json(r), "weight": round(r.weight, 4)} for r in requests],
    }
