"""The Temporal contract: the workflows call activities only through workflows.contract, and
the control worker and the host agent register exactly the names (and signatures) they call."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path
from typing import Any

import pytest
from temporalio.activity import _Definition

from gpuflow.agent.activities import HostAgent
from gpuflow.control.activities import ControlActivities
from gpuflow.store.db import Store
from gpuflow.workflows import contract
from tests.fake_sampler import FixedSampler

WORKFLOWS = Path(contract.__file__).parent
CALLS = {"execute_activity", "start_activity", "execute_local_activity", "control", "on_nodes"}


def _signatures(activities: Any) -> dict[str, tuple[Any, ...]]:
    found: dict[str, tuple[Any, ...]] = {}
    for fn in activities:
        defn = _Definition.must_from_callable(fn)
        assert defn.name is not None
        found[defn.name] = (tuple(defn.arg_types or ()), defn.ret_type)
    return found


def _called_by_workflows() -> set[str]:
    """Every `contract.<name>` a workflow module passes to an activity call; a string there
    fails the test (strict mypy could not see it renamed)."""
    called: set[str] = set()
    for path in WORKFLOWS.glob("*.py"):
        if path.name == "contract.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name not in CALLS:
                continue
            first = node.args[0]
            assert not isinstance(first, ast.Constant), f"{path.name}:{node.lineno} by string"
            if (
                isinstance(first, ast.Attribute)
                and isinstance(first.value, ast.Name)
                and first.value.id == "contract"
            ):
                called.add(first.attr)
    return called


def test_the_workers_register_exactly_what_the_workflows_call(
    sqlite_store: Store, tmp_path: Path
) -> None:
    control = _signatures(ControlActivities(sqlite_store).activities())
    agent = HostAgent(
        host_id="sim/h1", state_dir=tmp_path / "agent", sampler=FixedSampler(silent=True)
    )
    host = _signatures(agent.activities())
    assert control == _signatures(contract.CONTROL_ACTIVITIES)
    assert host == _signatures(contract.HOST_ACTIVITIES)
    stub_names = {fn.__name__: name for fn, name in _names(contract)}
    called = {stub_names[attr] for attr in _called_by_workflows()}
    assert called == set(control) | set(host)


def _names(module: Any) -> list[tuple[Any, str]]:
    stubs = [*module.CONTROL_ACTIVITIES, *module.HOST_ACTIVITIES]
    return [(fn, _Definition.must_from_callable(fn).name) for fn in stubs]


def test_a_stub_is_never_run() -> None:
    with pytest.raises(NotImplementedError):
        asyncio.run(contract.ping_host())
