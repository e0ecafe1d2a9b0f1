"""The package layout (docs/architecture.md, "Packages"): imports run one way only. Each
package lists the gpuflow packages it may import; the test parses every module with `ast` (so
an import inside a function counts too) and fails on any other.

A host agent runs on GPU hosts with no database and no SSH; workflow code is deterministic and
replayed, so it holds no I/O library; the store is tables and reads, under the services that
decide over it; specs and the scheduler are pure."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import gpuflow

ROOT = Path(gpuflow.__file__).parent
SHARED = {
    "errors",
    "status",
    "naming",
    "config",
    "stack_record",
    "utilization",
    "secrets",
    "sealed",
    "payloads",
}
"""Small top-level modules any package may use (they import no package below)."""

ALLOWED: dict[str, set[str]] = {
    "specs": {"errors", "status", "naming"},
    "scheduler": {"specs", "errors", "status"},
    "store": {"config", "errors"},
    "services": {"store", "scheduler", "specs", "workflows"} | SHARED,
    "workflows": {"scheduler", "specs"} | SHARED,
    "agent": {"workflows", "specs", "metrics"} | SHARED,
    "ssh": {"workflows", "specs"} | SHARED,
    "metrics": {"store", "scheduler", "workflows"} | SHARED,
    "control": {"agent", "ssh", "services", "store", "scheduler", "specs", "workflows", "metrics"}
    | SHARED,
    "worker": {"agent", "control"},
    "client": {"specs", "scheduler", "workflows", "log_reader"} | SHARED,
    "cli": {"client", "specs", "scheduler", "workflows", "control", "agent", "log_reader"} | SHARED,
}
"""The client needs nothing but Temporal: it never reaches the store, the services, an agent or
SSH. The CLI talks through the client; it imports `control` only to start the embedded stack
(`gpuflow up`) and `agent` only for `gpuflow agent`, both lazily (tests/unit/
test_client_imports.py checks that loading the CLI loads neither)."""

FORBIDDEN_LIBRARIES = {
    "specs": {"sqlmodel", "sqlalchemy", "temporalio", "asyncssh", "pynvml"},
    "scheduler": {"sqlmodel", "sqlalchemy", "temporalio", "asyncssh", "pynvml"},
    "workflows": {"sqlmodel", "sqlalchemy", "asyncssh", "pynvml"},
    "agent": {"sqlmodel", "sqlalchemy", "asyncssh"},
    "store": {"temporalio", "asyncssh", "pynvml"},
}


def _imports(path: Path) -> set[str]:
    """Every module a file imports, as dotted names."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            if node.module == "gpuflow":  # `from gpuflow import secrets`
                found.update(f"gpuflow.{alias.name}" for alias in node.names)
    return found


def _package_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "gpuflow" or len(parts) < 2:
        return None
    return parts[1]


def _violations(package: str, root: Path = ROOT) -> list[str]:
    bad = []
    allowed = ALLOWED.get(package)
    for path in sorted((root / package).rglob("*.py")):
        for module in _imports(path):
            target = _package_of(module)
            if allowed is not None and target not in (None, package) and target not in allowed:
                bad.append(f"{path.relative_to(root.parent)} imports {module}")
            library = module.split(".")[0]
            if library in FORBIDDEN_LIBRARIES.get(package, set()):
                bad.append(f"{path.relative_to(root.parent)} imports {library}")
    return bad


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_imports_run_one_way(package: str) -> None:
    assert _violations(package) == []


def test_every_package_is_placed() -> None:
    """A new package must be given its rules (or stay at the top on purpose)."""
    top: set[str] = set()
    packages = {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()}
    assert packages - set(ALLOWED) - top == set()


def test_an_import_back_up_is_reported(tmp_path: Path) -> None:
    agent = tmp_path / "gpuflow" / "agent"
    agent.mkdir(parents=True)
    (agent / "x.py").write_text(
        "import sqlmodel\n"
        "from gpuflow import errors\n"
        "def later() -> None:\n"
        "    from gpuflow.control.worker import ControlWorker\n"
    )
    assert sorted(_violations("agent", tmp_path / "gpuflow")) == [
        "gpuflow/agent/x.py imports gpuflow.control.worker",
        "gpuflow/agent/x.py imports sqlmodel",
    ]


def test_a_host_agent_loads_no_database_or_ssh_library() -> None:
    """Transitively, not only by its own imports: what `python -m gpuflow.agent.main` loads."""
    probe = (
        "import sys, gpuflow.agent.main\n"
        "print(sorted(m for m in ('sqlmodel', 'sqlalchemy', 'asyncssh', 'gpuflow.store',"
        " 'gpuflow.services', 'gpuflow.control', 'gpuflow.ssh') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"
