"""The API's dry runs (gpuflow/workflows/api_dry_runs.py): where jobs would go, on a snapshot
of the fleets read for the purpose, each answer bounded to one Temporal payload (at most
ANSWER_LINES hosts over all its options in each list). `ApiActivities` has them."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from temporalio import activity

from gpuflow import secrets
from gpuflow.control.api_common import one_line
from gpuflow.control.api_queues import check_known
from gpuflow.scheduler import Snapshot, explain
from gpuflow.scheduler.quota import never_admitted
from gpuflow.scheduler.together import fits_when_idle, idle_fleets, plan_together
from gpuflow.services.capacity import read_snapshot
from gpuflow.services.preview import preview, preview_each
from gpuflow.services.queues import queues_in
from gpuflow.store.db import Store
from gpuflow.workflows.api_dry_runs import (
    OffersRequest,
    OptionOffersRecord,
    PlanRecord,
    PlanRequest,
    answer_lines,
)


class DryRunActivities:
    """Dry-run activities over the control worker's store."""

    store: Store
    home: Path
    """The control plane's home (its secrets file: a plan checks the jobs' references)."""

    @activity.defn(name="api_offers")
    @one_line
    async def offers(self, req: OffersRequest) -> list[OptionOffersRecord]:
        """Every resource option's fits (the best first, at most `req.most`) and rejections.
        Refused as the submit would be: an unknown queue or fleet, a secret not stored."""
        await check_known(
            self.store, queues=[req.spec.queue], fleets=req.spec.fleets, specs=[req.spec]
        )
        path = secrets.secrets_file(self.home)
        await asyncio.to_thread(secrets.check_stored, [req.spec.env], path)

        def read() -> list[OptionOffersRecord]:
            options = req.spec.resource_options()
            with self.store.read() as session:
                snapshot = read_snapshot(session)
                queues = queues_in(session)
                found = [explain(option, snapshot) for option in options]
                previews = preview_each(session, [[option] for option in options], snapshot)
            fates = [fate for (fate,) in previews]
            most = answer_lines(len(options))
            fits = most if req.most is None else min(req.most, most)
            idle: Snapshot | None = None
            records = []
            for k, (option, offers) in enumerate(zip(options, found, strict=True)):
                if offers.placement is None:
                    idle = idle or idle_fleets(snapshot)
                    ever = fits_when_idle([option], idle)
                    offers = offers.model_copy(update={"fits_idle": ever})
                never = never_admitted(queues, req.spec.queue, option)
                if never is not None:
                    offers = offers.model_copy(update={"queue_never": never})
                fate = fates[k]
                if fate.preempts:  # whether a host fits now or not
                    update = {"preempts": fate.preempts, "starts": fate.placement}
                    offers = offers.model_copy(update=update)
                elif offers.placement is not None and fate.waits is not None:
                    held = {"waits": fate.waits, "ahead": fate.ahead, "first": fate.first}
                    offers = offers.model_copy(update=held)
                records.append(
                    OptionOffersRecord(
                        option=k + 1,
                        gpu=option.resources.gpu_label,
                        offers=offers.bounded(most, fits=fits),
                    )
                )
            return records

        return await asyncio.to_thread(read)

    @activity.defn(name="api_plan")
    @one_line
    async def plan(self, req: PlanRequest) -> list[PlanRecord]:
        """The jobs planned together, in order: what an admission pass would do as each enters
        after the ones before it (services/preview.py), and each job's hosts as that leaves
        them."""
        fleets = list(dict.fromkeys(name for spec in req.specs for name in spec.fleets))
        await check_known(
            self.store, queues=[spec.queue for spec in req.specs], fleets=fleets, specs=req.specs
        )
        path = secrets.secrets_file(self.home)
        await asyncio.to_thread(secrets.check_stored, [spec.env for spec in req.specs], path)

        def read() -> list[PlanRecord]:
            with self.store.read() as session:
                queues = queues_in(session)
                fates = preview(session, req.specs)
                outcomes = [(fate.took, fate.freed) for fate in fates]
                plans = plan_together(req.specs, read_snapshot(session), outcomes)
            most = answer_lines(sum(len(p.options) for p in plans))
            return [
                PlanRecord(
                    job=p.job,
                    options=[offers.bounded(most) for offers in p.options],
                    taken=p.taken,
                    alone=p.alone,
                    alone_fits=p.alone_fits,
                    fits_idle=p.fits_idle,
                    queue_never=never_admitted(queues, p.job.queue, p.job),
                    admitted=fate.placement,
                    preempts=fate.preempts,
                    waits=fate.waits,
                    ahead=fate.ahead,
                    first=fate.first,
                )
                for p, fate in zip(plans, fates, strict=True)
            ]

        return await asyncio.to_thread(read)

    def dry_run_activities(self) -> list[Any]:
        return [self.offers, self.plan]
