"""Inputs and outputs of the workflows and activities: single pydantic models, so they can grow
without breaking running workflows. Pure: imported by workflow code."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from gpuflow.naming import CONTROL_TASK_QUEUE
from gpuflow.scheduler.model import NodePlacement, Placement
from gpuflow.specs.job import JobSpec
from gpuflow.status import JobStatus, TerminationReason
from gpuflow.utilization import GpuSample, UtilizationState

__all__ = ["CONTROL_TASK_QUEUE"]


# ---- job workflow -------------------------------------------------------------------------


class JobResume(BaseModel):
    """What a job carries across continue-as-new while it is running. (Resumes written by
    earlier versions also carry `probe_since`, never read; pydantic ignores it.)"""

    attempt: int
    placement: Placement
    running_since: datetime
    utilization: UtilizationState
    probe_failures: dict[int, int] = Field(default_factory=dict)
    ticks: int = 0


class JobInput(BaseModel):
    job_id: str = ""
    """Empty means the workflow's own id (what a Temporal Schedule's runs need)."""
    spec: JobSpec
    submitted_at: datetime | None = None
    """Server time of the submission; the first run fills it in from its own start time, so
    retry deadlines never depend on a client's clock."""
    search_attributes: bool = True
    """Upsert gpuflow's search attributes (they must be registered on the server)."""
    resume: JobResume | None = None


class JobResult(BaseModel):
    job_id: str
    status: JobStatus
    reason: TerminationReason
    message: str
    attempts: int
    exit_codes: dict[int, int | None] = Field(default_factory=dict)
    name: str | None = None
    """The job's name (None from workflows before it was added)."""


class JobProgress(BaseModel):
    """What the `progress` query returns (the CLI's live view)."""

    job_id: str
    name: str
    status: JobStatus
    attempt: int
    placement: Placement | None = None
    reason: TerminationReason | None = None
    message: str = ""
    waiting_reasons: list[str] = Field(default_factory=list)
    simulated: bool = False


# ---- control activities -------------------------------------------------------------------


class JobStatusInput(BaseModel):
    job_id: str
    name: str
    status: JobStatus
    attempt: int
    event_key: str
    """Idempotency key of the event this update writes."""
    message: str = ""
    reason: TerminationReason | None = None
    placement: Placement | None = None
    at: datetime | None = None
    spec: JobSpec | None = None
    """Sent with the first record only, to create the job's row."""
    waiting_for_capacity: bool = False
    """Pending because nothing fits: freed capacity should wake this job."""


class PlaceInput(BaseModel):
    job_id: str
    attempt: int
    spec: JobSpec
    fleets: list[str] | None = None
    before: JobStatusInput | None = None
    """Recorded in the placement's transaction, before placing (the job's first record)."""
    placed: JobStatusInput | None = None
    """Recorded in the same transaction once placed, with the placement and `placed_message`;
    its event key gets the message appended."""


class PlaceResult(BaseModel):
    placement: Placement | None = None
    reasons: list[str] = Field(default_factory=list)


class ReleaseInput(BaseModel):
    job_id: str
    record: JobStatusInput | None = None
    """The job's ending, recorded in the release's transaction."""


class ReleaseResult(BaseModel):
    released_nodes: int
    waiting_jobs: list[str] = Field(default_factory=list)
    """Pending jobs to tell that capacity changed."""


class ProvisionInput(BaseModel):
    job_id: str
    host_id: str


class ProvisionResult(BaseModel):
    host_id: str
    ready: bool
    message: str = ""


# ---- fleet workflow -----------------------------------------------------------------------


class Revival(BaseModel):
    """An ssh host whose agent the health round started again and that has not answered since:
    its next try waits until `next_at` (workflows/revivals.py)."""

    tries: int
    next_at: datetime


class FleetInput(BaseModel):
    fleet: str
    health_interval_s: float | None = None
    """Seconds between health checks (and reconciliation passes); None is the default."""
    revivals: dict[str, Revival] = Field(default_factory=dict)
    """By host id, the hosts whose agent was restarted in vain: carried across continue-as-new,
    so a run that continues does not start their backoff over."""


class FleetHost(BaseModel):
    host_id: str
    name: str
    task_queue: str
    simulated: bool = False
    ssh: bool = False
    """The control plane starts this host's agent over SSH: the health round starts it again
    when it does not answer."""


class FleetHostsResult(BaseModel):
    hosts: list[FleetHost] = Field(default_factory=list)
    """Hosts whose agent should answer (declared states of simulated hosts are kept as is)."""
    deleted: bool = False


class HostPing(BaseModel):
    host_id: str
    answered: bool


class ReviveInput(BaseModel):
    fleet: str
    host_ids: list[str]


