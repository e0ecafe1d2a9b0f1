"""What a user reads when a job, fleet or queue file is refused: one line in gpuflow's words, never
pydantic's, naming the field and what to write (gpuflow/specs/messages.py); and taints and
tolerations written so that the scheduler can match them."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from gpuflow.errors import SpecError
from gpuflow.naming import RECORDED
from gpuflow.specs import FleetSpec, JobSpec
from gpuflow.specs.load import load_fleet, load_job, load_queue, model_of

JOB = "name: train\ncommands: [python train.py]\n"
FLEET = "type: fleet\nname: lab\nkind: sim\nhosts:\n  - name: gpu-1\n"
QUEUE = "type: queue\nname: research\ngpus: 8\n"

PYDANTIC_WORDS = (
    "Input should",
    "validation error",
    "type=",
    "errors.pydantic.dev",
    "[key]",
    "literal[",
    "Spec",  # a model's class name: ResourcesSpec, RetrySpec
    "HostDecl",
    "List should",
    "instance of",
)


def _refusal(tmp_path: Path, text: str, *, profile: str | None = None) -> str:
    """The one line a file's loader refuses it with (by its `type`), after the file it names
    (the job file, or the profile `base.yaml` for a value only the profile set)."""
    if profile is not None:
        (tmp_path / "base.yaml").write_text(profile)
    path = tmp_path / "file.yaml"
    path.write_text(text)
    load = {"fleet": load_fleet, "queue": load_queue}.get(text.split("\n", 1)[0][6:], load_job)
    with pytest.raises(SpecError) as refused:
        load(path)
    message = str(refused.value)
    assert "\n" not in message
    for word in PYDANTIC_WORDS:
        assert word not in message, message
    named, _, said = message.partition(": ")
    return f"{Path(named).name}: {said}" if profile is not None else said


# ---- taints and tolerations -------------------------------------------------------------------

GOOD_TAINTS = [
    "gpu-only",
    "dedicated=infra",
    "example.com/gpu=a100_80GB",
    "team.a_b-c=v-1.2_x",
    "k" * 253,
    "k=" + "v" * 63,
    "p" * 200 + "/" + "k" * 52,
]
BAD_TAINTS = [
    "=x",  # no key
    "a=b=c",  # a second '='
    " key",  # a space
    "key ",
    "key=",  # '=' and no value: matches neither `key` nor `key=value`
    "key=v@l",
    "ke y=v",
    "a/b/c",  # two prefixes
    "/key",
    "prefix/",
    "gpu:NoSchedule",  # Kubernetes' effect is not part of the taint
    "clé=v",  # letters are ASCII, as Kubernetes'
    "",
]


@pytest.mark.parametrize("taint", GOOD_TAINTS)
def test_a_taint_and_a_toleration_of_the_documented_form_are_accepted(taint: str) -> None:
    host = {"name": "gpu-1", "taints": [taint]}
    fleet = FleetSpec.model_validate({"type": "fleet", "name": "f", "kind": "sim", "hosts": [host]})
    assert fleet.hosts[0].taints == [taint]
    job = JobSpec.model_validate({"name": "x", "commands": ["true"], "tolerations": [taint]})
    assert job.tolerations == [taint]


@pytest.mark.parametrize("taint", BAD_TAINTS)
def test_a_taint_or_toleration_that_could_never_match_is_refused_naming_it(
    tmp_path: Path, taint: str
) -> None:
    form = "must be key=value or key (letters, digits, '-', '_', '.'; the key at most 253"
    quoted = repr(taint)
    message = _refusal(tmp_path, FLEET + f"    taints: [gpu-only, {quoted}]\n")
    assert message.startswith(f"hosts.0.taints: taint {quoted} {form}"), message
    message = _refusal(tmp_path, JOB + f"tolerations: [{quoted}]\n")
    assert message.startswith(f"tolerations: toleration {quoted} {form}"), message


def test_a_taint_too_long_says_which_part_is() -> None:
    for taint, part in (("k" * 254, "a key longer than 253"), ("k=" + "v" * 64, "a value longer")):
        with pytest.raises(ValidationError, match=f"toleration '.*has {part}"):
            JobSpec.model_validate({"name": "x", "commands": ["true"], "tolerations": [taint]})


def test_a_recorded_spec_keeps_a_toleration_written_before_the_check() -> None:
    """A job waiting in a workflow's history with an odd toleration still reads back."""
    spec = {"name": "x", "commands": ["true"], "tolerations": ["=x"]}
    assert JobSpec.model_validate(spec, context=RECORDED).tolerations == ["=x"]


