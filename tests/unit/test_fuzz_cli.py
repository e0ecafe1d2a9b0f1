"""Fuzzing the commands that read files and flags (`apply -f`, `offers -f`, `fleet apply -f`,
`queue apply -f`): a bad file or flag is one `error:` line and exit code 1 before anything is
connected to or created; a good one, with no stack running, is the one-line 'cannot reach
Temporal' error."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from gpuflow.cli.main import app
from gpuflow.errors import MAX_MESSAGE
from tests.unit import input_corpus as corpus
from tests.unit.input_corpus import NASTY
from tests.unit.test_fuzz_inputs import EXAMPLE_TEXTS, LIMIT_S, _mutate, edits

runner = CliRunner()

CLI_FUZZ = settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
COMMANDS = [
    ["apply", "-y", "-f"],
    ["offers", "-f"],
    ["fleet", "apply", "-f"],
    ["queue", "apply", "-f"],
]


@pytest.fixture
def home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv("GPUFLOW_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("GPUFLOW_TEMPORAL_ADDRESS", "127.0.0.1:1")  # nothing listens there
    monkeypatch.delenv("GPUFLOW_DATABASE_URL", raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path / "home"


def invoke(args: list[str]) -> tuple[int, str]:
    """Exit code and the one error line (or the output of a success); fails the test on a
    traceback, a multi-line or over-long error, or a slow answer."""
    start = time.perf_counter()
    result = runner.invoke(app, args)
    assert time.perf_counter() - start < LIMIT_S + 2, args  # + connecting, for good files
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        f"{args}: {result.exception!r}"
    )
    assert "Traceback" not in result.output
    if result.exit_code in (0, 2):  # success, or click's usage message for a malformed command
        return result.exit_code, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert len(lines[0]) <= MAX_MESSAGE + len("error: "), lines[0]
    return result.exit_code, lines[0]


def check(home: Path, command: list[str], path: Path) -> str:
    shutil.rmtree(home, ignore_errors=True)  # an earlier example's good file made it
    code, line = invoke([*command, str(path)])
    assert code == 1  # nothing is listening, so even a good file cannot succeed
    if "cannot reach Temporal" not in line:
        assert not home.exists(), f"{line}: something was created before the file was checked"
    return line


@CLI_FUZZ
@given(command=st.sampled_from(COMMANDS), text=st.sampled_from(EXAMPLE_TEXTS), changes=edits)
def test_mutated_files(
    home: Path, command: list[str], text: str, changes: list[tuple[float, int, str]]
) -> None:
    path = home.parent / "file.yaml"
    path.write_bytes(_mutate(text, changes))
    (home.parent / "profile.yaml").write_text((corpus.EXAMPLES / "profile.yaml").read_text())
    check(home, command, path)


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
@pytest.mark.parametrize(
    ("label", "data"),
    [(label, data) for label, data, _ in corpus.BAD_JOBS[::3] + corpus.BAD_FLEETS[::3]],
    ids=lambda v: str(v)[:16],
)
def test_bad_files_fail_before_connecting(
    home: Path, command: list[str], label: str, data: bytes
) -> None:
    path = home.parent / "bad.yaml"
    path.write_bytes(data)
    line = check(home, command, path)
    assert "cannot reach Temporal" not in line, f"{label} was accepted by {command}"


@pytest.mark.parametrize(
    ("command", "data"),
    [
        (["apply", "-y", "-f"], corpus.GOOD_JOBS[0][1]),
        (["offers", "-f"], corpus.GOOD_JOBS[1][1]),
        (["fleet", "apply", "-f"], corpus.GOOD_FLEETS[0][1]),
        (["queue", "apply", "-f"], (corpus.EXAMPLES / "queue-research.yaml").read_bytes()),
    ],
    ids=["apply", "offers", "fleet apply", "queue apply"],
)
def test_good_files_reach_for_temporal(home: Path, command: list[str], data: bytes) -> None:
    path = home.parent / "good.yaml"
    path.write_bytes(data)
    assert "cannot reach Temporal at 127.0.0.1:1" in check(home, command, path)


@pytest.mark.parametrize(
    ("flag", "value", "expected"),
    [
        ("--gpu", "A100:²", "--gpu: GPU count '²' is not a number"),
        ("--gpu", "A100:4..2", "--gpu: range 4..2 is empty"),
        ("--max-duration", "1e20", "--max-duration: '1e20' is not a duration"),
        ("--max-duration", "400d", "--max-duration: '400d' is longer than 366d"),
        ("--time-window", "5s", "--time-window: time_window '5s' is outside 1m..7d"),
        ("--min-gpu-utilization", "101", "--min-gpu-utilization: 101 is not a percentage"),
        ("--fleet", "Bad_Fleet", "--fleet: fleet name 'Bad_Fleet' must start with a letter"),
    ],
)
def test_flag_errors_name_the_flag(home: Path, flag: str, value: str, expected: str) -> None:
    path = home.parent / "job.yaml"
    path.write_text(corpus.JOB + "resources: {gpu: 1}\n")
    code, line = invoke(["apply", "-y", "-f", str(path), flag, value])
    assert code == 1
    assert expected in line
    assert "job.yaml" not in line
    assert not home.exists()


def test_a_policy_flag_alone_says_which_flag_is_missing(home: Path) -> None:
    path = home.parent / "job.yaml"
    path.write_text(corpus.JOB + "resources: {gpu: 1}\n")
    code, line = invoke(["apply", "-y", "-f", str(path), "--time-window", "5m"])
    assert code == 1
    assert "--time-window needs --min-gpu-utilization too" in line
    # ... and combines with the policy of the job file when it has one
    path.write_text(
        corpus.JOB + "resources: {gpu: 1}\n"
        "utilization_policy: {min_gpu_utilization: 10, time_window: 30m}\n"
    )
    code, line = invoke(["apply", "-y", "-f", str(path), "--time-window", "5m"])
    assert "cannot reach Temporal" in line


@CLI_FUZZ
@given(
    flag=st.sampled_from(["--gpu", "--max-duration", "--time-window", "--fleet", "--profile"]),
    value=st.one_of(st.sampled_from(NASTY), st.text(min_size=1, max_size=300)),
)
def test_generated_flag_values(home: Path, flag: str, value: str) -> None:
    path = home.parent / "job.yaml"
    path.write_text(corpus.JOB + "resources: {gpu: 1}\n")
    shutil.rmtree(home, ignore_errors=True)
    code, line = invoke(["apply", "-y", "-f", str(path), flag, value])
    assert code in (1, 2)  # 2: click's own usage error (e.g. a value that looks like an option)
    if code == 1 and "cannot reach Temporal" not in line:
        assert line.startswith(f"error: {flag}"), line
        assert not home.exists()


def test_profile_not_found_names_what_was_looked_for(home: Path) -> None:
    path = home.parent / "job.yaml"
    path.write_text(corpus.JOB)
    _, line = invoke(["offers", "-f", str(path), "--profile", "nope.yaml"])
    assert line == f"error: --profile: profile file {home.parent / 'nope.yaml'} not found"
    _, line = invoke(["offers", "-f", str(path), "--profile", "gpu"])
    assert f"--profile: no profile named 'gpu' in {home / 'profiles'}" in line


def test_an_empty_file_says_it_is_empty(home: Path) -> None:
    path = home.parent / "job.yaml"
    path.write_text("")
    _, line = invoke(["apply", "-y", "-f", str(path)])
    assert line == f"error: {path}: the file is empty; expected a mapping of fields (name: ...)"


@pytest.mark.parametrize("name", ["a\nb.yaml", "[red]x.yaml", "\udcff.yaml", "x" * 300, "a\x00b"])
@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_odd_file_names_are_one_line(home: Path, command: list[str], name: str) -> None:
    path = home.parent / name
    if "\x00" not in name and len(name) < 255:
        path.write_bytes(b"name: x\ncommands: [a\n")  # malformed, so the error names the file
    code, line = invoke([*command, str(path)])
    assert code == 1 or (code == 2 and "\x00" in name)  # click refuses a NUL as a usage error
    if code == 1:
        assert any(why in line for why in ("malformed YAML", "cannot read", "no such file")), line
    assert not home.exists()
