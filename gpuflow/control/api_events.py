"""The API's job events activity (gpuflow/workflows/api.py serves it): a job's recorded life for
`gpuflow describe`. `ApiActivities` has it."""

from __future__ import annotations

import asyncio
from typing import Any

from temporalio import activity

from gpuflow.control.api_common import one_line
from gpuflow.services.jobs import newest_events
from gpuflow.store.db import Store
from gpuflow.workflows.api_events import JobEventRecord, JobEvents, JobEventsRequest


class EventActivities:
    """Job event activities over the control worker's store."""

    store: Store

    @activity.defn(name="api_job_events")
    @one_line
    async def job_events(self, req: JobEventsRequest) -> JobEvents:
        job_id, rows, total = await asyncio.to_thread(newest_events, self.store, req.ref, req.most)
        events = [JobEventRecord(at=row.ts, status=row.kind, message=row.message) for row in rows]
        return JobEvents(job_id=job_id, events=events, total=total)

    def event_activities(self) -> list[Any]:
        return [self.job_events]
