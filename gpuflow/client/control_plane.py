"""The client's calls that the control plane answers from its database or its own files:
fleets, offers and plans, secrets. Each is one update of the control plane's API workflow
(gpuflow/workflows/api.py); `Client` has them all."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from temporalio.client import Client as TemporalClient

from gpuflow.client.api import Api, named
from gpuflow.client.models import FleetInfo, JobEvents, OptionOffers, taken_option
from gpuflow.client.schedules import refuse_if_scheduled
from gpuflow.errors import SpecError
from gpuflow.scheduler import Offers
from gpuflow.scheduler.together import JobPlan
from gpuflow.sealed import seal
from gpuflow.specs.fleet import FleetSpec
from gpuflow.specs.job import JobSpec
from gpuflow.specs.load import model_of
from gpuflow.workflows.api import (
    Empty,
    SecretDeleted,
    SecretKey,
    SecretNames,
    SecretRef,
)
from gpuflow.workflows.api_dry_runs import (
    OffersRequest,
    OptionOffersRecord,
    PlanRecord,
    PlanRequest,
)
from gpuflow.workflows.api_events import EVENTS_PER_ANSWER, JobEventsRequest
from gpuflow.workflows.api_events import JobEvents as JobEventsRecord
from gpuflow.workflows.api_fleets import HOSTS_PER_PAGE, FleetRecord, FleetRef, FleetsPage

APPLY_TIMEOUT_S = 360.0
"""Reading an ssh fleet's hosts may take minutes (the activity's own limit is 5)."""


class ControlPlaneCalls:
    _api: Api
    temporal: TemporalClient

    async def events(self, job: str, *, most: int = 100) -> JobEvents:
        """The job's newest `most` recorded statuses with their words (every retry, wait,
        preemption and ending), oldest first; `total` says how many it has in all."""
        if not 1 <= most <= EVENTS_PER_ANSWER:
            raise SpecError(f"most must be 1..{EVENTS_PER_ANSWER}, not {most}")
        request = JobEventsRequest(ref=job, most=most)
        record = await self._api.call("job_events", request, JobEventsRecord)
        return JobEvents.model_validate(record.model_dump())

    # ---- fleets and offers ------------------------------------------------------------------

    async def apply_fleet(self, spec: FleetSpec | Mapping[str, Any]) -> FleetInfo:
        """Create or update the fleet, from a FleetSpec or the fields of one (a mapping, as a
        fleet file holds them). The control plane reads its hosts' facts (it holds the SSH
        keys; a `local` fleet is the control worker's own machine), starts its health checks
        and wakes the jobs waiting for capacity."""
        spec = model_of(FleetSpec, spec, "fleet")
        # Reading an ssh fleet's hosts may take minutes (the activity's own limit is 5).
        record = await self._api.call("apply_fleet", spec, FleetRecord, timeout_s=APPLY_TIMEOUT_S)
        if len(record.hosts) < len(spec.hosts):  # its first page: the rest in pages
            rest = await self._fleet_pages(spec.name, after=len(record.hosts))
            record.hosts += [host for found in rest for host in found.hosts]
        return FleetInfo.from_record(record)

    async def delete_fleet(self, name: str) -> None:
        """Delete a fleet that runs no job and that no waiting job needs; its health checks end."""
        await self._api.call("delete_fleet", FleetRef(name=named(name, "fleet")), type(None))

    async def fleets(self) -> list[FleetInfo]:
        records: dict[str, FleetRecord] = {}
        for found in await self._fleet_pages(None):
            known = records.setdefault(found.name, found)
            if known is not found:  # a fleet whose hosts go on from the last page
                known.hosts += found.hosts
        return [FleetInfo.from_record(record) for record in records.values()]

    async def _fleet_pages(self, fleet: str | None, *, after: int = 0) -> list[FleetRecord]:
        """The fleets' listing (one fleet's, when named) from host `after` on, read a page of
        HOSTS_PER_PAGE hosts at a time: a big fleet in one answer would pass Temporal's payload
        limit. A page that is not full is the last; one fuller than asked comes from a control
        worker older than pages, which answers the whole listing every time."""
        found: list[FleetRecord] = []
        while True:
            page = FleetsPage(fleet=fleet, after=after, most=HOSTS_PER_PAGE)
            records = await self._api.call("fleets", page, list[FleetRecord])
            hosts = sum(len(record.hosts) for record in records)
            if hosts > HOSTS_PER_PAGE:  # the whole listing, from a control worker without pages
                return records if after == 0 else found
            found += records
            if hosts < HOSTS_PER_PAGE:
                return found
            after += hosts

    async def offers(self, spec: JobSpec | Mapping[str, Any], *, most: int | None = None) -> Offers:
        """The dry run: what fits (with scores) and why every other host does not, for the
        resource option the job would take now (the first that fits anywhere; the first
        option when none does). `offers_per_option` has them all. `spec`: a JobSpec or its
        fields, as `submit` takes it."""
        per_option = await self.offers_per_option(spec, most=most)
        return (taken_option(per_option) or per_option[0]).offers

    async def offers_per_option(
        self, spec: JobSpec | Mapping[str, Any], *, most: int | None = None
    ) -> list[OptionOffers]:
        """The dry run of each resource option (`resources`, then `alternatives`), in the
        order a job tries them, all on one snapshot. At most `most` hosts that fit per option
        (best first), and never more than one answer may carry (workflows/api.py
        `ANSWER_LINES`): `fits_total` and `rejections_total` say what a long list left out."""
        if most is not None and most < 1:
            raise SpecError(f"most must be at least 1, not {most}")
        request = OffersRequest(spec=model_of(JobSpec, spec, "job"), most=most)
        records = await self._api.call("offers", request, list[OptionOffersRecord])
        return [OptionOffers.from_record(record) for record in records]

    async def plan(self, specs: Sequence[JobSpec | Mapping[str, Any]]) -> list[JobPlan]:
        """The jobs planned together, in order, on one snapshot of the fleets: what admission
        would do with each as it enters after the ones before it (`gpuflow apply -f a.yaml -f
        b.yaml`). Each a JobSpec or its fields, as `submit` takes it."""
        if isinstance(specs, str | bytes | Mapping) or not isinstance(specs, Sequence):
            raise SpecError(f"plan takes a list of jobs, not {type(specs).__name__}")
        request = PlanRequest(specs=[model_of(JobSpec, spec, "job") for spec in specs])
        records = await self._api.call("plan", request, list[PlanRecord])
        return [
            JobPlan(
                job=r.job,
                options=r.options,
                taken=r.taken,
                alone=r.alone,
                alone_fits=r.alone_fits,
                fits_idle=r.fits_idle,
                queue_never=r.queue_never,
                admitted=r.admitted,
                preempts=r.preempts,
                waits=r.waits,
                ahead=r.ahead,
                first=r.first,
            )
            for r in records
        ]

    # ---- secrets ------------------------------------------------------------------------------

    async def set_secret(self, name: str, value: str) -> None:
        """Store a secret with the control plane, for jobs to refer to as
        `${{ secrets.NAME }}`. The value is sealed to the control plane's key here: Temporal
        (payloads, history, UI) only ever sees its ciphertext (gpuflow/sealed.py)."""
        if not isinstance(name, str) or not isinstance(value, str):
            raise SpecError("a secret's name and value are text (str)")
        if not value:
            raise SpecError(f"secret {name}: the value is empty")
        key = await self._api.call("secret_key", Empty(), SecretKey)
        await self._api.call("set_secret", seal(name, value, key.public_key), type(None))

    async def secrets(self) -> list[str]:
        """The names of the stored secrets (never their values)."""
        return (await self._api.call("secret_names", Empty(), SecretNames)).names

    async def delete_secret(self, name: str, *, force: bool = False) -> bool:
        """Delete a secret; whether there was such a secret to delete. A secret that gpuflow's
        schedules' jobs refer to is refused (InUseError, naming them: their runs would fail)
        unless `force` (`schedules_needing(secret=name)` tells which first)."""
        if not force:
            await refuse_if_scheduled(self.temporal, secret=name)
        return (await self._api.call("delete_secret", SecretRef(name=name), SecretDeleted)).deleted
