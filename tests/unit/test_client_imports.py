"""The client and the CLI need nothing but Temporal: importing them loads no database layer
(sqlmodel, SQLAlchemy), no SSH (asyncssh) and no NVML, so they run where none is installed or
reachable."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

SERVER_SIDE = ("sqlmodel", "sqlalchemy", "asyncssh", "pynvml")


@pytest.mark.parametrize(
    "modules",
    [
        ["gpuflow"],
        ["gpuflow.client"],
        ["gpuflow.cli.main", "gpuflow.cli.stack", "gpuflow.cli.follow", "gpuflow.cli.plan"],
    ],
)
def test_the_client_side_loads_no_server_side_module(modules: list[str]) -> None:
    code = (
        "import importlib, json, sys\n"
        f"for name in {modules!r}: importlib.import_module(name)\n"
        "import gpuflow\n"
        "gpuflow.Client, gpuflow.JobInfo, gpuflow.JobOutcome\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    ).stdout
    loaded = json.loads(out)
    assert "gpuflow.client" in loaded  # the check below looked at something real
    assert [m for m in loaded if m.split(".")[0] in SERVER_SIDE] == []
    assert [m for m in loaded if m.startswith(("gpuflow.store", "gpuflow.control"))] == []


def _gpuflow_classes(hint: object) -> set[type]:
    """The gpuflow classes in a type hint (`list[JobPlan]` -> {JobPlan})."""
    import typing

    found = {hint} if isinstance(hint, type) and hint.__module__.startswith("gpuflow") else set()
    for arg in typing.get_args(hint):
        found |= _gpuflow_classes(arg)
    return found


def test_what_each_client_call_returns_is_exported() -> None:
    """A user can name the type a call returns (`Client.offers` -> `Offers`): from `gpuflow`
    and from `gpuflow.client`, as the same class."""
    import inspect
    import typing

    import gpuflow
    import gpuflow.client
    from gpuflow.client import Client

    returned: set[type] = set()
    for name, method in inspect.getmembers(Client, inspect.isfunction):
        if not name.startswith("_"):
            returned |= _gpuflow_classes(typing.get_type_hints(method).get("return"))
    names = {cls.__name__ for cls in returned}
    assert {"Offers", "JobDescription", "UtilizationState", "JobPlan", "JobEvents"} <= names
    for cls in returned:
        assert cls.__name__ in gpuflow.__all__, cls
        assert cls.__name__ in gpuflow.client.__all__, cls
        assert getattr(gpuflow, cls.__name__) is cls
        assert getattr(gpuflow.client, cls.__name__) is cls
