"""Job and fleet specs: the GPU grammar, ranges, profiles and their precedence."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from gpuflow.errors import MAX_MESSAGE, SpecError
from gpuflow.naming import RECORDED
from gpuflow.specs import (
    FleetSpec,
    GPUSpec,
    JobFlags,
    JobSpec,
    load_fleet,
    load_job,
    merge_job,
    parse_duration,
)
from gpuflow.specs.units import parse_version
from gpuflow.status import RetryEvent

GIB = 1024


@pytest.mark.parametrize(
    ("text", "vendor", "names", "memory", "count"),
    [
        ("A100:80GB:2", None, ["A100"], (80 * GIB, 80 * GIB), (2, 2)),
        ("H100,A100:8", None, ["H100", "A100"], None, (8, 8)),
        ("24GB..", None, [], (24 * GIB, None), (1, 1)),
        ("nvidia:1..4", "nvidia", [], None, (1, 4)),
        ("16GB..40GB:2", None, [], (16 * GIB, 40 * GIB), (2, 2)),
        ("amd:MI300X:192GB:8", "amd", ["MI300X"], (192 * GIB, 192 * GIB), (8, 8)),
    ],
)
def test_gpu_grammar(
    text: str,
    vendor: str | None,
    names: list[str],
    memory: tuple[int, int | None] | None,
    count: tuple[int, int],
) -> None:
    gpu = GPUSpec.parse(text)
    assert gpu.vendor == vendor
    assert gpu.names == names
    assert (None if gpu.memory is None else (gpu.memory.min, gpu.memory.max)) == memory
    assert (gpu.count.min, gpu.count.max) == count
    assert gpu.fraction is None


def test_gpu_fraction_and_round_trip() -> None:
    gpu = GPUSpec.parse("T4:0.5")
    assert gpu.fraction == 0.5
    job = JobSpec.model_validate(
        {"name": "x", "commands": ["true"], "resources": {"gpu": "A100:80GB:2", "memory": "64GB.."}}
    )
    assert JobSpec.model_validate_json(job.model_dump_json()) == job


@pytest.mark.parametrize(
    ("gpu", "message"),
    [
        ("A100:4..2", "range 4..2 is empty"),
        ("A100:1.5", "must be a whole number, or a fraction below 1"),
        ("A100:0.5..1", "a GPU fraction (0.5) cannot be a range"),
        ("nvidia::2", "has an empty part"),
    ],
)
def test_gpu_grammar_errors(gpu: str, message: str) -> None:
    with pytest.raises(SpecError, match=message.replace("(", r"\(").replace(")", r"\)")):
        merge_job({"name": "x", "commands": ["true"], "resources": {"gpu": gpu}})


def test_retry_true_means_every_event() -> None:
    job = merge_job({"name": "x", "commands": ["true"], "retry": True})
    assert job.retry is not None and set(job.retry.on_events) == set(RetryEvent)


def test_policy_only_in_the_profile_is_inherited(tmp_path: Path) -> None:
    (tmp_path / "profile.yaml").write_text(
        "utilization_policy: {min_gpu_utilization: 10, time_window: 30m}\nmax_duration: 1d\n"
    )
    (tmp_path / "job.yaml").write_text(
        "name: train\nprofile: profile.yaml\ncommands: [python train.py]\n"
        "resources: {gpu: A100:1}\n"
    )
    job = load_job(tmp_path / "job.yaml")
    assert job.utilization_policy is not None
    assert job.utilization_policy.min_gpu_utilization == 10
    assert job.utilization_policy.time_window == 1800
    assert job.max_duration == 86400


def test_flags_beat_job_file_which_beats_profile(tmp_path: Path) -> None:
    (tmp_path / "profile.yaml").write_text(
        "utilization_policy: {min_gpu_utilization: 10, time_window: 30m}\n"
        "env: {A: profile, B: profile}\n"
    )
    (tmp_path / "job.yaml").write_text(
        "name: train\ncommands: [python train.py]\nresources: {gpu: A100:1}\n"
        "utilization_policy: {min_gpu_utilization: 40}\nenv: {B: job}\n"
    )
    job = load_job(
        tmp_path / "job.yaml",
        profile=str(tmp_path / "profile.yaml"),
        overrides={"utilization_policy": {"time_window": "2h"}},
    )
    assert job.utilization_policy is not None
    assert job.utilization_policy.min_gpu_utilization == 40  # job beats profile
    assert job.utilization_policy.time_window == 7200  # flag beats both
    assert job.env == {"A": "profile", "B": "job"}


def test_profile_may_not_name_the_job(tmp_path: Path) -> None:
    (tmp_path / "profile.yaml").write_text("name: sneaky\n")
    (tmp_path / "job.yaml").write_text("name: x\ncommands: [true]\nprofile: profile.yaml\n")
    with pytest.raises(SpecError, match="name: not allowed in a profile"):
        load_job(tmp_path / "job.yaml")
    (tmp_path / "profile.yaml").write_text("max_duraton: 1h\n")  # a typo: the closest field
    with pytest.raises(SpecError, match=r"max_duraton: did you mean max_duration\?\)$"):
        load_job(tmp_path / "job.yaml")


@pytest.mark.parametrize("window", ["59s", "8d", "0"])
def test_window_outside_one_minute_to_seven_days(window: str) -> None:
    with pytest.raises(SpecError, match=r"outside 1m\.\.7d"):
        merge_job(
            {
                "name": "x",
                "commands": ["true"],
                "resources": {"gpu": 1},
                "utilization_policy": {"min_gpu_utilization": 5, "time_window": window},
            }
        )


@pytest.mark.parametrize("window", ["1m", "7d", "90m"])
def test_window_bounds_are_inclusive(window: str) -> None:
    merge_job(
        {
            "name": "x",
            "commands": ["true"],
            "resources": {"gpu": 1},
            "utilization_policy": {"min_gpu_utilization": 5, "time_window": window},
        }
    )


def test_policy_needs_a_gpu_job() -> None:
    with pytest.raises(SpecError, match="utilization_policy needs a job that asks for GPUs"):
        merge_job(
            {
                "name": "x",
                "commands": ["true"],
                "utilization_policy": {"min_gpu_utilization": 5, "time_window": "5m"},
            }
        )


def test_examples_are_valid() -> None:
    examples = Path(__file__).parents[2] / "examples"
    for path in sorted(examples.glob("*.yaml")):
        text = path.read_text()
        if "type: fleet" in text:
            load_fleet(path)
        elif "type: task" in text:
            load_job(path)


def test_resource_alternatives_in_the_order_tried(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(
        "name: train\ncommands: [python train.py]\nresources: {gpu: H100:8}\n"
        "alternatives:\n  - {gpu: A100:80GB:8}\n  - {gpu: A100:16, cpu: 64..}\n"
    )
    spec = load_job(path)
    options = spec.resource_options()
    assert [str(o.resources.gpu) for o in options] == ["H100:8", "A100:80GB:8", "A100:16"]
    assert all(o.alternatives == [] for o in options)
    assert options[2].resources.cpu.min == 64 and options[2].commands == spec.commands
    assert JobSpec(name="one", commands=["x"]).resource_options()[0].name == "one"


def test_each_alternative_is_checked_like_resources(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(
        "name: train\ncommands: [python train.py]\nresources: {gpu: A100:1}\n"
        "utilization_policy: {min_gpu_utilization: 10, time_window: 10m}\n"
        "alternatives:\n  - {cpu: 4}\n"
    )
    with pytest.raises(SpecError, match=r"alternatives\[0\]: utilization_policy needs"):
        load_job(path)
    path.write_text(
        "name: train\ncommands: [x]\nresources: {gpu: A100:1}\n"
        "alternatives:\n  - {gpu: 'A100:4..2'}\n"
    )
    with pytest.raises(SpecError, match="alternatives"):
        load_job(path)


@pytest.mark.parametrize(
    ("weights", "message"),
    [
        ("{idel: 1}", "unknown scorer weight 'idel'; allowed: gpu, cpu, memory, fragmentation"),
        ("{idle: -1}", "scorer weights must be 0 or more: idle"),
        ("{idle: .nan}", "scorer_weights.idle: must be a finite number"),
        ("{idle: .inf}", "scorer_weights.idle: must be a finite number"),
        ("{idle: 1e6}", "scorer weights must be at most 1000: idle"),
    ],
)
def test_scorer_weights_are_checked_by_name_and_sign(
    tmp_path: Path, weights: str, message: str
) -> None:
    path = tmp_path / "fleet.yaml"
    text = (Path(__file__).parents[2] / "examples" / "fleet-sim.yaml").read_text()
    path.write_text(text.replace("scorer: fragmentation", f"scorer_weights: {weights}"))
    with pytest.raises(SpecError, match=message):
        load_fleet(path)
    path.write_text(
        text.replace("scorer: fragmentation", "scorer_weights: {idle: 0, binpack: 0.1}")
    )
    assert load_fleet(path).scorer_weights == {"idle": 0.0, "binpack": 0.1}


# ---- bounds where values enter: the SDK's models, flags, profiles ---------------------------


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"max_duration": 1e20}, "longer than 366d"),
        ({"retry": {"duration": 10**20}}, "longer than 366d"),
        ({"env": {"A=B": "x"}}, "name 'A=B' must be letters"),
        ({"env": {"A": "x\x00"}}, "NUL"),
        ({"commands": ["a\x00"]}, "NUL"),
        ({"working_dir": "/tmp/\x00"}, "NUL"),
        ({"resources": {"cpu": float("nan")}}, "not a finite number"),
        ({"resources": {"cpu": {"min": float("inf")}}}, "finite"),
        ({"resources": {"gpu": 1, "min_driver": "²"}}, "not a version"),
        ({"resources": {"memory": -1}}, "negative"),
        ({"placement": {"gpus": ["h:²"]}}, "HOST:INDEX"),
    ],
)
def test_the_sdk_models_refuse_what_files_refuse(fields: dict[str, object], message: str) -> None:
    # The Python client builds JobSpec directly: the bounds live in the models, not the loader.
    with pytest.raises(ValidationError, match=message):
        JobSpec.model_validate({"name": "x", "commands": ["true"], **fields})


@pytest.mark.parametrize(
    ("host", "message"),
    [
        ({"driver_version": "²"}, "not a version"),
        ({"port": 0}, "greater than or equal to 1"),
        ({"memory": "-5GB"}, "not a size"),
        ({"gpus": [{"name": "A100", "memory": 0}]}, "greater than or equal to 1"),
    ],
)
def test_fleet_models_refuse_what_the_scheduler_cannot_read(
    host: dict[str, object], message: str
) -> None:
    spec = {"type": "fleet", "name": "f", "kind": "sim", "hosts": [{"name": "a", **host}]}
    with pytest.raises(ValidationError, match=message):
        FleetSpec.model_validate(spec)


def test_versions_compare_as_numbers_and_keep_their_text() -> None:
    assert parse_version("535.104.05") == (535, 104, 5) > parse_version("535.9")
    assert parse_version(" 8.0 ") == (8, 0)
    for bad in ("²", "8.", ".8", "8..0", "v8", "1.2.3.4.5", "٣", 8.0):
        with pytest.raises(ValueError):
            parse_version(bad)


def test_durations_are_bounded_and_linear() -> None:
    assert parse_duration("1h 30m") == 5400
    assert parse_duration(366 * 86400) == 366 * 86400
    for bad in (float("inf"), float("nan"), 10**30, "1" * 50_000, "1h" * 10_000, True, "-5s"):
        with pytest.raises(ValueError):
            parse_duration(bad)


def test_flags_combine_with_the_files_policy_and_name_themselves(tmp_path: Path) -> None:
    (tmp_path / "profile.yaml").write_text(
        "utilization_policy: {min_gpu_utilization: 10, time_window: 30m}\n"
    )
    (tmp_path / "job.yaml").write_text(
        "name: x\ncommands: [a]\nresources: {gpu: 1}\nprofile: profile.yaml\n"
    )
    job = load_job(tmp_path / "job.yaml", flags=JobFlags(time_window="5m"))
    assert job.utilization_policy is not None
    assert (job.utilization_policy.min_gpu_utilization, job.utilization_policy.time_window) == (
        10,
        300,
    )
    (tmp_path / "job.yaml").write_text("name: x\ncommands: [a]\nresources: {gpu: 1}\n")
    with pytest.raises(SpecError, match="--min-gpu-utilization needs --time-window too"):
        load_job(tmp_path / "job.yaml", flags=JobFlags(min_gpu_utilization=5))
    with pytest.raises(SpecError, match=r"^--gpu: GPU count '²' is not a number$"):
        load_job(tmp_path / "job.yaml", flags=JobFlags(gpu="A100:²"))


def test_a_bad_value_from_the_profile_names_the_profile(tmp_path: Path) -> None:
    (tmp_path / "defaults.yaml").write_text("max_duration: 2y\n")
    (tmp_path / "job.yaml").write_text("name: x\ncommands: [a]\nprofile: defaults.yaml\n")
    with pytest.raises(SpecError, match=r"defaults\.yaml: max_duration: '2y' is not a duration"):
        load_job(tmp_path / "job.yaml")


def test_profiles_by_name_live_under_gpuflow_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUFLOW_HOME", str(tmp_path))
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "gpu.yaml").write_text("max_duration: 2h\n")
    (tmp_path / "job.yaml").write_text("name: x\ncommands: [a]\nprofile: gpu\n")
    assert load_job(tmp_path / "job.yaml").max_duration == 7200
    (tmp_path / "job.yaml").write_text("name: x\ncommands: [a]\nprofile: cpu\n")
    with pytest.raises(SpecError, match=r"profile: no profile named 'cpu' in .*profiles \(for a"):
        load_job(tmp_path / "job.yaml")


def test_refusals_are_one_short_line_whatever_they_quote() -> None:
    error = SpecError("a\nb " + "x" * 5000)
    assert "\n" not in str(error) and len(str(error)) == MAX_MESSAGE
    many = {"name": "x", "commands": ["a"], **{f"bad{i}": i for i in range(50)}}
    with pytest.raises(SpecError, match=r"and 47 more$") as caught:
        merge_job(many)
    assert len(str(caught.value)) <= MAX_MESSAGE


def test_a_fleet_spec_reads_back_from_its_json() -> None:
    """The spec travels to the control plane as JSON: sizes keep their unit (a bare number
    would read as GB)."""
    spec = FleetSpec.model_validate(
        {
            "type": "fleet",
            "name": "f",
            "kind": "sim",
            "hosts": [
                {
                    "name": "a",
                    "memory": "1.5GB",
                    "disk": "512MB",
                    "gpus": [{"name": "A100", "memory": "80GB"}],
                }
            ],
        }
    )
    document = spec.model_dump(mode="json")
    assert document["hosts"][0]["memory"] == "1536MB"
    assert FleetSpec.model_validate(document) == spec


@pytest.mark.parametrize("value", ["abc", 101, -1, 2.5, "1e9"])
def test_a_python_client_flag_of_any_type_is_one_line(value: object) -> None:
    """JobFlags is public: a string or float where an int belongs is refused by the policy's own
    field, named by its flag (it was a TypeError comparing str and int)."""
    from gpuflow.specs.flags import JobFlags

    with pytest.raises(SpecError, match=r"^--min-gpu-utilization: .* is not a percentage"):
        JobFlags(min_gpu_utilization=value).overrides()  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("A100:80G:2", "'80G' is neither a count nor a memory size (sizes end in MB, GB or TB"),
        ("A100:2:4", "'A100:2:4' gives the count twice (2 and 4)"),
        ("A100:80GB:40GB", "gives the memory twice (80GB and 40GB)"),
        ("nvidia:amd:2", "gives the vendor twice (nvidia and amd)"),
        (
            "A100:H100",
            "gives GPU models twice (A100 and H100); several models are one part: A100,H100",
        ),
        ("A100:-1", "'-1' is not a GPU model, vendor, memory size or count"),
        ("A100,:2", "'A100,' is not a GPU model"),
        ("A100:0", "asks for 0 GPUs of A100:0; a job without GPUs omits gpu (or says 0)"),
    ],
)
def test_gpu_text_refuses_what_it_would_have_dropped(text: str, says: str) -> None:
    """A part given twice, or one that is no part at all, is refused: it used to replace the
    first (A100:80G:2 asked for 2 GPUs of any memory, A100:-1 for a model named -1)."""
    with pytest.raises(ValueError, match=re.escape(says)):
        GPUSpec.parse(text)


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"priority": True}, "priority: True is not a priority; use a whole number, 0..100"),
        ({"priority": "5"}, "priority: '5' is not a priority"),
        ({"priority": 5.0}, "priority: 5.0 is not a priority"),
        ({"nodes": "2"}, "nodes: '2' is not a number of nodes; use a whole number, 1..1024"),
        ({"preemptible": "yes"}, "preemptible: 'yes' is not true or false"),
        ({"preemptible": 1}, "preemptible: 1 is not true or false"),
        ({"working_dir": "/w/${{ secrets.x }}"}, "is not replaced in working_dir"),
    ],
)
def test_priority_nodes_and_preemptible_take_their_own_type_only(
    fields: dict[str, object], says: str
) -> None:
    """As a queue file's GPUs and `set-priority` do: `priority: true` was read as 1 and
    `preemptible: "false"` as False, and nothing shows a job's preemptible to check it by."""
    from gpuflow.specs.load import model_of

    with pytest.raises(SpecError, match=re.escape(says)):
        model_of(JobSpec, {"name": "x", "commands": ["x"], **fields}, "job")


