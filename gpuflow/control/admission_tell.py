"""Telling the jobs what an admission pass decided, from the control worker that ran it: a
signal to each job's workflow, sent the moment the pass returns (a local activity of the
admission loop). A signal from the loop's own commands waits for the loop's next workflow task
and then for the server to deliver it, a hundred milliseconds or more on a busy machine, and
an admitted job starts that much later.

Telling twice changes nothing: a job takes a verdict only for its current attempt and only
while it waits."""

from __future__ import annotations

import asyncio
import logging

from temporalio import activity
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from gpuflow.workflows.queue_models import PassResult, TellResult, news_of

log = logging.getLogger(__name__)


class AdmissionTell:
    def __init__(self, temporal: Client | None) -> None:
        self.temporal = temporal

    @activity.defn(name="tell_jobs")
    async def tell_jobs(self, inp: PassResult) -> TellResult:
        """Signal every job the pass decided on, side by side; the jobs not told (a job whose
        workflow has ended needs nothing), which the loop then tells itself."""
        news = news_of(inp)
        if self.temporal is None:
            return TellResult(untold=[job_id for job_id, _, _ in news])
        temporal = self.temporal
        answers = await asyncio.gather(
            *(
                temporal.get_workflow_handle(job_id).signal(name, payload)
                for job_id, name, payload in news
            ),
            return_exceptions=True,
        )
        untold = []
        for (job_id, name, _), answer in zip(news, answers, strict=True):
            if answer is None or _ended(answer):
                continue
            log.warning("could not tell job %s %s: %s", job_id, name, answer)
            untold.append(job_id)
        return TellResult(untold=untold)


def _ended(error: BaseException) -> bool:
    return isinstance(error, RPCError) and error.status == RPCStatusCode.NOT_FOUND