# ---- text that YAML read as a bool or a number ------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "name: off\ncommands: [x]\n",
            'name: off was read by YAML as the boolean false; quote it: name: "off"',
        ),
        (
            "name: 123\ncommands: [x]\n",
            'name: 123 was read by YAML as the number 123; quote it: name: "123"',
        ),
        (
            JOB + "labels: {zone: yes}\n",
            'labels.zone: yes was read by YAML as the boolean true; quote it: zone: "yes"',
        ),
        (
            JOB + "tolerations: [On]\n",
            'tolerations.0: On was read by YAML as the boolean true; quote it: "On"',
        ),
        (
            JOB + "labels: {1.5: a}\n",
            'labels: the key 1.5 was read by YAML as the number 1.5; quote it: "1.5"',
        ),
        (
            JOB + "queue: 1_000\n",
            'queue: 1_000 was read by YAML as the number 1000; quote it: queue: "1_000"',
        ),
        (
            JOB.replace("[python train.py]", "[echo, 1:30]"),
            'commands.1: 1:30 was read by YAML as the number 90; quote it: "1:30"',
        ),
        (
            JOB + "resources: {gpu: {vendor: no}}\n",
            "resources.gpu.vendor: no was read by YAML as the boolean false",
        ),
        (
            FLEET.replace("name: gpu-1", "name: no"),
            'hosts.0.name: no was read by YAML as the boolean false; quote it: name: "no"',
        ),
        (
            FLEET + "    gpus: [{name: 4090, memory: 24GB}]\n",
            'hosts.0.gpus.0.name: 4090 was read by YAML as the number 4090; quote it: name: "4090"',
        ),
        (
            FLEET + "labels: {rack: 0x1F}\n",
            'labels.rack: 0x1F was read by YAML as the number 31; quote it: rack: "0x1F"',
        ),
        (
            QUEUE.replace("research", "off"),
            'name: off was read by YAML as the boolean false; quote it: name: "off"',
        ),
        (
            QUEUE + "cohort: yes\n",
            'cohort: yes was read by YAML as the boolean true; quote it: cohort: "yes"',
        ),
    ],
)
def test_text_that_yaml_read_as_a_bool_or_number_says_what_to_quote(
    tmp_path: Path, text: str, expected: str
) -> None:
    assert _refusal(tmp_path, text).startswith(expected)


def test_a_spelling_is_followed_through_anchors_and_merge_keys(tmp_path: Path) -> None:
    text = "base: &b {name: off}\n<<: *b\ncommands: [x]\n"
    assert _refusal(tmp_path, text).startswith("name: off was read by YAML as the boolean false")


def test_a_value_from_the_profile_is_said_as_the_profile_spelled_it(tmp_path: Path) -> None:
    message = _refusal(tmp_path, JOB + "profile: ./base.yaml\n", profile="labels: {gpu: on}\n")
    assert message == (
        'base.yaml: labels.gpu: on was read by YAML as the boolean true; quote it: gpu: "on"'
    )
    # The job file's value wins over the profile's, and is the one said.
    message = _refusal(
        tmp_path, JOB + "profile: ./base.yaml\nlabels: {gpu: off}\n", profile="labels: {gpu: on}\n"
    )
    assert message.startswith("file.yaml: labels.gpu: off was read by YAML as the boolean false")


