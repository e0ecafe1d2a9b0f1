"""A job's status record as the workflows send it, written inside the caller's transaction."""

from __future__ import annotations

from sqlmodel import Session

from gpuflow.services.jobs import gpu_summary, record_status_in
from gpuflow.workflows.models import JobStatusInput


def record_in(session: Session, inp: JobStatusInput, *, unrecorded: bool = False) -> None:
    """The job's status and event, inside the caller's transaction. `unrecorded`: the caller
    knows it was not written yet (services/jobs.py `unrecorded_in`)."""
    placement = inp.placement
    record_status_in(
        session,
        job_id=inp.job_id,
        name=inp.name,
        spec=inp.spec.model_dump(mode="json") if inp.spec else None,
        status=inp.status,
        event_key=inp.event_key,
        attempt=inp.attempt,
        reason=inp.reason.value if inp.reason else None,
        message=inp.message,
        fleet=placement.fleet if placement else None,
        hosts=[n.host_name for n in placement.nodes] if placement else None,
        gpus=gpu_summary(placement) if placement else None,
        at=inp.at,
        waiting_for_capacity=inp.waiting_for_capacity,
        unrecorded=unrecorded,
    )