class ReviveResult(BaseModel):
    revived: list[str] = Field(default_factory=list)
    """Hosts whose agent runs now (started, or found running): worth a ping."""
    unreachable: list[str] = Field(default_factory=list)
    """Hosts marked unreachable, with the reason in their state detail."""


class HostHealthInput(BaseModel):
    fleet: str
    pings: list[HostPing]


class HostHealthResult(BaseModel):
    became_ready: list[str] = Field(default_factory=list)
    waiting_jobs: list[str] = Field(default_factory=list)


class OrphanNode(BaseModel):
    rank: int
    host_name: str
    task_queue: str


class Orphan(BaseModel):
    """One attempt of a job that holds capacity but is not live: its job ended or its workflow
    is closed. Reconciliation stops its processes, then releases it."""

    job_id: str
    attempt: int
    nodes: list[OrphanNode]
    message: str
    """Why, for the job's row when it had not ended, e.g. `workflow terminated outside gpuflow`."""
    job_ended: bool
    """The job's row was already final (then its status is kept)."""


class OrphansResult(BaseModel):
    orphans: list[Orphan] = Field(default_factory=list)
    checked: int = 0
    """How many held (job, attempt)s were looked at."""
    more: bool = False
    """Orphans were left out to keep the step small (control/reconcile.py
    `ORPHAN_NODES_PER_STEP`): ask again once these are released."""


class ReleaseOrphansInput(BaseModel):
    fleet: str
    orphans: list[Orphan]


# ---- host activities ----------------------------------------------------------------------


class ProbeInput(BaseModel):
    job_id: str
    attempt: int
    rank: int
    gpu_indices: list[int] = Field(default_factory=list)
    sample: bool = True
    wait_s: float = 0.0
    """Wait up to this long for the script to exit before answering (a long poll: the
    monitor asks for one tick, and the exit is answered the moment it happens)."""
    min_utilization: int | None = None
    """The job's utilization policy threshold: the probe answers with the readings it took
    while it waited where a GPU turned busy or idle (`utilization.readings_kept`), not only
    with a reading at the end."""


class ProbeResult(BaseModel):
    state: str
    """running, exited, stopped or missing."""
    exit_code: int | None = None
    leftovers: bool = True
    """After an exit: whether processes of the job's group outlived its script (then they are
    stopped at finalize). False only when the agent saw the group empty."""
    samples: list[GpuSample] = Field(default_factory=list)
    sample_error: str | None = None


class StartProcessInput(BaseModel):
    job_id: str
    attempt: int
    node: NodePlacement
    nodes: int
    master_address: str
    commands: list[str]
    env: dict[str, str] = Field(default_factory=dict)
    working_dir: str | None = None
    wait_s: float = 0.0
    """After starting, wait up to this long for the script to exit (see `ProcessHandle`)."""


class ProcessHandle(BaseModel):
    job_id: str
    attempt: int
    rank: int
    pid: int
    log_path: str
    already_running: bool = False
    started_at: datetime | None = None
    """When the agent started the process, by the host's clock."""
    exited: ProbeResult | None = None
    """The script's exit, when it ended within the start's `wait_s`: a command that fails at
    once (or a job that is done at once) is seen in the same step that started it."""


class StopProcessInput(BaseModel):
    job_id: str
    attempt: int
    rank: int
    grace_s: float = 10.0


class StopProcessResult(BaseModel):
    was_running: bool
    signal: str | None = None
    """TERM when the process exited within the grace period, KILL when it had to be killed."""


class LogsInput(BaseModel):
    job_id: str
    attempt: int | None = None
    rank: int = 0
    offset: int = 0
    limit: int = 256 * 1024
    wait_s: float = 0.0
    """How long the agent may wait for new bytes before answering with none (a follow)."""


class LogChunk(BaseModel):
    data: str
    next_offset: int
    attempt: int | None = None
    eof: bool = True


def placed_message(placement: Placement) -> str:
    """What a job's `provisioning` record says."""
    hosts = ", ".join(n.host_name for n in placement.nodes)
    return f"placed on {hosts} (fleet {placement.fleet})"


# What a host agent reports about its machine when it registers: the one GPU record shared
# from agent to control (the agent collects it, the services layer stores it).
class GpuFact(BaseModel):
    index: int
    name: str
    """Upper-case model, e.g. `H100`."""
    full_name: str = ""
    vendor: str = "nvidia"
    memory_mib: int
    uuid: str | None = None
    compute_capability: str | None = None


class HostFacts(BaseModel):
    os: str
    arch: str
    cpus: int
    memory_mib: int
    disk_mib: int
    gpus: list[GpuFact] = Field(default_factory=list)
    backend: str | None = None
    driver_version: str | None = None
    gpu_error: str | None = None
    """Why no GPU was found, when NVML could not be used (no driver, no library)."""
