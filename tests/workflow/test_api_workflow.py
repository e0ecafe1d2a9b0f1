"""ControlApiWorkflow on the time-skipping server: each update answers through its control
activity over a real store; a malformed request is refused by the update's validator in one
line, before anything reaches the history; a secret's value never reaches the history."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio
from temporalio.api.enums.v1 import EventType
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from gpuflow import secrets
from gpuflow.client import Client
from gpuflow.client.api import TemporalApi
from gpuflow.control import api as api_module
from gpuflow.control import api_queues
from gpuflow.control.api import ApiActivities
from gpuflow.errors import GpuflowError, NotFoundError, SpecError
from gpuflow.payloads import DATA_CONVERTER
from gpuflow.services.jobs import job_events
from gpuflow.specs import FleetSpec, JobSpec, QueueSpec
from gpuflow.store.db import Store
from gpuflow.workflows import checked_workflow_runner
from gpuflow.workflows.api import ControlApiWorkflow
from tests.conftest import BIN

pytestmark = pytest.mark.asyncio(loop_scope="session")

FLEET = {
    "type": "fleet",
    "name": "sim",
    "kind": "sim",
    "hosts": [
        {"name": "a", "gpus": [{"name": "A100", "memory": "80GB", "count": 2}]},
        {"name": "b", "gpus": [{"name": "A100", "memory": "80GB", "count": 1}]},
    ],
}


@dataclass
class Api:
    client: Client
    env: WorkflowEnvironment
    workflow_id: str
    home: Path
    watched: list[str]
    woken: list[str]

    async def accepted_updates(self) -> int:
        handle = self.env.client.get_workflow_handle(self.workflow_id)
        history = await handle.fetch_history()
        return sum(
            e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED
            for e in history.events
        )


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def api_env() -> AsyncIterator[WorkflowEnvironment]:
    """A time-skipping server of this module's own. After these tests (updates answered and
    refused, workflows started from activities and terminated), the test server stopped
    skipping time for later tests of a shared one: their timers then ran in real time."""
    env = await WorkflowEnvironment.start_time_skipping(
        data_converter=DATA_CONVERTER,
        test_server_existing_path=str(BIN / "temporal-test-server"),
    )
    yield env
    await env.shutdown()


@pytest_asyncio.fixture(loop_scope="session")
async def api(
    api_env: WorkflowEnvironment,
    sqlite_store: Store,
    tmp_path: Path,
    task_queue: str,
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[Api]:
    home = tmp_path / "control"
    watched: list[str] = []
    woken: list[str] = []

    async def watch_fleet(_: object, fleet: str) -> None:
        # Health checks (FleetWorkflow) are not run here: a workflow left scheduled on a queue
        # nobody polls holds the test server's clock still for every later test.
        watched.append(fleet)

    async def wake_admission(_: object) -> bool:
        woken.append("admission")  # nor is the admission loop
        return True

    monkeypatch.setattr(api_module, "watch_fleet", watch_fleet)
    monkeypatch.setattr(api_module, "wake_admission", wake_admission)
    activities = ApiActivities(sqlite_store, api_env.client, home=home)
    workflow_id = f"gpuflow-api-{uuid.uuid4().hex[:6]}"
    async with Worker(
        api_env.client,
        task_queue=task_queue,
        workflows=[ControlApiWorkflow],
        activities=activities.activities(),
        workflow_runner=checked_workflow_runner(),
    ):
        transport = TemporalApi(api_env.client, task_queue=task_queue, workflow_id=workflow_id)
        client = Client(temporal=api_env.client, api=transport)
        yield Api(
            client=client,
            env=api_env,
            workflow_id=workflow_id,
            home=home,
            watched=watched,
            woken=woken,
        )
        with contextlib.suppress(RPCError):
            await api_env.client.get_workflow_handle(workflow_id).terminate("test over")


async def test_fleets_offers_and_plans_are_answered_by_the_control_plane(api: Api) -> None:
    applied = await api.client.apply_fleet(FleetSpec.model_validate(FLEET))
    assert applied.name == "sim" and [h["name"] for h in applied.hosts] == ["a", "b"]
    assert api.watched == ["sim"]  # its health checks were started
    assert api.woken == ["admission"]  # a waiting job may fit now: a pass, not the next rare one
    assert [f.name for f in await api.client.fleets()] == ["sim"]

    two = JobSpec(name="two", commands=["x"], resources={"gpu": "A100:2"})
    one = JobSpec(name="one", commands=["x"], resources={"gpu": "A100:1"})
    offers = await api.client.offers(two)
    assert offers.placement is not None and offers.placement.nodes[0].host_name == "a"
    assert any(str(r).startswith("b: ") for r in offers.rejections)
    # Planned together, `two` takes host a whole: `one` goes to b although a fits it alone.
    plans = await api.client.plan([two, one])
    assert [p.placement.nodes[0].host_name for p in plans if p.placement] == ["a", "b"]

    await api.client.delete_fleet("sim")
    assert await api.client.fleets() == []
    with pytest.raises(NotFoundError, match="no fleet named 'nope'"):
        await api.client.delete_fleet("nope")


async def test_a_bad_request_is_refused_by_its_validator_in_one_line(api: Api) -> None:
    await api.client.fleets()  # starts the workflow
    before = await api.accepted_updates()
    with pytest.raises(GpuflowError) as refused:
        await api.client.delete_fleet("  ")
    assert str(refused.value) == "fleet name is empty"
    with pytest.raises(GpuflowError) as refused:
        await api.client.delete_secret("no spaces please")
    assert str(refused.value) == (
        "secret name 'no spaces please' must be letters, digits, '_' or '-'"
    )
    with pytest.raises(GpuflowError, match="nothing to plan"):
        await api.client.plan([])
    # A job or a fleet as the fields a file holds: gpuflow's one-line errors, not pydantic's
    with pytest.raises(SpecError, match=r"^job: name: job name 'Bad Name' must start with a"):
        await api.client.submit({"name": "Bad Name", "commands": ["x"]})
    with pytest.raises(SpecError, match=r"comands: unknown field; did you mean commands\?$"):
        await api.client.submit({"name": "x", "comands": ["x"]})
    with pytest.raises(SpecError, match=r"^a job is a JobSpec or a mapping of its fields, not int"):
        await api.client.submit(42)  # type: ignore[arg-type]
    # the dry runs take what submit takes, refused the same way
    with pytest.raises(SpecError, match=r"comands: unknown field; did you mean commands\?$"):
        await api.client.offers({"name": "x", "comands": ["x"]})
    with pytest.raises(SpecError, match=r"comands: unknown field; did you mean commands\?$"):
        await api.client.plan([{"name": "x", "comands": ["x"]}])
    with pytest.raises(SpecError, match=r"^a job is a JobSpec or a mapping of its fields, not int"):
        await api.client.offers(42)  # type: ignore[arg-type]
    with pytest.raises(SpecError, match=r"^plan takes a list of jobs, not dict$"):
        await api.client.plan({"name": "x", "commands": ["x"]})  # type: ignore[arg-type]
    with pytest.raises(SpecError, match=r"^fleet: kind: "):
        await api.client.apply_fleet({"name": "x", "kind": "cloud"})
    with pytest.raises(SpecError, match=r"^a secret's name and value are text \(str\)$"):
        await api.client.set_secret("x", 123)  # type: ignore[arg-type]
    with pytest.raises(SpecError, match=r"^held is True or False, not 'yes'$"):
        await api.client.hold_admission("yes")  # type: ignore[arg-type]
    for call, what in (
        (api.client.get(None), "job"),  # type: ignore[arg-type]
        (api.client.set_priority(123, 5), "job"),  # type: ignore[arg-type]
        (api.client.delete_queue(None), "queue"),  # type: ignore[arg-type]
        (api.client.delete_fleet(7), "fleet"),  # type: ignore[arg-type]
    ):
        with pytest.raises(SpecError, match=f"^a {what} is named by text \\(str\\), not "):
            await call
    with pytest.raises(SpecError, match=r"^job: name: job name 'Bad Name' must start with a"):
        await api.client.schedule({"name": "Bad Name", "commands": ["x"]}, every_s=3600)
    # Refused before acceptance: nothing of them is in the history.
    assert await api.accepted_updates() == before
    assert (await api.client.offers({"name": "x", "commands": ["x"]})).fits == []  # a mapping


async def test_a_control_plane_refusal_keeps_its_type_and_line(api: Api) -> None:
    spec = JobSpec(name="lost", commands=["x"], fleets=["nowhere"])
    with pytest.raises(SpecError) as refused:
        await api.client.submit(spec)
    assert str(refused.value).startswith("fleets: nowhere not found")
    with pytest.raises(NotFoundError, match="no job named 'ghost'"):
        await api.client.get("ghost")
    asks = JobSpec(name="asks", commands=["x"], env={"T": "${{ secrets.nowhere }}"})
    for call in (api.client.plan([asks]), api.client.submit(asks)):  # said before it starts
        with pytest.raises(SpecError, match=r"^env: no secret named nowhere \(gpuflow secret"):
            await call


async def test_queues_are_applied_listed_and_deleted_by_the_control_plane(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    woken: list[object] = []

    async def wake_admission(temporal: object) -> bool:
        # No admission loop runs here (a workflow nobody serves would hold the clock still).
        woken.append(temporal)
        return True

    monkeypatch.setattr(api_queues, "wake_admission", wake_admission)
    spec = QueueSpec(name="research", gpus={"A100": 2}, cohort="lab", borrowing_limit=1)
    applied = await api.client.apply_queue(spec)
    assert applied.created and applied.queue.quota == {"A100": 2}
    again = await api.client.apply_queue(spec)
    assert (again.created, again.changed) == (False, False)
    as_fields = {"name": "research", "gpus": {"A100": 2}, "cohort": "lab", "borrowing_limit": 1}
    assert (await api.client.apply_queue(as_fields)).queue == applied.queue  # a mapping too
    with pytest.raises(
        SpecError, match=r"^queue research: gpus: must be a whole number of GPUs, not true$"
    ):
        await api.client.apply_queue({"name": "research", "gpus": True})
    with pytest.raises(SpecError, match=r"^a queue is a QueueSpec or a mapping of its fields"):
        await api.client.apply_queue(42)  # type: ignore[arg-type]
    queues = await api.client.list_queues()
    assert [(q.name, q.cohort, q.built_in) for q in queues] == [
        ("default", None, True),
        ("research", "lab", False),
    ]
    with pytest.raises(SpecError, match=r'^queue "nope" does not exist; known: default, res'):
        await api.client.submit(JobSpec(name="lost", commands=["x"], queue="nope"))
    before = await api.accepted_updates()
    with pytest.raises(SpecError) as refused:  # the input's fault, as the client's own checks
        await api.client.delete_queue(" ")
    assert str(refused.value).startswith("queue name ' ' must start with a letter")
    assert await api.accepted_updates() == before
    await api.client.delete_queue("research")
    with pytest.raises(NotFoundError, match=r'^queue "research" does not exist; known: default$'):
        await api.client.delete_queue("research")
    with pytest.raises(NotFoundError, match=r'^queue "research" does not exist; known: default$'):
        await api.client.jobs(queue="research")  # as `ps -q`, not an empty list
    assert len(woken) == 2  # the apply that changed the queue, and the delete


async def test_a_secret_reaches_the_control_plane_sealed(api: Api) -> None:
    value = f"tok-{uuid.uuid4().hex}"
    await api.client.set_secret("hf_token", value)
    assert await api.client.secrets() == ["hf_token"]
    assert secrets.load(secrets.secrets_file(api.home)) == {"hf_token": value}
    assert (api.home / "control-key").stat().st_mode & 0o777 == 0o600
    history = await api.env.client.get_workflow_handle(api.workflow_id).fetch_history()
    assert value not in history.to_json()
    assert await api.client.delete_secret("hf_token") is True
    assert await api.client.delete_secret("hf_token") is False
    assert await api.client.secrets() == []


async def test_a_submitted_job_is_in_its_queue_before_its_workflows_first_step(
    api: Api, sqlite_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Submitting records the job and puts it in its queue at once (no JobWorkflow runs here):
    alone in it, it is admitted there and then, so no later job can be admitted before it."""
    monkeypatch.setenv("GPUFLOW_SEARCH_ATTRIBUTES", "0")  # the test server has none
    await api.client.apply_fleet(FleetSpec.model_validate(FLEET))
    job = await api.client.submit(JobSpec(name="early", commands=["x"], fleets=["sim"]))
    try:
        assert job.id.startswith("job-early-") and job.status == "provisioning"
        assert (job.message or "").startswith("placed on ")
        seen = await api.client.get(job.id)
        assert (seen.id, seen.name, seen.status) == (job.id, "early", "provisioning")
        events = [e.message for e in job_events(sqlite_store, job.id)]
        assert events[0] == "submitted" and events[1].startswith("placed on ")
    finally:
        await api.env.client.get_workflow_handle(job.id).terminate("test over")