def test_fields_that_take_a_bool_still_do(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(JOB + "max_duration: off\nretry: yes\npreemptible: on\n")
    job = load_job(path)
    assert job.max_duration is None and job.retry is not None and job.preemptible


def test_a_mapping_from_code_is_told_the_same_without_a_spelling() -> None:
    with pytest.raises(SpecError) as refused:
        model_of(JobSpec, {"name": False, "commands": [7]}, "job")
    assert str(refused.value) == (
        "job: name: must be text, not the boolean false (in YAML a bare yes, no, on, off, true "
        "or false is a boolean: quote the text); commands.0: must be text, not the number 7 "
        '(quote it: "7")'
    )


def test_spellings_are_where_yaml_typed_a_plain_scalar() -> None:
    from gpuflow.specs.safe_yaml import Spellings, parse_yaml

    spellings: Spellings = {}
    data = parse_yaml("a: [off, 'no', 1_0]\nb: {2: x, c: 0.50}\nd: text\n", spellings=spellings)
    assert data == {"a": [False, "no", 10], "b": {2: "x", "c": 0.5}, "d": "text"}
    assert spellings == {
        ("a", 0): ("off", False),
        ("a", 2): ("1_0", 10),
        ("b", 2, "[key]"): ("2", 2),
        ("b", "c"): ("0.50", 0.5),
    }


# ---- pydantic's other wording -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (JOB + "nodes: 0\n", "nodes: 0 is not a number of nodes; use a whole number, 1..1024"),
        (
            JOB + "nodes: 5000\n",
            "nodes: 5000 is not a number of nodes; use a whole number, 1..1024",
        ),
        (
            JOB + "resources: [gpu]\n",
            "resources: must be a mapping of fields (gpu, cpu, memory, disk, os, arch, backend, "
            "min_driver), not a list",
        ),
        (JOB + "resources: 5\n", "resources: must be a mapping of fields (gpu, cpu,"),
        (
            JOB + "retry: {max_attempts: abc}\n",
            "retry.max_attempts: 'abc' is not a number of attempts; use a whole number, 1..10000",
        ),
        (
            JOB + "retry: {max_attempts: 1.5}\n",
            "retry.max_attempts: 1.5 is not a number of attempts; use a whole number, 1..10000",
        ),
        (
            JOB + "retry: {on_events: [foo]}\n",
            "retry.on_events.0: must be 'no-capacity', 'interruption' or 'error' (got 'foo')",
        ),
        (
            JOB + "tolerations: gpu-only\n",
            "tolerations: must be a list; for one item write [gpu-only] (got 'gpu-only')",
        ),
        (JOB + "labels: [a, b]\n", "labels: must be a mapping (key: value), not a list"),
        (JOB + "labels: {a: null}\n", "labels.a: must be text, not empty (null)"),
        (JOB + "alternatives: {gpu: 1}\n", "alternatives: must be a list, not a mapping"),
        (JOB + "placement: {hosts: [gpu-1], gpus: x y}\n", "placement.gpus: must be a list"),
        (JOB + "working_dir: [a]\n", "working_dir: must be text, not a list"),
        ("name: x\ncommands: []\n", "commands: needs at least 1 item"),
        (
            JOB + "resources: {gpu: 1}\n"
            "utilization_policy: {min_gpu_utilization: 150, time_window: 10m}\n",
            "utilization_policy.min_gpu_utilization: must be at most 100 (got 150)",
        ),
        (
            FLEET + "    blocks: abc\n",
            "hosts.0.blocks: must be a whole number or 'auto' (got 'abc')",
        ),
        (FLEET + "    os: windows\n", "hosts.0.os: must be 'linux' or 'macos' (got 'windows')"),
        (FLEET + "    port: 70000\n", "hosts.0.port: must be at most 65535"),
        (
            FLEET.replace("  - name: gpu-1\n", "  - gpu-1\n"),
            "hosts.0: must be a mapping of fields (name, os, arch,",
        ),
        (FLEET + "utilization: {value: 500}\n", "utilization.value: must be at most 100 (got 500)"),
        (
            FLEET + "scorer_weights: {cpu: abc}\n",
            "scorer_weights.cpu: must be a number (got 'abc')",
        ),
        (FLEET + "scorer_weights: {cpu: .nan}\n", "scorer_weights.cpu: must be a finite number"),
        (QUEUE + "cohort: [lab]\n", "cohort: must be text, not a list"),
    ],
)
def test_pydantic_wording_never_reaches_the_user(tmp_path: Path, text: str, expected: str) -> None:
    assert _refusal(tmp_path, text).startswith(expected)


def test_env_names_and_values_keep_what_the_file_wrote(tmp_path: Path) -> None:
    """An environment holds text: a bare `yes` is `yes` to the job, not Python's `True`, and a
    name YAML read as a bool (`OFF`) is still that name; the profile's spelling counts for
    what only the profile set, the job file's over it, and code's value is kept as given."""
    (tmp_path / "base.yaml").write_text("env:\n  VERBOSE: on\n  LEVEL: 0o17\n")
    path = tmp_path / "job.yaml"
    path.write_text(
        "name: envy\ncommands: [env]\nprofile: base.yaml\nenv:\n  DEBUG: yes\n  PORT: 8080\n"
        "  MASK: 0x1F\n  T: 1:30\n  RATE: 1.50\n  OFF: off\n  LEVEL: 3\n  S: 'no'\n"
    )
    assert load_job(path).env == {
        "VERBOSE": "on",
        "LEVEL": "3",
        "DEBUG": "yes",
        "PORT": "8080",
        "MASK": "0x1F",
        "T": "1:30",
        "RATE": "1.50",
        "OFF": "off",
        "S": "no",
    }
    given = load_job(path, overrides={"env": {"DEBUG": True}})
    assert given.env["DEBUG"] == "True" and given.env["PORT"] == "8080"
