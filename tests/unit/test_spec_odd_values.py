"""Values a file could hold that were taken silently, or refused in words that contradicted
each other: each is refused in one line naming the field and what to write, while a spec that
gpuflow recorded before the refusal (workflow history, the store) still reads back."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel

from gpuflow.errors import SpecError
from gpuflow.naming import RECORDED
from gpuflow.specs import FleetSpec, JobSpec
from gpuflow.specs.load import load_fleet, load_job, load_profile, model_of

JOB = "name: train\ncommands: [python train.py]\n"
FLEET = "type: fleet\nname: lab\nkind: sim\nhosts:\n  - name: gpu-1\n"


def _refusal(tmp_path: Path, text: str) -> str:
    """What the loader of the file (a fleet file by its first line, else a job file) says,
    after the file's name."""
    path = tmp_path / "file.yaml"
    path.write_text(text)
    load = load_fleet if text.startswith("type: fleet") else load_job
    with pytest.raises(SpecError) as refused:
        load(path)
    message = str(refused.value)
    assert "\n" not in message
    return message.removeprefix(f"{path}: ")


def _job(**fields: object) -> dict[str, object]:
    return {"name": "x", "commands": ["true"], **fields}


# ---- env ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("written", ["D:", "D: null", "D: ~"])
def test_a_null_env_value_is_refused_not_passed_as_the_text_none(
    tmp_path: Path, written: str
) -> None:
    """The job read `None`: `echo [$D]` printed `[None]`."""
    said = _refusal(tmp_path, JOB + f"env:\n  {written}\n")
    assert said == 'env: D has no value (null); for an empty one write D: ""'
    (tmp_path / "empty.yaml").write_text(JOB + 'env:\n  D: ""\n')
    assert load_job(tmp_path / "empty.yaml").env == {"D": ""}


def test_a_null_env_value_from_code_is_refused_too() -> None:
    with pytest.raises(SpecError, match=r"^job: env: D has no value \(null\); for an empty"):
        model_of(JobSpec, _job(env={"D": None}), "job")
    assert JobSpec.model_validate(_job(env={"N": 1, "B": True})).env == {"N": "1", "B": "True"}


def test_a_name_given_twice_in_an_env_list_is_refused(tmp_path: Path) -> None:
    """The last one won silently."""
    said = _refusal(tmp_path, JOB + "env: [A=1, B=2, A=2]\n")
    assert said == "env: A is given twice in the list; keep one"


def test_env_refusals_say_env_once(tmp_path: Path) -> None:
    """They read `env: env A: the value must be text, ...`."""
    assert (
        _refusal(tmp_path, JOB + "env:\n  A: [1]\n") == "env: A must be text, not a list of 1 item"
    )
    assert _refusal(tmp_path, JOB + "env: {1A: x}\n").startswith("env: name '1A' must be letters")
    assert _refusal(tmp_path, JOB + "env: [A]\n") == "env: entry 'A' must be KEY=VALUE"
    said = _refusal(tmp_path, JOB + "env: {T: 'Bearer ${{ secrets.t }}'}\n")
    assert said.startswith("env: the value of T, 'Bearer ${{ secrets.t }}', is not a secret")


# ---- resources -----------------------------------------------------------------------------------


@pytest.mark.parametrize("gpu", ["{names: [A100], name: L4}", "{names: [A100], name: A100}"])
def test_gpu_name_and_names_together_are_refused(tmp_path: Path, gpu: str) -> None:
    """`names` was dropped for `name`: the job went to an L4."""
    assert _refusal(tmp_path, JOB + f"resources: {{gpu: {gpu}}}\n") == (
        "resources.gpu: name and names are both given; list every acceptable model in names, "
        "e.g. names: [A100, L4]"
    )


def test_gpu_name_is_text(tmp_path: Path) -> None:
    """`name:` (null) asked for a GPU model called NONE."""
    said = _refusal(tmp_path, JOB + "resources: {gpu: {name: null}}\n")
    assert said == "resources.gpu: name null is not a GPU model; write text, e.g. name: A100"
    (tmp_path / "ok.yaml").write_text(JOB + "resources: {gpu: {name: 'a100,h100'}}\n")
    gpu = load_job(tmp_path / "ok.yaml").resources.gpu
    assert gpu is not None and gpu.names == ["A100", "H100"]


