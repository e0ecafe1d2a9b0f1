"""The typed Temporal contract between the workflows and the workers that serve them.

Workflows call activities by reference, never by a string: these stubs carry each activity's
registered name and its input and result types, so strict mypy checks every call, and a rename
shows in one place. Control activities run on the control worker (gpuflow.control.activities);
host activities run on each host's own task queue (gpuflow.agent.activities), the worker-specific
task queue pattern. tests/unit/test_contract.py checks that the control worker and the host agent
register exactly these names, with these signatures. The stubs are never run: a worker runs the
implementation registered under the same name.

Workflow code imports this module; it holds no I/O.
"""

from __future__ import annotations

from temporalio import activity

from gpuflow.workflows.models import (
    FleetHostsResult,
    FleetInput,
    HostHealthInput,
    HostHealthResult,
    JobStatusInput,
    LogChunk,
    LogsInput,
    OrphansResult,
    PlaceInput,
    PlaceResult,
    ProbeInput,
    ProbeResult,
    ProcessHandle,
    ProvisionInput,
    ProvisionResult,
    ReleaseInput,
    ReleaseOrphansInput,
    ReleaseResult,
    ReviveInput,
    ReviveResult,
    StartProcessInput,
    StopProcessInput,
    StopProcessResult,
)
from gpuflow.workflows.queue_models import (
    EnqueueInput,
    PassInput,
    PassResult,
    QueueVerdict,
    TellResult,
    WithdrawInput,
)


def _stub() -> NotImplementedError:
    return NotImplementedError("a contract stub: the worker runs the activity of the same name")


# ---- control activities (control task queue; place/release/record run as local activities) ----


@activity.defn(name="place_job")
async def place_job(inp: PlaceInput) -> PlaceResult:
    raise _stub()


@activity.defn(name="release_job")
async def release_job(inp: ReleaseInput) -> ReleaseResult:
    raise _stub()


@activity.defn(name="record_job_status")
async def record_job_status(inp: JobStatusInput) -> None:
    raise _stub()


@activity.defn(name="provision_host")
async def provision_host(inp: ProvisionInput) -> ProvisionResult:
    raise _stub()


@activity.defn(name="fleet_hosts")
async def fleet_hosts(inp: FleetInput) -> FleetHostsResult:
    raise _stub()


@activity.defn(name="revive_hosts")
async def revive_hosts(inp: ReviveInput) -> ReviveResult:
    raise _stub()


@activity.defn(name="record_host_health")
async def record_host_health(inp: HostHealthInput) -> HostHealthResult:
    raise _stub()


@activity.defn(name="find_orphans")
async def find_orphans(inp: FleetInput) -> OrphansResult:
    raise _stub()


@activity.defn(name="release_orphans")
async def release_orphans(inp: ReleaseOrphansInput) -> ReleaseResult:
    raise _stub()


@activity.defn(name="enqueue_job")
async def enqueue_job(inp: EnqueueInput) -> QueueVerdict:
    raise _stub()


@activity.defn(name="withdraw_job")
async def withdraw_job(inp: WithdrawInput) -> QueueVerdict:
    raise _stub()


@activity.defn(name="admission_pass")
async def admission_pass(inp: PassInput) -> PassResult:
    raise _stub()


@activity.defn(name="tell_jobs")
async def tell_jobs(inp: PassResult) -> TellResult:
    raise _stub()


# ---- host activities (each host's own task queue, served by its agent) -------------------------


@activity.defn(name="start_process")
async def start_process(inp: StartProcessInput) -> ProcessHandle:
    raise _stub()


@activity.defn(name="probe_process")
async def probe_process(inp: ProbeInput) -> ProbeResult:
    raise _stub()


@activity.defn(name="stop_process")
async def stop_process(inp: StopProcessInput) -> StopProcessResult:
    raise _stub()


@activity.defn(name="read_logs")
async def read_logs(inp: LogsInput) -> LogChunk:
    raise _stub()


@activity.defn(name="ping_host")
async def ping_host() -> str:
    raise _stub()


CONTROL_ACTIVITIES = (
    place_job,
    release_job,
    record_job_status,
    provision_host,
    fleet_hosts,
    revive_hosts,
    record_host_health,
    find_orphans,
    release_orphans,
    enqueue_job,
    withdraw_job,
    admission_pass,
    tell_jobs,
)
"""What the control worker registers."""

HOST_ACTIVITIES = (start_process, probe_process, stop_process, read_logs, ping_host)
"""What every host agent registers."""
