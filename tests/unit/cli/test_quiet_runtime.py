"""A command's Temporal runtime logs errors only: the SDK's warnings of each retried call (in
Rust's words, in colour) landed between a followed job's lines while Temporal restarted."""

from __future__ import annotations

import pytest
from temporalio.runtime import Runtime, TelemetryFilter

from gpuflow.cli import common


def test_a_command_sets_a_runtime_that_logs_errors_only_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    before = Runtime.default()
    made: list[TelemetryFilter] = []
    real = Runtime.__init__

    def spy(self: Runtime, *, telemetry: object) -> None:
        made.append(telemetry.logging.filter)  # type: ignore[attr-defined]
        real(self, telemetry=telemetry)  # type: ignore[arg-type]

    monkeypatch.setattr(Runtime, "__init__", spy)
    monkeypatch.setattr(common, "_quiet", [])
    try:
        common.quiet_temporal_runtime()
        common.quiet_temporal_runtime()
        assert made == [TelemetryFilter(core_level="ERROR", other_level="ERROR")]
        assert Runtime.default() is common._quiet[0]
    finally:
        Runtime.set_default(before, error_if_already_set=False)