def test_a_field_a_kind_of_fleet_does_not_read_is_refused() -> None:
    """It was accepted and ignored: an ssh host set to `state: maintenance` to drain it kept
    taking jobs, and a sim host's `hostname` or an ssh host's `gpus` did nothing."""

    def fleet(kind: str, host: dict[str, object], **more: object) -> dict[str, object]:
        return {"type": "fleet", "name": "f", "kind": kind, "hosts": [host], **more}

    ssh: dict[str, object] = {"name": "g1", "hostname": "127.0.0.1"}
    cases = {
        "state": fleet("ssh", {**ssh, "state": "maintenance"}),
        "cpus, gpus": fleet(
            "ssh", {**ssh, "cpus": 128, "gpus": [{"name": "A100", "memory": "80GB"}]}
        ),
        "hostname, port": fleet("sim", {"name": "h1", "hostname": "box", "port": 2222}),
        "blocks at the fleet's level": fleet("sim", {"name": "h1"}, blocks=2),
        "utilization is for sim fleets": fleet(
            "ssh", ssh, utilization={"source": "constant", "value": 90}
        ),
    }
    for said, document in cases.items():
        with pytest.raises(ValidationError, match=said):
            FleetSpec.model_validate(document)
    state = cases["state"]
    with pytest.raises(ValidationError, match="remove it from the file"):
        FleetSpec.model_validate(state)
    # a default value is what the kind reads anyway; a recorded spec is read as it was written
    FleetSpec.model_validate(fleet("ssh", {**ssh, "state": "ready", "os": "linux"}))
    FleetSpec.model_validate(fleet("sim", {"name": "h1", "port": 22}))
    assert FleetSpec.model_validate(state, context=RECORDED).hosts[0].state == "maintenance"


def test_a_host_count_is_a_whole_number_and_a_file_says_its_type() -> None:
    """`cpus: true` was read as 1 CPU and a GPU `count: "2"` as 2; a fleet file without its
    `type` read `(got None)`."""

    def host(**fields: object) -> dict[str, object]:
        return {"name": "f", "kind": "sim", "hosts": [{"name": "a", **fields}]}

    with pytest.raises(ValidationError, match="True is not a number of CPUs"):
        FleetSpec.model_validate(host(cpus=True))
    with pytest.raises(ValidationError, match="'2' is not a number of GPUs"):
        FleetSpec.model_validate(host(gpus=[{"name": "A100", "memory": "80GB", "count": "2"}]))
    assert FleetSpec.model_validate(host(cpus=16)).hosts[0].cpus == 16
