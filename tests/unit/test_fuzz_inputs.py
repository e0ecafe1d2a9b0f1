"""Fuzzing the job, fleet and profile loaders: whatever the bytes, the result is a valid spec or
one short line of SpecError, in bounded time.

The generated inputs are what a careless user or an attacker writes: random bytes, mutations of
the example files, nasty values (non-finite and huge numbers, Unicode digits, YAML tags and
timestamps, NUL, very long text, alias bombs, deep nesting) put into any field. The known-bad
corpus (tests/unit/input_corpus.py) must each be refused for the expected reason, and the
known-good ones accepted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from gpuflow.errors import MAX_MESSAGE, SpecError
from gpuflow.specs import FleetSpec, JobSpec, load_fleet, load_job, load_queue
from tests.unit import input_corpus as corpus
from tests.unit.input_corpus import FLEET_HOST_FIELDS, JOB_FIELDS, NASTY

LIMIT_S = 2.0
"""Most seconds one input may take (about 1 s is the goal; the slack is for a loaded machine)."""

EXAMPLES = int(os.environ.get("GPUFLOW_FUZZ_EXAMPLES", "150"))
"""Examples per generated test; a longer hunt sets GPUFLOW_FUZZ_EXAMPLES=5000 (and is then
random rather than the same every run)."""
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,  # time is asserted per input below, with slack for a shared machine
    derandomize="GPUFLOW_FUZZ_EXAMPLES" not in os.environ,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

JOB_NESTED = [
    "resources: {{gpu: {}}}",
    "resources: {{cpu: {}}}",
    "resources: {{memory: {}}}",
    "resources: {{gpu: 1, min_driver: {}}}",
    "resources: {{gpu: {{count: 1, compute_capability: {}}}}}",
    "resources: {{gpu: {{memory: {}}}}}",
    "retry: {{duration: {}}}",
    "retry: {{max_attempts: {}}}",
    "env: {{A: {}}}",
    "env: [{}]",
    "placement: {{gpus: [{}]}}",
    "utilization_policy: {{min_gpu_utilization: 5, time_window: {}}}",
    "utilization_policy: {{min_gpu_utilization: {}, time_window: 10m}}",
]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


def outcome(
    load: Callable[[Path], BaseModel], path: Path, *, limit_s: float = LIMIT_S
) -> BaseModel | str:
    """The spec, or the refusal's message; fails the test on anything else."""
    start = time.process_time()  # this process's CPU: another process's load does not count
    try:
        result: BaseModel | str = load(path)
    except SpecError as exc:
        result = str(exc)
        # One line of at most MAX_MESSAGE is SpecError's own doing; what the loader must add
        # is where: every refusal names the file it refused (the job's, or its profile's).
        assert "\n" not in result and "\r" not in result, result
        assert 0 < len(result) <= MAX_MESSAGE, result
        assert result.startswith(f"{path.parent}/") and ".yaml: " in result, result
    elapsed = time.process_time() - start
    assert elapsed < limit_s, f"{elapsed:.2f}s for {path.read_bytes()[:200]!r}"
    return result


def _load_any(path: Path) -> BaseModel:
    """A file as the CLI would read it, by its declared type."""
    try:
        kind = yaml.safe_load(path.read_bytes()[:200].decode("utf-8", "replace").split("\n")[0])
    except yaml.YAMLError:
        kind = None
    if isinstance(kind, dict) and kind.get("type") == "fleet":
        return load_fleet(path)
    if isinstance(kind, dict) and kind.get("type") == "queue":
        return load_queue(path)
    return load_job(path)


def _write(workdir: Path, name: str, data: bytes) -> Path:
    path = workdir / name
    path.write_bytes(data)
    return path


# ---- the corpus: refused for the right reason, or accepted --------------------------------


@pytest.mark.parametrize(("label", "data", "expected"), corpus.BAD_JOBS, ids=lambda v: str(v)[:20])
def test_known_bad_jobs_are_refused(workdir: Path, label: str, data: bytes, expected: str) -> None:
    result = outcome(load_job, _write(workdir, "bad-job.yaml", data))
    assert isinstance(result, str), f"{label}: accepted {result!r}"
    assert expected in result
    assert "bad-job.yaml" in result  # names the file


@pytest.mark.parametrize(
    ("label", "data", "expected"), corpus.BAD_FLEETS, ids=lambda v: str(v)[:20]
)
def test_known_bad_fleets_are_refused(
    workdir: Path, label: str, data: bytes, expected: str
) -> None:
    result = outcome(load_fleet, _write(workdir, "bad-fleet.yaml", data))
    assert isinstance(result, str), f"{label}: accepted {result!r}"
    assert expected in result
    assert "bad-fleet.yaml" in result


