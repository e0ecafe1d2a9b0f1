"""The job workflow's activity calls, with their timeouts and retries: control steps (local
activities on the control worker) and host steps (on a host's own task queue). Workflow code:
deterministic, called from JobWorkflow only."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from datetime import timedelta
from typing import TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, TimeoutType
from temporalio.exceptions import TimeoutError as ActivityTimeout

with workflow.unsafe.imports_passed_through():
    from gpuflow.scheduler.model import NodePlacement
    from gpuflow.workflows import contract
    from gpuflow.workflows.models import (
        ProbeInput,
        ProbeResult,
        StopProcessInput,
    )

CONTROL_TIMEOUT = timedelta(seconds=20)
"""Control steps are short database transactions; one stuck this long is retried."""
CONTROL_RETRY = RetryPolicy(maximum_interval=timedelta(seconds=30))
STOP_GRACE_S = 10.0
PROBE_UNTAKEN = timedelta(seconds=60)
"""How long a probe may wait for its host's agent to take it up (a live agent does within
moments): then it fails, and the next one is sent at once, so a host whose agent is gone is
lost after PROBE_FAILURES_BEFORE_LOST of these (3 minutes), not of whole ticks (10)."""
PROBE_SLACK = timedelta(seconds=20)
"""What a long-poll probe may take beyond its tick (scheduling, sampling, the answer)."""
PROBE_HEARTBEAT = timedelta(seconds=30)
"""A waiting probe's agent heartbeats within this (it does every second, throttled by the SDK)."""
_A = TypeVar("_A")
_R = TypeVar("_R")


async def control(activity: Callable[[_A], Awaitable[_R]], arg: _A, summary: str) -> _R:
    """A control step (place, release, record): a short idempotent database transaction, run
    as a local activity by the control worker that runs this workflow. Its result is recorded
    in the history as a marker, with no task queue round trip; a worker that dies in the middle
    is replaced by one that replays the workflow and runs the step again."""
    result: _R = await workflow.execute_local_activity(
        activity,
        arg,
        summary=summary,
        start_to_close_timeout=CONTROL_TIMEOUT,
        retry_policy=CONTROL_RETRY,
    )
    return result


async def on_nodes(
    activity: Callable[[_A], Awaitable[_R]],
    calls: Iterable[tuple[_A, str, str | None]],
    *,
    schedule_to_close_timeout: timedelta | None = None,
    schedule_to_start_timeout: timedelta | None = None,
    start_to_close_timeout: timedelta | None = None,
    heartbeat_timeout: timedelta | None = None,
    retry_policy: RetryPolicy | None = None,
) -> list[_R | BaseException]:
    """One activity on many nodes at once: each call is (input, summary, task queue; None for
    the control queue). Every answer or error, in the order of `calls`: one node's failure
    must not hide the others' answers."""
    answers: list[_R | BaseException] = await asyncio.gather(
        *(
            workflow.execute_activity(
                activity,
                arg,
                task_queue=queue,
                summary=summary,
                schedule_to_close_timeout=schedule_to_close_timeout,
                schedule_to_start_timeout=schedule_to_start_timeout,
                start_to_close_timeout=start_to_close_timeout,
                heartbeat_timeout=heartbeat_timeout,
                retry_policy=retry_policy,
            )
            for arg, summary, queue in calls
        ),
        return_exceptions=True,
    )
    return answers


async def wait_until(condition: Callable[[], bool], timeout: timedelta, summary: str) -> bool:
    """A durable timer that ends early when `condition` holds; True if it did."""
    try:
        await workflow.wait_condition(condition, timeout=timeout, timeout_summary=summary)
    except TimeoutError:
        return False
    return True


def _probe_input(
    job_id: str,
    attempt: int,
    node: NodePlacement,
    wait_s: float,
    min_utilization: int | None = None,
) -> ProbeInput:
    return ProbeInput(
        job_id=job_id,
        attempt=attempt,
        rank=node.rank,
        gpu_indices=list(node.gpu_indices),
        sample=bool(node.gpu_indices),
        wait_s=wait_s,
        min_utilization=min_utilization,
    )


