"""The `gpuflow` command against a real store (SQLite in a temporary folder) and a fake Temporal
client, at 80 columns: what a user sees, without a server."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from typer.testing import CliRunner

from gpuflow.cli import common, main
from gpuflow.client import Client
from gpuflow.control.api import ApiActivities
from gpuflow.services.fleets import apply_fleet
from gpuflow.services.jobs import record_job
from gpuflow.specs.fleet import FleetSpec
from gpuflow.status import JobStatus
from gpuflow.store.db import Store
from gpuflow.store.tables import JobRow
from tests.local_api import LocalApi

WIDTH = 80


@dataclass
class FakeHandle:
    temporal: FakeTemporal
    workflow_id: str

    async def signal(self, name: str, *args: Any) -> None:
        said = f"{name}:{args[0]}" if name in ("hold", "set_priority") else name
        self.temporal.signals.append((self.workflow_id, said))
        if name == "hold":
            self.temporal.held = args[0]
        if name == "stop":  # the job's workflow stops it at once
            self.temporal.on_stop(self.workflow_id)

    async def query(self, query: Any, *_: Any) -> Any:
        assert query.__name__ == "held", query  # the admission loop's, asked by `ps`
        return self.temporal.held

    async def describe(self) -> Any:
        from temporalio.client import WorkflowExecutionStatus

        final = JobStatus(self.temporal.row(self.workflow_id).status).is_final
        status = WorkflowExecutionStatus.COMPLETED if final else WorkflowExecutionStatus.RUNNING
        return SimpleNamespace(status=status)

    async def result(self) -> Any:
        from gpuflow.workflows.models import JobResult

        row = self.temporal.row(self.workflow_id)
        return JobResult(
            job_id=row.id,
            status=JobStatus(row.status),
            reason=row.termination_reason or "done",
            message=row.message or "",
            attempts=row.attempt,
        )


@dataclass
class FakeScheduleHandle:
    temporal: FakeTemporal
    schedule_id: str

    async def describe(self) -> Any:
        """The schedule as Temporal describes it: its action's arguments as payloads."""
        from gpuflow.payloads import DATA_CONVERTER

        schedule = self.temporal.schedules[self.schedule_id]
        args = DATA_CONVERTER.payload_converter.to_payloads(schedule.action.args)
        action = dataclasses.replace(schedule.action, args=args)
        return SimpleNamespace(schedule=SimpleNamespace(action=action))

    async def delete(self) -> None:
        del self.temporal.schedules[self.schedule_id]


@dataclass
class FakeTemporal:
    """What the client asks of Temporal in these tests: start, signal, wait for a result."""

    store: Store
    started: list[str] = field(default_factory=list)
    signals: list[tuple[str, str]] = field(default_factory=list)
    admission_wakes: int = 0
    """Asks for an admission pass (gpuflow/control/admission_wake.py): no pass runs here."""
    held: bool = False
    """The admission loop is held (`gpuflow down`, `Client.hold_admission`)."""
    schedules: dict[str, Any] = field(default_factory=dict)
    """Schedule id -> the Schedule created (its runs never come here)."""

    async def create_schedule(self, schedule_id: str, schedule: Any, **_: Any) -> None:
        self.schedules[schedule_id] = schedule

    async def list_schedules(self, *_: Any, **__: Any) -> AsyncIterator[Any]:
        from temporalio.client import ScheduleListActionStartWorkflow

        async def listed() -> AsyncIterator[Any]:
            for schedule_id, schedule in list(self.schedules.items()):
                action = ScheduleListActionStartWorkflow(schedule.action.workflow)
                yield SimpleNamespace(id=schedule_id, schedule=SimpleNamespace(action=action))

        return listed()

    def get_schedule_handle(self, schedule_id: str) -> FakeScheduleHandle:
        return FakeScheduleHandle(self, schedule_id)

    @property
    def data_converter(self) -> Any:
        from gpuflow.payloads import DATA_CONVERTER

        return DATA_CONVERTER

    def get_workflow_handle(self, workflow_id: str, **_: Any) -> FakeHandle:
        return FakeHandle(self, workflow_id)

    def get_workflow_handle_for(self, _: Any, workflow_id: str, **__: Any) -> FakeHandle:
        return FakeHandle(self, workflow_id)

    async def start_workflow(self, workflow: Any, inp: Any, *, id: str, **options: Any) -> Any:
        if not isinstance(workflow, str):  # by reference to the class's run method
            workflow = workflow.__qualname__.split(".")[0]
        if workflow == "AdmissionWorkflow":
            if options.get("start_signal") == "hold":  # `gpuflow down` holds admission
                self.held = options["start_signal_args"][0]
                self.signals.append((id, f"hold:{self.held}"))
                return None
            self.admission_wakes += 1
            return None
        self.started.append(id)
        # What the job's workflow does in its first place step: record the job.
        spec = inp.spec.model_dump(mode="json")
        record_job(self.store, job_id=id, name=inp.spec.name, spec=spec)
        return SimpleNamespace(result_run_id=f"run-{id}")

    async def list_workflows(self, *_: Any, **__: Any) -> AsyncIterator[Any]:
        for _ in ():  # every started job is recorded at once: none open without a row
            yield _

    def row(self, job_id: str) -> JobRow:
        with self.store.read() as session:
            row = session.get(JobRow, job_id)
            assert row is not None
            return row

    def on_stop(self, job_id: str) -> None:
        with self.store.session() as session:
            row = session.get(JobRow, job_id)
            assert row is not None
            row.status = JobStatus.STOPPED
            row.termination_reason = "stopped_by_user"
            row.finished_at = datetime.now(UTC)
            session.add(row)
            session.commit()