@pytest.mark.parametrize(
    ("label", "data", "expected"), corpus.BAD_PROFILES, ids=lambda v: str(v)[:20]
)
def test_known_bad_profiles_are_refused(
    workdir: Path, label: str, data: bytes, expected: str
) -> None:
    _write(workdir, "bad-profile.yaml", data)
    job = _write(
        workdir, "with-profile.yaml", (corpus.JOB + "profile: bad-profile.yaml\n").encode()
    )
    result = outcome(load_job, job)
    assert isinstance(result, str), f"{label}: accepted {result!r}"
    assert expected in result
    assert "bad-profile.yaml" in result


@pytest.mark.parametrize(("label", "data"), corpus.GOOD_JOBS, ids=lambda v: str(v)[:20])
def test_known_good_jobs_are_accepted(workdir: Path, label: str, data: bytes) -> None:
    assert isinstance(outcome(load_job, _write(workdir, "good-job.yaml", data)), JobSpec)


@pytest.mark.parametrize(("label", "data"), corpus.GOOD_FLEETS, ids=lambda v: str(v)[:20])
def test_known_good_fleets_are_accepted(workdir: Path, label: str, data: bytes) -> None:
    assert isinstance(outcome(load_fleet, _write(workdir, "good-fleet.yaml", data)), FleetSpec)


def test_a_megabyte_file_is_refused_or_read_within_the_limit(workdir: Path) -> None:
    host = "  - {name: h%d, cpus: 8, gpus: [{name: A100, memory: 80GB}], labels: {a: b}}\n"
    text = "type: fleet\nname: f\nkind: sim\nhosts:\n" + "".join(host % i for i in range(14_000))
    assert len(text) > 1024 * 1024
    assert "larger than" in str(outcome(load_fleet, _write(workdir, "big.yaml", text.encode())))
    dense = text[: text.rindex("\n", 0, 1024 * 1024 - 1) + 1]
    # 1.1-1.3 s of CPU alone (benchmarks/fuzz_inputs.py, "1 MB fleet file"); late in a long test
    # process, with its garbage collector busy, up to 3.3 s was seen: the bound here catches a
    # hang or a quadratic, not the figure.
    result = outcome(load_fleet, _write(workdir, "dense.yaml", dense.encode()), limit_s=8.0)
    assert isinstance(result, str) and "values" in result


# ---- generated inputs ---------------------------------------------------------------------


def _mutate(text: str, edits: list[tuple[float, int, str]]) -> bytes:
    """Apply (where, what, token) edits: 0 inserts the token, 1 replaces a line's value with
    it, 2 deletes a span, 3 duplicates a line."""
    lines = text.splitlines(keepends=True) or [""]
    for where, what, token in edits:
        i = int(where * len(lines)) % len(lines)
        line = lines[i]
        if what == 0:
            cut = int(where * 7919) % (len(line) + 1)
            lines[i] = line[:cut] + token + line[cut:]
        elif what == 1 and ":" in line:
            lines[i] = line[: line.index(":") + 1] + " " + token + "\n"
        elif what == 2:
            cut = int(where * 7919) % (len(line) + 1)
            lines[i] = line[:cut] + line[cut + len(token) % 7 :]
        else:
            lines.insert(i, line)
    return "".join(lines).encode("utf-8", "surrogatepass")


EXAMPLE_TEXTS = [path.read_text() for path in corpus.example_files()]
edits = st.lists(
    st.tuples(
        st.floats(0, 1, exclude_max=True),
        st.integers(0, 3),
        st.one_of(st.sampled_from(NASTY), st.text(max_size=20)),
    ),
    min_size=1,
    max_size=4,
)


@FUZZ
@given(raw=st.binary(max_size=3000))
def test_random_bytes(workdir: Path, raw: bytes) -> None:
    path = _write(workdir, "raw.yaml", raw)
    outcome(load_job, path)
    outcome(load_fleet, path)
    outcome(load_queue, path)


@FUZZ
@given(
    text=st.text(alphabet=st.sampled_from(list("{}[]:,-&*!|>'\"#% \n\t0.9aZ~?<=")), max_size=300)
)
def test_random_yaml_punctuation(workdir: Path, text: str) -> None:
    path = _write(workdir, "punctuation.yaml", ("name: x\ncommands: [a]\n" + text).encode())
    outcome(load_job, path)
    outcome(load_fleet, path)


@FUZZ
@given(text=st.sampled_from(EXAMPLE_TEXTS), changes=edits)
def test_mutated_examples(workdir: Path, text: str, changes: list[tuple[float, int, str]]) -> None:
    (workdir / "profile.yaml").write_text((corpus.EXAMPLES / "profile.yaml").read_text())
    outcome(_load_any, _write(workdir, "mutated.yaml", _mutate(text, changes)))


