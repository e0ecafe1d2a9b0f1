"""Queue files (gpuflow/specs/queue.py): quotas, cohorts and limits, with one-line errors."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from gpuflow.errors import SpecError
from gpuflow.specs import QueueSpec
from gpuflow.specs.load import model_of


def test_a_total_quota_and_a_per_model_quota() -> None:
    assert QueueSpec(name="research", gpus=16).quota == {"*": 16}
    spec = QueueSpec(name="research", gpus={"a100": 8, " T4 ": 4}, cohort="lab", lending_limit=2)
    assert spec.quota == {"A100": 8, "T4": 4}
    assert spec.borrowing_limit is None  # unlimited


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"gpus": -1}, "must be 0..1000000 GPUs, not -1"),
        ({"gpus": True}, "must be a whole number of GPUs, not true"),
        ({"gpus": {"A100": 1.5}}, "A100 must be a whole number of GPUs, not 1.5"),
        ({"gpus": {"a100": 1, "A100": 2}}, "GPU model A100 is listed twice in gpus"),
        ({"gpus": 4, "borrowing_limit": 2}, "borrowing_limit needs a `cohort` to share with"),
        ({"gpus": 4, "cohort": "lab", "lending_limit": 9}, "lending_limit 9 is more than its"),
        ({"gpus": 1, "cohort": "lab", "lending_limit": 9}, "more than its quota of 1 GPU"),
        ({"gpus": 4, "cohort": "lab", "borrowing_limit": -2}, "must be 0..1000000 GPUs, not -2"),
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


def test_a_check_of_the_whole_queue_is_one_line_without_a_field_path() -> None:
    with pytest.raises(SpecError) as caught:
        model_of(QueueSpec, {"name": "a", "gpus": 1, "borrowing_limit": 4}, "q.yaml")
    assert str(caught.value) == "q.yaml: borrowing_limit needs a `cohort` to share with"


@pytest.mark.parametrize(
    ("fields", "line"),
    [
        # the field was named twice (`gpus: gpus is -1; ...`)
        ({"gpus": -1}, "q.yaml: gpus: must be 0..1000000 GPUs, not -1"),
        ({"gpus": {"a100": -1}}, "q.yaml: gpus: A100 must be 0..1000000 GPUs, not -1"),
        (
            {"gpus": 4, "cohort": "lab", "lending_limit": 2_000_000},
            "q.yaml: lending_limit: must be 0..1000000 GPUs, not 2000000",
        ),
    ],
)
def test_a_field_is_named_once(fields: dict[str, Any], line: str) -> None:
    with pytest.raises(SpecError) as caught:
        model_of(QueueSpec, {"name": "a", **fields}, "q.yaml")
    assert str(caught.value) == line


@pytest.mark.parametrize("gpus", [{"A100": 2, "*": 3}, {"*": 3}])
def test_star_is_not_a_model(gpus: dict[str, int]) -> None:
    """`{A100: 2, "*": 3}` was taken, and shown `QUOTA 3 A100:2`, but only the 3 counted: the
    A100 quota meant nothing."""
    with pytest.raises(SpecError) as caught:
        model_of(QueueSpec, {"name": "a", "gpus": gpus}, "q.yaml")
    assert str(caught.value) == (
        "q.yaml: gpus: * is not a GPU model: write a total over every model as a number "
        "(gpus: 3), or name each model"
    )


def test_amounts_are_written_to_two_decimals() -> None:
    """A loan split between two lenders in proportion read `A100:1.33333`."""
    from gpuflow.specs.queue import gpu_amounts

    assert gpu_amounts({"A100": 4 / 3, "T4": 0.5}) == "A100:1.33 T4:0.5"
    assert gpu_amounts({"*": 8 / 3}) == "2.67"
    assert gpu_amounts({"A100": 0.001}) == "0"  # nothing worth a digit
