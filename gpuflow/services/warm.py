"""A control worker's warm view of the fleets: the Snapshot and the scheduler's index kept in
memory between placements, so a placement reads one row of change counters instead of the
whole fleet (docs/architecture.md, "Placement").

How it stays correct with any number of control workers on one database:

- Every write that changes what placement reads bumps a counter (changes.py) in its own
  transaction: `structure` (fleets, hosts, GPUs), `states` (readiness), `allocations`.
- A placement reads the counters inside the placement transaction, which holds the placement
  lock (BEGIN IMMEDIATE on SQLite, an advisory lock on PostgreSQL), and catches up on what
  moved: a moved `structure` reads everything again; `states` and `allocations` re-read the
  state rows and the allocations of the hosts the writes since logged (changes.py; every
  host's when the log lacks one of those versions); only the hosts whose usage differs are
  re-indexed.
  Allocations are only written under that lock, so the usage it places on is the database's.
- Before the allocation is written the chosen hosts' allocations are read again and compared
  (assume, then verify): a writer that did not count its change costs a retry, never a GPU
  given twice.
- This worker's own allocations are applied to memory as they are written; the counters it
  trusts move only when its transaction commits, and a rolled-back transaction drops the warm
  state (the next placement reads everything).
- Jobs have no counter: each placement transaction reads the job its fleet's window starts
  at and the token of the stored mix (mix.py `mix_in_use`: the newest few hundred job ids,
  from the jobs' index by submission; the whole window, ~5,000 ids, and its re-learning only
  at a new checkpoint job) and keeps the fleet's `workload` list, and so the scorer's prepared
  mix, until the mix in use changes. A transaction that enters several submits (group commit)
  reads it once. A fleet once seen with enough jobs that their number no longer moves its
  checkpoints is not counted again (until a comparison's window read finds it has fewer).

One warm state per engine (a Store), guarded by a lock held from the catch-up to the end of the
transaction, so threads of one worker never see each other's uncommitted changes.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import event
from sqlalchemy import select as sa_select
from sqlmodel import Session, col

from gpuflow.scheduler.index import index_of
from gpuflow.scheduler.mix import LearnedMix
from gpuflow.scheduler.model import HostSnapshot, Snapshot
from gpuflow.services.changes import PerHost, Versions, changed_hosts, read_versions
from gpuflow.services.mix import fleet_gpus, mix_in_use
from gpuflow.services.newest_jobs import JobCounts
from gpuflow.services.snapshot import (
    STATE_COLUMNS,
    Use,
    read_fleets,
    read_uses,
    set_usage,
    state_detail,
)
from gpuflow.status import HostState
from gpuflow.store.tables import HostRow

_HELD = "gpuflow_warm_held"
_COMMITTED = "gpuflow_warm_committed"
_CAUGHT_UP = "gpuflow_warm_caught_up"


class WarmCapacity:
    """The fleets as of `versions`, kept current by `catch_up` (see the module docstring)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.snapshot: Snapshot | None = None
        self.versions: Versions | None = None
        self.hosts: dict[str, HostSnapshot] = {}
        self.uses: dict[str, list[Use]] = {}
        self.states: dict[str, tuple[str, str | None, datetime | None]] = {}
        """Per host its state row as read (state, detail, last heartbeat): explanations
        word how long ago a lost host was heard at the time of each placement."""
        self.reloads = 0
        """How many times everything was read (for tests and the benchmark)."""
        self.partial_reads = 0
        """How many catch-ups read only the hosts the log named (states or allocations)."""
        self._pending: Versions | None = None
        self._unusual: set[str] = set()
        """Hosts whose detail a cold read words differently from the row (not ready, or a
        detail that `_refresh_details` has not copied yet): the only ones it looks at."""
        self._mixes: dict[str, tuple[int, LearnedMix | None]] = {}
        """Per fleet: its GPUs, and the mix its `workload` was last taken from."""
        self._counts = JobCounts()
        """Fleets with jobs enough that their count no longer moves the mix's checkpoints
        (mix.py `checkpoint_at`): not counted in every placement transaction."""

    def hold(self, session: Session) -> Versions | None:
        """Take the warm state for the caller's transaction (after it holds the placement
        lock) until the transaction ends. Returns the database's counters (None: no row)."""
        held = session.info.get(_HELD) is self
        if held:
            # caught up in this transaction, with its own changes counted since: the database's
            # counters, read once
            return self._pending if self._pending is not None else read_versions(session)
        versions = read_versions(session)  # the first statement: takes the database's lock
        self.lock.acquire()
        session.info[_HELD] = self
        session.info.pop(_COMMITTED, None)
        return versions

    def _end(self, committed: bool) -> None:
        """The holding transaction ended: trust what it wrote, or drop what it never wrote."""
        try:
            if self._pending is not None:
                if committed:
                    self.versions = self._pending
                else:
                    self.forget()
        finally:
            self._pending = None
            self.lock.release()

    def forget(self) -> None:
        self.snapshot, self.versions, self._pending = None, None, None
        self.hosts, self.uses, self.states = {}, {}, {}
        self._unusual, self._mixes, self._counts = set(), {}, JobCounts()

    def current(self, session: Session) -> Snapshot | None:
        """The snapshot, when this transaction caught up already: it holds the placement lock,
        under which alone allocations are written, so what it read stays what it places on
        (a transaction that enters several submits reads the counters and the mix once)."""
        snapshot = self.snapshot
        held = session.info.get(_HELD) is self and bool(session.info.get(_CAUGHT_UP))
        return snapshot if held else None

    def catch_up(self, session: Session, versions: Versions) -> Snapshot:
        """The warm snapshot, current as of `versions` (read in this transaction)."""
        known = self._pending or self.versions
        if self.snapshot is None or known is None or known.structure != versions.structure:
            self._reload(session)
        else:
            states_read = known.states != versions.states
            if states_read:
                self._read_states(session, known.states, versions.states)
            if known.allocations != versions.allocations:
                self._read_allocations(session, known.allocations, versions.allocations)
            self._refresh_details(states_read)
            self._refresh_mix(session)
        self._pending = versions
        session.info[_CAUGHT_UP] = True
        assert self.snapshot is not None
        return self.snapshot

    def track(self, versions: Versions) -> None:
        """Keep memory in step with this transaction's writes, without catching up: only when
        memory is current as it is (else the next `catch_up` reads what moved)."""
        if self._pending is None and self.snapshot is not None and self.versions == versions:
            self._pending = versions

    def verify(self, session: Session, host_ids: list[str]) -> bool:
        """Whether these hosts' allocations in the database are those in memory; when not,
        memory takes the database's and the answer is False (place again)."""
        found = read_uses(session, host_ids)
        current = True
        for host_id in host_ids:
            uses = found.get(host_id, [])
            if uses != self.uses.get(host_id, []):
                current = False
                self._set_uses(host_id, uses)
        return current

    def resync(self, session: Session, host_ids: list[str]) -> None:
        """Give these hosts the database's usage again, whatever memory holds (an admission
        pass changes the snapshot in memory as it decides, and commits only part of it)."""
        found = read_uses(session, host_ids)
        for host_id in host_ids:
            self._set_uses(host_id, found.get(host_id, []))

    def taken(self, host_id: str, use: Use) -> None:
        """An allocation this transaction wrote."""
        if self._pending is None:
            return
        self._set_uses(host_id, [*self.uses.get(host_id, []), use])

    def released(self, host_id: str, allocation_id: int) -> None:
        """An allocation this transaction deleted."""
        if self._pending is None:
            return
        uses = self.uses.get(host_id, [])
        self._set_uses(host_id, [use for use in uses if use[0] != allocation_id])

    def counted(self, allocations: int | None) -> None:
        """This transaction bumped the allocations counter to this value."""
        if self._pending is None:
            return
        if allocations is None:
            self.forget()
        else:
            self._pending = replace(self._pending, allocations=allocations)

    def _set_uses(self, host_id: str, uses: list[Use]) -> None:
        self.uses[host_id] = uses
        host = self.hosts.get(host_id)
        if host is None or self.snapshot is None:
            return
        set_usage(host, uses)
        index = index_of(self.snapshot)
        index.refresh(index.by_id[host_id])

    def _reload(self, session: Session) -> None:
        self.reloads += 1
        snapshot, uses, states = read_fleets(session)
        self.snapshot = snapshot
        self.hosts = {host.id: host for host in snapshot.hosts()}
        self.uses = {host_id: list(uses.get(host_id, [])) for host_id in self.hosts}
        self.states = {
            host_id: (row.state, row.state_detail, row.last_heartbeat)
            for host_id, row in states.items()
        }
        self._unusual = {
            host_id
            for host_id, (state, detail, _) in self.states.items()
            if state != HostState.READY or detail is not None
        }
        self._mixes = {fleet.name: (fleet_gpus(fleet), None) for fleet in snapshot.fleets}
        self._counts = JobCounts()  # a fleet's size decides how many jobs saturate it
        index_of(snapshot)  # built now, while the lock is held, not in the first `place`

    def _read_states(self, session: Session, since: int, upto: int) -> None:
        """The state rows of the hosts the log says changed after version `since` (see
        `_read_allocations`)."""
        query = sa_select(*STATE_COLUMNS)
        changed = self._changed(session, "states", since, upto)
        if changed is not None:
            query = query.where(col(HostRow.id).in_(sorted(changed)))
        for host_id, state, detail, beat in session.connection().execute(query):
            host = self.hosts.get(host_id)
            if host is not None:
                self.states[host_id] = (state, detail, beat)
                host.state = HostState(state)
                if state != HostState.READY or host.state_detail != detail:
                    self._unusual.add(host_id)

    def _refresh_details(self, states_read: bool) -> None:
        """Word each host's state as a cold read would now; static verdicts that quote a
        detail are dropped when one changed."""
        assert self.snapshot is not None
        now = datetime.now(UTC)
        changed = False
        for host_id in list(self._unusual):
            state, detail, beat = self.states[host_id]
            host = self.hosts[host_id]
            if state == HostState.READY and host.state_detail == detail:
                self._unusual.discard(host_id)  # worded as its row: nothing to do until read
                continue
            worded = state_detail(_StateRow(state, detail, beat), now)
            if worded != host.state_detail:
                host.state_detail = worded
                changed = True
        if changed or (states_read and index_of(self.snapshot).states_changed()):
            index = index_of(self.snapshot)
            index.static_memo.clear()
            index.refusals.clear()

    def _read_allocations(self, session: Session, since: int, upto: int) -> None:
        """The allocations of the hosts the log says changed after version `since`; of every
        host when it does not say, or names more than half of them (cheaper then)."""
        changed = self._changed(session, "allocations", since, upto)
        hosts: Iterable[str] = self.hosts if changed is None else changed
        found = read_uses(session, None if changed is None else sorted(changed))
        for host_id in hosts:
            uses = found.get(host_id, [])
            if uses != self.uses.get(host_id, []):
                self._set_uses(host_id, uses)

    def _changed(self, session: Session, change: PerHost, since: int, upto: int) -> set[str] | None:
        """The known hosts the log says writes of this kind changed after version `since`;
        None when it does not say, or names more than half of them (read every host's)."""
        changed = changed_hosts(session, change, since, upto)
        if changed is None or 2 * len(changed) > len(self.hosts):
            return None
        self.partial_reads += 1
        return changed & self.hosts.keys()

    def _refresh_mix(self, session: Session) -> None:
        """The fleets' mixes in use, read as a cold snapshot reads them (services/mix.py
        `mix_in_use`, which stores a new one in this placement transaction when the learned mix
        has drifted far enough). Until it changes the read returns the same mix and the fleet
        keeps its `workload` list, so what the scorer prepared for it is kept."""
        assert self.snapshot is not None
        for fleet in self.snapshot.fleets:
            gpus, known = self._mixes.get(fleet.name) or (fleet_gpus(fleet), None)
            mix = mix_in_use(session, fleet.name, gpus, self._counts)
            if mix is known:
                continue
            self._mixes[fleet.name] = (gpus, mix)
            requests = list(mix.requests)
            if requests != fleet.workload:
                fleet.workload = requests


class _StateRow:
    __slots__ = ("last_heartbeat", "state", "state_detail")

    def __init__(self, state: str, detail: str | None, beat: datetime | None) -> None:
        self.state, self.state_detail, self.last_heartbeat = state, detail, beat


@event.listens_for(Session, "after_commit")
def _committed(session: Session) -> None:
    if _HELD in session.info:
        session.info[_COMMITTED] = True


@event.listens_for(Session, "after_transaction_end")
def _ended(session: Session, transaction: Any) -> None:
    if transaction.parent is not None or _HELD not in session.info:
        return
    state = session.info.pop(_HELD)
    session.info.pop(_CAUGHT_UP, None)
    state._end(bool(session.info.pop(_COMMITTED, False)))


_WARM: weakref.WeakKeyDictionary[Any, WarmCapacity] = weakref.WeakKeyDictionary()
_WARM_LOCK = threading.Lock()


def warm_capacity(session: Session) -> WarmCapacity:
    """The warm state of the engine this session writes through (one per Store)."""
    engine = session.get_bind()
    with _WARM_LOCK:
        found = _WARM.get(engine)
        if found is None:
            found = _WARM[engine] = WarmCapacity()
        return found
