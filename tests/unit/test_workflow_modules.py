"""What lets control workers run gpuflow's workflows without the SDK's sandbox
(gpuflow/workflows/__init__.py `workflow_runner`): the tests check the workflow code in the
sandbox instead, so the modules with workflow code must be re-imported (and restricted) there,
never passed through; and no workflow module keeps mutable state at module level, which one run
could leave to the next once runs share the modules."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from gpuflow import workflows
from gpuflow.workflows import PASSTHROUGH_MODULES

WORKFLOWS = Path(workflows.__file__).parent
MODULES = sorted(p for p in WORKFLOWS.glob("*.py") if p.name != "__init__.py")


def _workflow_code(path: Path) -> bool:
    """Whether the module uses `temporalio.workflow` for anything but its imports: a workflow,
    or code that runs inside one (time, timers, activities, conditions, patches, details)."""
    return any(
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "workflow"
        and node.attr != "unsafe"
        for node in ast.walk(ast.parse(path.read_text()))
    )


def _passed_through(module: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in PASSTHROUGH_MODULES)


@pytest.mark.parametrize("path", [p for p in MODULES if _workflow_code(p)], ids=lambda p: p.stem)
def test_the_sandbox_of_the_tests_checks_every_module_with_workflow_code(path: Path) -> None:
    assert not _passed_through(f"gpuflow.workflows.{path.stem}")


def test_the_modules_with_workflow_code_are_the_ones_expected() -> None:
    """So the check above cannot pass by finding nothing."""
    found = {p.stem for p in MODULES if _workflow_code(p)}
    expected = {"job", "job_state", "phases", "steps", "admission", "api", "fleet", "logs"}
    assert expected <= found


_MUTABLE = (ast.List, ast.Dict, ast.Set, ast.ListComp, ast.DictComp, ast.SetComp)
_MUTABLE_CALLS = {"list", "dict", "set", "defaultdict", "deque", "Counter", "OrderedDict"}


def _mutable(value: ast.expr | None) -> bool:
    if isinstance(value, _MUTABLE):
        return True
    if isinstance(value, ast.Call):
        func = value.func
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
        return name in _MUTABLE_CALLS
    return False


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.stem)
def test_no_workflow_module_keeps_mutable_state_at_module_level(path: Path) -> None:
    tree = ast.parse(path.read_text())
    found = [
        f"{path.name}:{node.lineno}"
        for node in tree.body
        if isinstance(node, ast.Assign | ast.AnnAssign)
        and _mutable(node.value)
        and not (
            isinstance(node, ast.Assign)
            and all(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)
        )
    ]
    assert not found, f"module-level mutable state: {found}"
