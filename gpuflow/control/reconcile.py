"""Reconciliation: capacity held by a job that is not live any more is given back.

A job is live while its workflow runs; its own compensation releases what it holds. When the
workflow was closed from outside gpuflow (terminated, timed out, reset away, deleted), nothing
of it runs any more, so the fleet's health loop finds such allocations here, stops their
processes and releases them (docs/architecture.md, invariants 3 and 8).
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from gpuflow.services.capacity import HeldAttempt, HeldKey, held_page, release_attempt_in
from gpuflow.services.jobs import jobs_waiting_for_capacity, record_reconciled_in
from gpuflow.services.queue_entries import leave_queue_in
from gpuflow.status import TerminationReason
from gpuflow.store.db import Store
from gpuflow.workflows.models import (
    Orphan,
    OrphanNode,
    OrphansResult,
    ReleaseOrphansInput,
    ReleaseResult,
)

DESCRIBE_CONCURRENCY = 16
"""Describes in flight at once: a pass over hundreds of jobs costs the server little at a time."""
DESCRIBE_TIMEOUT = timedelta(seconds=5)

_CLOSED_MESSAGES = {
    WorkflowExecutionStatus.TERMINATED: "workflow terminated outside gpuflow",
    WorkflowExecutionStatus.TIMED_OUT: "workflow timed out (its execution or run timeout)",
    WorkflowExecutionStatus.FAILED: "workflow failed before releasing its GPUs",
    WorkflowExecutionStatus.CANCELED: "workflow cancelled before releasing its GPUs",
    WorkflowExecutionStatus.COMPLETED: "workflow completed without releasing its GPUs",
}
_MISSING = "workflow no longer exists in Temporal"
_ENDED = "the job had ended but still held GPUs"


def closed_message(status: WorkflowExecutionStatus | None) -> str | None:
    """Why a job whose workflow is in `status` (None: Temporal does not know it) holds nothing
    any more; None while its workflow is live (running, or just continued as new)."""
    if status is None:
        return _MISSING
    return _CLOSED_MESSAGES.get(status)


async def workflow_states(
    temporal: Client, workflow_ids: list[str]
) -> dict[str, WorkflowExecutionStatus | None]:
    """The status of each workflow's latest run, None for one Temporal does not know. A
    workflow whose describe fails otherwise is left out: it is looked at again next pass."""
    gate = asyncio.Semaphore(DESCRIBE_CONCURRENCY)
    states: dict[str, WorkflowExecutionStatus | None] = {}

    async def describe(workflow_id: str) -> None:
        async with gate:
            try:
                desc = await temporal.get_workflow_handle(workflow_id).describe(
                    rpc_timeout=DESCRIBE_TIMEOUT
                )
            except RPCError as exc:
                if exc.status == RPCStatusCode.NOT_FOUND:
                    states[workflow_id] = None
                return
            states[workflow_id] = desc.status or WorkflowExecutionStatus.RUNNING

    await asyncio.gather(*(describe(workflow_id) for workflow_id in workflow_ids))
    return states


def _orphan(held: HeldAttempt, message: str) -> Orphan:
    return Orphan(
        job_id=held.job_id,
        attempt=held.attempt,
        nodes=[
            OrphanNode(rank=n.rank, host_name=n.host_name, task_queue=n.task_queue)
            for n in held.nodes
        ],
        message=message,
        job_ended=held.ended,
    )


ORPHAN_NODES_PER_STEP = 500
"""Orphaned nodes one reconciliation step stops at most: the fleet's workflow stops them all at
once, and Temporal fails every workflow task that would leave more than 2,000 activities
pending. The step says when it left some out (`more`); the workflow then takes the next."""


async def find_orphans(
    store: Store, temporal: Client | None, *, fleet: str, after: HeldKey | None = None
) -> tuple[OrphansResult, HeldKey | None]:
    """The (job, attempt)s holding capacity in the fleet that are not live, among a page of
    them after `after` (services/capacity.py `held_page`), up to ORPHAN_NODES_PER_STEP nodes;
    and where the next look starts: here again while orphans were left out, else after this
    page (None: from the first). Jobs whose row has ended need no question to Temporal; the
    others' workflows are described, a few at once, unless ended jobs fill the step already.
    Without a Temporal client only ended jobs are found. `more` is set while orphans were left
    out, so that the fleet's workflow asks again at once; the next page waits for the next
    round, so a round describes at most a page's workflows (a fleet of 8,000 allocations is
    looked at in full every four rounds)."""
    held, following = await asyncio.to_thread(held_page, store, fleet=fleet, after=after)
    ended_nodes = sum(len(h.nodes) for h in held if h.ended)
    full = ended_nodes >= ORPHAN_NODES_PER_STEP  # the live ones wait for the next step
    asked = [] if full else sorted({h.job_id for h in held if not h.ended})
    states = await workflow_states(temporal, asked) if temporal is not None and asked else {}
    orphans = []
    for attempt in held:
        if attempt.ended:
            orphans.append(_orphan(attempt, _ENDED))
        elif attempt.job_id in states:
            message = closed_message(states[attempt.job_id])
            if message is not None:
                orphans.append(_orphan(attempt, message))
    kept: list[Orphan] = []
    nodes = 0
    for orphan in orphans:
        if kept and nodes + len(orphan.nodes) > ORPHAN_NODES_PER_STEP:
            break
        kept.append(orphan)
        nodes += len(orphan.nodes)
    left_out = len(kept) < len(orphans) or (full and any(not h.ended for h in held))
    found = OrphansResult(orphans=kept, checked=len(held), more=left_out)
    return found, (after if left_out else following)


def release_orphans(store: Store, inp: ReleaseOrphansInput) -> ReleaseResult:
    """Release each orphan's attempt and record why, in one placement transaction; a job that
    had not ended ends `terminated` / `workflow_closed`. Repeating it changes nothing."""
    with store.placement_transaction() as session:
        released = 0
        for orphan in inp.orphans:
            released += release_attempt_in(session, job_id=orphan.job_id, attempt=orphan.attempt)
            leave_queue_in(session, job_id=orphan.job_id, attempt=orphan.attempt)
            record_reconciled_in(
                session,
                job_id=orphan.job_id,
                attempt=orphan.attempt,
                reason=TerminationReason.WORKFLOW_CLOSED,
                message=orphan.message,
                event_message=(
                    f"{orphan.message}: gpuflow stopped its processes and released its GPUs "
                    f"(attempt {orphan.attempt}, fleet {inp.fleet})"
                ),
            )
    waiting = jobs_waiting_for_capacity(store) if released else []
    return ReleaseResult(released_nodes=released, waiting_jobs=waiting)
