"""pytest plugin: `nvml_stub`, a stub NVML library that nvidia-ml-py loads for real.

Register with `pytest_plugins = ["tests.nvml_stub.fixture"]`. The library is compiled once per
session; each test gets its own state file (two idle H100s until the test says otherwise), and
this process's gpuflow.agent.gpus is pointed at the stub through GPUFLOW_NVML_LIBRARY. A
subprocess uses it when given `stub.env()`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.nvml_stub import NvmlStub, StubBuildError, build_stub


@pytest.fixture(scope="session")
def nvml_stub_library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:
        return build_stub(tmp_path_factory.mktemp("nvml-stub"))
    except StubBuildError as exc:
        pytest.skip(str(exc))


@pytest.fixture
def nvml_stub(
    nvml_stub_library: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[NvmlStub]:
    import pynvml

    stub = NvmlStub(library=nvml_stub_library, state_file=tmp_path / "nvml-state.tsv")
    stub.set_gpus(2)
    for name, value in stub.env().items():
        monkeypatch.setenv(name, value)
    stub.load()
    bound = pynvml.nvmlLib
    yield stub
    # Give the process back the library it had (a real one on a GPU host, or none).
    with pynvml.libLoadLock:
        pynvml.nvmlLib = bound
        pynvml._nvmlGetFunctionPointer_cache.clear()
