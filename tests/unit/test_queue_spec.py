"""Queue files (gpuflow/specs/queue.py): quotas, cohorts and limits, with one-line errors."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from gpuflow.specs import QueueSpec


def test_a_total_quota_and_a_per_model_quota() -> None:
    assert QueueSpec(name="research", gpus=16).quota == {"*": 16}
    spec = QueueSpec(name="research", gpus={"a100": 8, " T4 ": 4}, cohort="lab", lending_limit=2)
    assert spec.quota == {"A100": 8, "T4": 4}
    assert spec.borrowing_limit is None  # unlimited


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"gpus": -1}, "gpus is -1; it must be 0..1000000 GPUs"),
        ({"gpus": True}, "gpus True must be a whole number of GPUs"),
        ({"gpus": {"A100": 1.5}}, "gpus.A100 1.5 must be a whole number of GPUs"),
        ({"gpus": {"a100": 1, "A100": 2}}, "GPU model A100 is listed twice in gpus"),
        ({"gpus": 4, "borrowing_limit": 2}, "borrowing_limit needs a `cohort` to share with"),
        ({"gpus": 4, "cohort": "lab", "lending_limit": 9}, "lending_limit 9 is more than its"),
        ({"gpus": 4, "cohort": "lab", "borrowing_limit": -2}, "borrowing_limit is -2"),
        ({"gpus": 4, "cohort": "Lab"}, "cohort name 'Lab' must start with a letter"),
        ({"gpus": 4, "weight": 1}, "Extra inputs are not permitted"),
    ],
)
def test_errors_say_what_to_change(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError) as caught:
        QueueSpec(name="research", **fields)
    (error,) = caught.value.errors()
    assert message in error["msg"]
    assert "\n" not in error["msg"]


def test_a_queue_file_says_queue() -> None:
    with pytest.raises(ValidationError):
        QueueSpec.model_validate({"type": "fleet", "name": "research", "gpus": 1})