async def test_waiting_on_a_job_by_id_asks_temporal_not_the_control_plane(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`wait` awaits a job given by id on its workflow at once (no describe, no request to the
    control plane); only a name, or an id Temporal does not know, costs a request. A `wait`
    per job was half the API's requests in a burst."""
    monkeypatch.setenv("GPUFLOW_SEARCH_ATTRIBUTES", "0")  # the test server has none
    await api.client.apply_fleet(FleetSpec.model_validate(FLEET))
    job = await api.client.submit(JobSpec(name="waited", commands=["x"], fleets=["sim"]))
    try:
        before = await api.accepted_updates()
        with pytest.raises(TimeoutError):  # no JobWorkflow runs here: it never ends
            await api.client.wait(job.id, timeout_s=0.5)
        assert await api.accepted_updates() == before
        with pytest.raises(TimeoutError):
            await api.client.wait("waited", timeout_s=0.5)
        assert await api.accepted_updates() == before + 1
        with pytest.raises(NotFoundError, match="no job named 'job-nope'"):
            await api.client.wait("job-nope", timeout_s=0.5)
    finally:
        await api.env.client.get_workflow_handle(job.id).terminate("test over")


async def test_waiting_on_a_job_whose_workflow_was_terminated_names_the_job(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A workflow that ended without a JobResult (terminated from outside) is gpuflow's
    failure, said with the job's name (read from its memo only on this path)."""
    monkeypatch.setenv("GPUFLOW_SEARCH_ATTRIBUTES", "0")  # the test server has none
    await api.client.apply_fleet(FleetSpec.model_validate(FLEET))
    job = await api.client.submit(JobSpec(name="cut-short", commands=["x"], fleets=["sim"]))
    await api.env.client.get_workflow_handle(job.id).terminate("cut short")
    with pytest.raises(GpuflowError, match=r"^job cut-short failed inside gpuflow: "):
        await api.client.wait(job.id, timeout_s=5)


async def test_submit_and_job_are_answered_by_local_activities_and_replay(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A submit or a job lookup is a marker in the task that accepted it, no activity task; the
    history replays, and so does one recorded before (each request an activity task)."""
    import gzip

    from temporalio.client import WorkflowHistory
    from temporalio.worker import Replayer

    monkeypatch.setenv("GPUFLOW_SEARCH_ATTRIBUTES", "0")  # the test server has none
    await api.client.apply_fleet(FleetSpec.model_validate(FLEET))
    job = await api.client.submit(JobSpec(name="local", commands=["x"], fleets=["sim"]))
    try:
        assert (await api.client.get(job.id)).name == "local"
    finally:
        await api.env.client.get_workflow_handle(job.id).terminate("test over")
    history = await api.env.client.get_workflow_handle(api.workflow_id).fetch_history()
    scheduled = [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
    ]
    assert scheduled == ["api_apply_fleet"]  # submit and job ran locally
    markers = [e for e in history.events if e.HasField("marker_recorded_event_attributes")]
    assert len(markers) >= 2
    replayer = Replayer(
        workflows=[ControlApiWorkflow],
        workflow_runner=checked_workflow_runner(),
        data_converter=api.env.client.data_converter,
    )
    await replayer.replay_workflow(history)
    recorded = Path(__file__).parent / "histories" / "api-activities.json.gz"
    text = gzip.decompress(recorded.read_bytes()).decode()
    await replayer.replay_workflow(WorkflowHistory.from_json("gpuflow-api", text))