@FUZZ
@given(field=st.sampled_from(JOB_FIELDS), value=st.sampled_from(NASTY))
def test_nasty_value_in_a_job_field(workdir: Path, field: str, value: str) -> None:
    text = corpus.JOB.replace(f"{field}:", f"x-{field}:") + f"{field}: {value}\n"
    outcome(load_job, _write(workdir, "field.yaml", text.encode()))


@FUZZ
@given(template=st.sampled_from(JOB_NESTED), value=st.sampled_from(NASTY))
def test_nasty_value_in_a_nested_job_field(workdir: Path, template: str, value: str) -> None:
    text = corpus.JOB + template.format(value) + "\n"
    outcome(load_job, _write(workdir, "nested.yaml", text.encode()))


@FUZZ
@given(field=st.sampled_from(FLEET_HOST_FIELDS), value=st.sampled_from(NASTY))
def test_nasty_value_in_a_fleet_host(workdir: Path, field: str, value: str) -> None:
    text = corpus.SSH_FLEET + f"    {field}: {value}\n"
    outcome(load_fleet, _write(workdir, "host.yaml", text.encode()))


def _values() -> st.SearchStrategy[Any]:
    scalars = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.integers(min_value=-(10**400), max_value=10**400),
        st.floats(allow_nan=True, allow_infinity=True),
        st.text(max_size=50),
        st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x3000), max_size=2000),
    )
    return st.recursive(
        scalars,
        lambda inner: st.one_of(
            st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
        ),
        max_leaves=12,
    )


def _dump(data: dict[str, Any]) -> bytes:
    return yaml.safe_dump(data, allow_unicode=True).encode("utf-8", "surrogatepass")


@FUZZ
@given(field=st.sampled_from(JOB_FIELDS), value=_values())
def test_generated_values_in_a_job(workdir: Path, field: str, value: Any) -> None:
    data = {"name": "fuzz", "commands": ["echo"], field: value}
    outcome(load_job, _write(workdir, "generated.yaml", _dump(data)))


@FUZZ
@given(field=st.sampled_from(FLEET_HOST_FIELDS), value=_values())
def test_generated_values_in_a_fleet(workdir: Path, field: str, value: Any) -> None:
    host = {"name": "a", "hostname": "127.0.0.1", field: value}
    data = {"type": "fleet", "name": "f", "kind": "ssh", "hosts": [host]}
    outcome(load_fleet, _write(workdir, "generated-fleet.yaml", _dump(data)))


@FUZZ
@given(changes=edits)
def test_mutated_profile(workdir: Path, changes: list[tuple[float, int, str]]) -> None:
    profile = (corpus.EXAMPLES / "profile.yaml").read_text()
    _write(workdir, "fuzz-profile.yaml", _mutate(profile, changes))
    job = corpus.JOB + "resources: {gpu: 1}\nprofile: fuzz-profile.yaml\n"
    outcome(load_job, _write(workdir, "uses-profile.yaml", job.encode()))


def _bombs() -> Iterator[tuple[str, bytes]]:
    for width in (2, 9, 50):
        for levels in (3, 10, 30):
            lines = ["a0: &a0 [" + ", ".join(["x"] * width) + "]"]
            lines += [
                f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]" for i in range(1, levels)
            ]
            yield f"{width}x{levels}", ("\n".join(lines) + "\nname: x\ncommands: [a]\n").encode()


@pytest.mark.parametrize(("label", "data"), list(_bombs()), ids=lambda v: str(v)[:10])
def test_alias_bombs_of_every_shape_are_bounded(workdir: Path, label: str, data: bytes) -> None:
    result = outcome(load_job, _write(workdir, "bomb.yaml", data))
    # small ones are valid YAML with unknown fields; big ones hit the value budget
    assert isinstance(result, str)


def test_the_measurement_script_counts_nothing_wrong(tmp_path: Path) -> None:
    script = corpus.EXAMPLES.parent / "benchmarks" / "fuzz_inputs.py"
    out = tmp_path / "figures.json"
    subprocess.run(
        [sys.executable, str(script), "--jobs", "120", "--fleets", "60", "--json", str(out)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    figures = json.loads(out.read_text())
    for name in ("job files", "fleet files"):
        counts = figures[name]["counts"]
        assert counts["expected bad"] > 0 and counts["expected good"] > 0  # the oracle ran
        for wrong in ("traceback", "hang", "over 1 s", "known-bad accepted", "known-good refused"):
            assert wrong not in counts, (name, counts)