@pytest.mark.parametrize("cpu", ["0", "..4", "{min: 0, max: 0}"])
def test_a_job_reserves_some_cpu(tmp_path: Path, cpu: str) -> None:
    written = cpu if cpu.startswith("{") else f"'{cpu}'"
    said = _refusal(tmp_path, JOB + f"resources: {{cpu: {written}}}\n")
    assert said.startswith("resources.cpu: CPU count 0")
    assert "reserves no CPU (a job reserves the lower bound); ask for more than 0" in said


@pytest.mark.parametrize(
    ("memory", "said"),
    [
        ("1000TB", "resources.memory: '1000TB' is above 64TB per node"),
        ("65TB..", "resources.memory: '65TB..' is above 64TB per node"),
        ("100000", "resources.memory: 100000GB is above 64TB per node"),
    ],
)
def test_a_jobs_memory_is_at_most_64tb(tmp_path: Path, memory: str, said: str) -> None:
    """Up to 1PB was taken: a job that no host can ever hold (1000TB for 1000GB)."""
    quoted = f"'{memory}'" if not memory.isdigit() else memory
    assert _refusal(tmp_path, JOB + f"resources: {{memory: {quoted}}}\n") == said
    (tmp_path / "ok.yaml").write_text(JOB + "resources: {memory: 64TB}\n")
    assert load_job(tmp_path / "ok.yaml").resources.memory.min == 64 * 1024**2


# ---- retry -------------------------------------------------------------------------------------


def test_a_retry_that_could_never_retry_is_refused(tmp_path: Path) -> None:
    assert _refusal(tmp_path, JOB + "retry: {duration: 0}\n") == (
        "retry.duration: 0 is shorter than 1s: no attempt could start after the first "
        "(for none, write retry: false)"
    )
    assert _refusal(tmp_path, JOB + "retry: {on_events: []}\n") == (
        "retry.on_events: an empty list starts no other attempt; list one or more of "
        "no-capacity, interruption, error, or write retry: false"
    )


@pytest.mark.parametrize("attempts", ["0", "2.5", "true", "20000"])
def test_max_attempts_out_of_range_or_type_is_one_wording(tmp_path: Path, attempts: str) -> None:
    """`2.5` said `must be a whole number`, `0` said `max_attempts is 0; it must be at least
    1`, and `true` was taken as 1."""
    shown = {"true": "True"}.get(attempts, attempts)
    assert _refusal(tmp_path, JOB + f"retry: {{max_attempts: {attempts}}}\n") == (
        f"retry.max_attempts: {shown} is not a number of attempts; use a whole number, 1..10000"
    )


# ---- one wording for a field's range ----------------------------------------------------------


@pytest.mark.parametrize("value", ["-5", "0", "0.5"])
def test_max_duration_below_one_second_is_one_wording(tmp_path: Path, value: str) -> None:
    """`-5` said `must be at least 0` while `0` was refused with `must be positive`."""
    assert _refusal(tmp_path, JOB + f"max_duration: {value}\n") == (
        f"max_duration: {value} is shorter than 1s; for no limit write off"
    )


@pytest.mark.parametrize("nodes", ["0", "1.5", "5000"])
def test_nodes_out_of_range_or_type_is_one_wording(tmp_path: Path, nodes: str) -> None:
    assert _refusal(tmp_path, JOB + f"nodes: {nodes}\n") == (
        f"nodes: {nodes} is not a number of nodes; use a whole number, 1..1024"
    )


# ---- fleet files -------------------------------------------------------------------------------


def test_a_hosts_gpus_given_as_a_count_says_what_is_expected(tmp_path: Path) -> None:
    assert _refusal(tmp_path, FLEET + "    gpus: -1\n") == (
        "hosts.0.gpus: -1 is not a list of GPUs; write one entry per GPU model, "
        "e.g. [{name: A100, memory: 80GB, count: 4}]"
    )