async def long_poll(
    job_id: str,
    attempt: int,
    nodes: list[NodePlacement],
    tick: timedelta,
    stopped: Callable[[], bool],
    min_utilization: int | None = None,
) -> list[ProbeResult | BaseException | None]:
    """One look at every node in `nodes`: each probe waits on its agent up to `tick` for the
    node's script to exit, answers at once when it does, else at the tick with fresh samples
    (with `min_utilization`, the policy's threshold, also when the GPUs turned busy or idle);
    so an exit is seen within moments and no timer runs between looks. A stop (`stopped()`)
    cancels the probes and answers nothing; the agent learns it through its heartbeats, which
    also show that it is alive: a probe lost with a restarted agent is retried after
    PROBE_HEARTBEAT, not at the end of its tick. None for a node whose probe was cancelled
    because another node's answer ends the job."""
    handles = [
        workflow.start_activity(
            contract.probe_process,
            _probe_input(job_id, attempt, node, tick.total_seconds(), min_utilization),
            task_queue=node.task_queue,
            summary=f"watch {node.host_name}",
            start_to_close_timeout=tick + PROBE_SLACK,
            schedule_to_close_timeout=tick + 2 * PROBE_SLACK,
            schedule_to_start_timeout=PROBE_UNTAKEN,
            heartbeat_timeout=PROBE_HEARTBEAT,
            retry_policy=RetryPolicy(maximum_attempts=2),
        )
        for node in nodes
    ]

    def settled() -> bool:
        # All answered, or one answer ends the job anyway (a failed or vanished node): the
        # others need not wait out their tick.
        return all(h.done() for h in handles) or any(_ends_the_job(h) for h in handles)

    await workflow.wait_condition(lambda: stopped() or settled())
    waiting = [h for h in handles if not h.done()]
    for handle in waiting:
        handle.cancel()
    answers = await asyncio.gather(*handles, return_exceptions=True)
    if stopped():
        return []
    return [None if h in waiting else a for h, a in zip(handles, answers, strict=True)]


def _ends_the_job(handle: asyncio.Future[ProbeResult]) -> bool:
    if not handle.done() or handle.cancelled() or handle.exception() is not None:
        return False
    answer = handle.result()
    return answer.state == "missing" or (answer.state != "running" and answer.exit_code != 0)


async def probe_after_tick(
    job_id: str,
    attempt: int,
    nodes: list[NodePlacement],
    tick: timedelta,
    stopped: Callable[[], bool],
    *,
    first: bool,
) -> list[ProbeResult | BaseException]:
    """The look of histories from before long polls: a timer, then probes that answer at once
    (the first look has no timer and waits on the agent, a few seconds at most)."""
    if not first:
        await wait_until(stopped, tick, "monitor tick")
        if stopped():
            return []
    wait_s = tick.total_seconds() if first else 0.0
    return await on_nodes(
        contract.probe_process,
        (
            (
                _probe_input(job_id, attempt, node, wait_s),
                f"probe {node.host_name}",
                node.task_queue,
            )
            for node in nodes
        ),
        schedule_to_close_timeout=timedelta(seconds=20),
        retry_policy=RetryPolicy(maximum_attempts=2),
    )


async def stop_processes(job_id: str, attempt: int, nodes: list[NodePlacement]) -> None:
    """SIGTERM, grace, SIGKILL on every node in `nodes`; a lost host must not keep its GPUs
    allocated, so failures are ignored (the fleet reconciler settles what is left)."""
    await on_nodes(
        contract.stop_process,
        (
            (
                StopProcessInput(
                    job_id=job_id, attempt=attempt, rank=node.rank, grace_s=STOP_GRACE_S
                ),
                f"stop on {node.host_name}",
                node.task_queue,
            )
            for node in nodes
        ),
        schedule_to_close_timeout=timedelta(minutes=2),
        heartbeat_timeout=timedelta(seconds=30),
        retry_policy=RetryPolicy(maximum_attempts=3),
    )


def root_cause(error: BaseException) -> BaseException:
    """What an activity really failed with, under Temporal's ActivityError wrapper."""
    cause = error
    while isinstance(cause, ActivityError) and cause.cause is not None:
        cause = cause.cause
    return cause


def refused(error: BaseException) -> bool:
    """Whether an agent refused the step (a non-retryable error: the job's own fault)."""
    cause = root_cause(error)
    return isinstance(cause, ApplicationError) and cause.non_retryable


def failure_text(error: BaseException) -> str:
    cause = root_cause(error)
    if isinstance(cause, ActivityTimeout) and cause.type == TimeoutType.SCHEDULE_TO_START:
        return "its agent did not take the step up in time (is the host up, its agent running?)"
    return str(cause) or type(cause).__name__