@dataclass
class Cli:
    store: Store
    temporal: FakeTemporal
    runner: CliRunner
    tmp_path: Path

    def __call__(self, *args: str, code: int = 0, stdin: str | None = None) -> str:
        result = self.runner.invoke(main.app, list(args), env={"COLUMNS": str(WIDTH)}, input=stdin)
        assert result.exit_code == code, f"gpuflow {' '.join(args)} -> {result.exit_code}\n" + (
            result.output
        )
        assert "Traceback" not in result.output
        return result.output

    def streams(self, *args: str) -> tuple[str, str]:
        """What the command wrote to stdout and to stderr, apart."""
        result = self.runner.invoke(main.app, list(args), env={"COLUMNS": str(WIDTH)})
        assert result.exit_code == 0, result.output
        return result.stdout, result.stderr

    def fleet(self, yaml_text: str) -> None:
        import yaml

        apply_fleet(self.store, FleetSpec.model_validate(yaml.safe_load(yaml_text)), {})

    def job(
        self,
        name: str,
        status: JobStatus,
        *,
        suffix: str = "a1b2c3",
        minutes_ago: float = 1,
        priority: int = 0,
        message: str | None = None,
        hosts: list[str] | None = None,
        reason: str | None = None,
        ended_minutes_ago: float | None = None,
        queue: str | None = None,
    ) -> str:
        now = datetime.now(UTC)
        job_id = f"job-{name}-{suffix}"
        row = JobRow(
            id=job_id,
            name=name,
            status=status,
            message=message,
            spec={
                "name": name,
                "commands": ["true"],
                "priority": priority,
                **({"queue": queue} if queue is not None else {}),
            },
            hosts=hosts or [],
            fleet="sim" if hosts else None,
            gpus="A100:1" if hosts else None,
            termination_reason=reason,
            submitted_at=now - timedelta(minutes=minutes_ago),
            finished_at=(
                now - timedelta(minutes=ended_minutes_ago)
                if ended_minutes_ago is not None
                else None
            ),
        )
        with self.store.session() as session:
            session.add(row)
            session.commit()
        return job_id

    def write(self, name: str, text: str) -> str:
        path = self.tmp_path / name
        path.write_text(text)
        return str(path)


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Cli]:
    monkeypatch.setenv("GPUFLOW_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("COLUMNS", str(WIDTH))
    monkeypatch.delenv("GPUFLOW_TEMPORAL_ADDRESS", raising=False)
    # The module's consoles read the width when they are made: make them at 80 columns.
    monkeypatch.setattr(common, "console", common.new_console(width=WIDTH))
    monkeypatch.setattr(common, "err", common.new_console(stderr=True, width=WIDTH))
    url = f"sqlite:///{tmp_path / 'gpuflow.db'}"
    store = Store(url).init()
    temporal = FakeTemporal(store)

    async def connect() -> Client:
        home = tmp_path / "control"  # the control plane's: its key and secrets file
        activities = ApiActivities(Store(url).init(), temporal, home=home)  # type: ignore[arg-type]
        api = LocalApi(activities)
        return Client(temporal=temporal, api=api)  # type: ignore[arg-type]

    monkeypatch.setattr(common, "open_client", connect)
    yield Cli(store=store, temporal=temporal, runner=CliRunner(), tmp_path=tmp_path)
    store.dispose()


def lines_fit(output: str, width: int = WIDTH, *, help_text: bool = False) -> list[str]:
    lines = output.splitlines()
    too_wide = [line for line in lines if len(line) > width]
    assert not too_wide, f"lines wider than {width}:\n" + "\n".join(too_wide)
    assert "…" not in output, output
    padded = [line for line in lines if line != line.rstrip() and not help_text]
    assert not padded, "lines ending in spaces (Rich pads tables):\n" + "\n".join(padded)
    return lines


def column_rows(output: str, header: str) -> list[str]:
    """The text of the last column (`header`) of a table, one entry per row, wrapped lines
    joined: a row starts on a line whose first column is not blank."""
    lines = [line for line in output.splitlines() if line.strip()]
    top = next(k for k, line in enumerate(lines) if header in line)
    start = lines[top].index(header)
    rows: list[str] = []
    for line in lines[top + 1 :]:
        if "left out to fit; --json has every field)" in line:
            break  # the table's caption: the columns it left out
        text = line[start:].strip()
        if line[:start].split() and line[0] != " ":
            rows.append(text)
        elif rows:
            rows[-1] = (rows[-1] + " " + text).strip()
    return rows