@pytest.mark.parametrize(
    ("host", "said"),
    [
        ("    memory: 0\n", "hosts.0.memory: must be at least 1MB (got 0MB)"),
        ("    memory: 0.0001\n", "hosts.0.memory: must be at least 1MB (got 0MB)"),
        ("    memory: 100TB\n", "hosts.0.memory: '100TB' is above 64TB per host"),
        (
            "    gpus: [{name: A100, memory: 0}]\n",
            "hosts.0.gpus.0.memory: must be at least 1MB (got 0MB)",
        ),
    ],
)
def test_a_size_is_bounded_in_the_files_terms(tmp_path: Path, host: str, said: str) -> None:
    """`memory: 0` (GB) said `greater than or equal to 1 (got 0)`, in MiB."""
    assert _refusal(tmp_path, FLEET + host) == said


@pytest.mark.parametrize("blocks", ["0", "-1", "5000"])
def test_blocks_out_of_range_say_what_is_expected(tmp_path: Path, blocks: str) -> None:
    """They said `blocks: blocks is -1; it must be at least 1 or auto`."""
    expected = f"{blocks} is not a number of blocks; use a whole number, 1..4096, or auto"
    assert _refusal(tmp_path, FLEET + f"    blocks: {blocks}\n") == f"hosts.0.blocks: {expected}"


# ---- files and profiles ------------------------------------------------------------------------


def test_two_documents_in_one_file_say_it_must_hold_one(tmp_path: Path) -> None:
    """It said only `but found another document`."""
    said = _refusal(tmp_path, JOB + "---\n" + JOB)
    assert said == (
        "malformed YAML at line 3, column 1: a second document starts here; the file must hold "
        "one document (one job, fleet, queue or profile): put each in a file of its own"
    )


def test_an_empty_profile_hints_at_what_a_profile_holds(tmp_path: Path) -> None:
    """It hinted `(name: ...)`, which a profile may not set."""
    (tmp_path / "base.yaml").write_text("# nothing yet\n")
    with pytest.raises(SpecError) as refused:
        load_profile(tmp_path / "base.yaml")
    assert str(refused.value).endswith(
        "base.yaml: the file is empty; expected a mapping of fields (resources: ..., env: ...)"
    )


def test_a_job_field_in_a_profile_belongs_in_the_job_file(tmp_path: Path) -> None:
    """`alternatives:` in a profile asked `did you mean tolerations?`."""
    (tmp_path / "base.yaml").write_text("alternatives: [{gpu: 1}]\nqueue: research\n")
    with pytest.raises(SpecError) as refused:
        load_profile(tmp_path / "base.yaml")
    assert str(refused.value).endswith(
        "alternatives, queue: not allowed in a profile (set alternatives in the job file; "
        "set queue in the job file)"
    )


# ---- recorded specs ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "recorded"),
    [
        (JobSpec, _job(retry={"duration": 0})),
        (JobSpec, _job(retry={"on_events": []})),
        (JobSpec, _job(resources={"cpu": {"min": 0, "max": None}})),
        (JobSpec, _job(resources={"memory": {"min": 1000 * 1024**2, "max": None}})),
        (JobSpec, _job(alternatives=[{"cpu": {"min": 0, "max": 0}}])),
        (JobSpec, _job(working_dir="~bob/runs")),
        (
            FleetSpec,
            {
                "type": "fleet",
                "name": "f",
                "kind": "sim",
                "hosts": [{"name": "h", "memory": "100TB"}],
            },
        ),
    ],
)
def test_specs_recorded_before_these_refusals_still_read_back(
    model: type[BaseModel], recorded: dict[str, object]
) -> None:
    with pytest.raises(ValueError):
        model.model_validate(recorded)
    again = model.model_validate(recorded, context=RECORDED)
    assert model.model_validate_json(again.model_dump_json(), context=RECORDED) == again


def test_only_the_agents_users_home_is_expanded_in_working_dir(tmp_path: Path) -> None:
    said = _refusal(tmp_path, JOB + "working_dir: ~bob/runs\n")
    assert said == (
        "working_dir: '~bob/runs': only ~ and ~/... (the home of the user the host agent runs "
        "as) are expanded; write another user's directory in full"
    )
    for fine in ("~", "~/runs", "runs/a", "/data/run-1"):
        assert JobSpec.model_validate(_job(working_dir=fine)).working_dir == fine
