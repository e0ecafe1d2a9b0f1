"""Reading YAML files into specs and merging profiles; validation errors read as one line
(gpuflow/specs/messages.py), naming how the file spelled a value YAML read as a bool or number.

`merge_job` is the one place where profile, job file and command-line flags meet (flags beat
the job file, which beats the profile). Files are read by `safe_yaml`, in bounded time and
memory; every refusal is a SpecError naming the file, the field and the value.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from gpuflow.errors import SpecError
from gpuflow.specs.flags import JobFlags
from gpuflow.specs.fleet import FleetSpec
from gpuflow.specs.job import MAX_TEXT, JobSpec
from gpuflow.specs.messages import describe_validation_error
from gpuflow.specs.queue import QueueSpec
from gpuflow.specs.safe_yaml import Spellings, YamlRefused, display_path, parse_yaml, read_text
from gpuflow.specs.units import shown

M = TypeVar("M", bound=BaseModel)

# Fields a profile may set: everything about how a job runs, nothing that makes it a job.
PROFILE_FIELDS = frozenset(
    {
        "env",
        "working_dir",
        "resources",
        "nodes",
        "priority",
        "retry",
        "max_duration",
        "utilization_policy",
        "fleets",
        "scorer",
        "tolerations",
        "labels",
    }
)
_PROFILE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}")
SAYS_ITS_TYPE: dict[type[BaseModel], str] = {FleetSpec: "fleet", QueueSpec: "queue"}
"""Files that must say what they are (`type: fleet`): one without `type` is refused, while a
job file may leave out its `type: task` (the reference pages show `type` as required here)."""


def read_yaml(
    path: str | Path, *, spellings: Spellings | None = None, example: str = "name: ..."
) -> dict[str, Any]:
    """A file's top-level mapping; SpecError (naming the file) for anything else. `spellings`,
    when given, is filled with where YAML read text as a bool or a number (safe_yaml);
    `example`: fields the kind of file holds, for the refusal of an empty one."""
    path = Path(path)
    where = display_path(path)
    try:
        data = parse_yaml(read_text(path), spellings=spellings)
    except YamlRefused as exc:
        raise SpecError(f"{where}: {exc}") from None
    if data is None:
        raise SpecError(f"{where}: the file is empty; expected a mapping of fields ({example})")
    if not isinstance(data, dict):
        raise SpecError(f"{where}: expected a mapping of fields at the top, got {shown(data)}")
    return data


def _validate(
    model: type[M],
    data: dict[str, Any],
    source: str,
    field_sources: dict[str, str] | None = None,
    spellings: Spellings | None = None,
) -> M:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        message = describe_validation_error(
            exc, source=source, field_sources=field_sources, model=model, spellings=spellings
        )
        raise SpecError(message) from None


def _deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict) and key != "env":
            merged[key] = _deep_merge(merged[key], value)
        elif key == "env" and isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = {**merged[key], **value}
        else:
            merged[key] = value
    return merged


def profiles_dir() -> Path:
    return Path(os.environ.get("GPUFLOW_HOME", Path.home() / ".gpuflow")) / "profiles"


def resolve_profile(ref: Any, *, relative_to: Path, what: str = "profile") -> Path:
    """A profile is a path (it holds a '/' or ends in .yaml: relative to `relative_to`) or a
    name under GPUFLOW_HOME/profiles. `what` names where the reference came from."""
    if not isinstance(ref, str) or not ref.strip() or len(ref) > MAX_TEXT or "\x00" in ref:
        raise SpecError(f"{what}: {shown(ref)} is not a profile name or path")
    if "/" in ref or ref.endswith((".yaml", ".yml")):
        path = relative_to / Path(ref).expanduser()
        if not _is_file(path):
            raise SpecError(f"{what}: profile file {display_path(path)} not found")
        return path
    if not _PROFILE_NAME.fullmatch(ref):
        raise SpecError(f"{what}: {shown(ref)} is not a profile name (letters, digits, '_.-')")
    path = profiles_dir() / f"{ref}.yaml"
    if not _is_file(path):
        raise SpecError(
            f"{what}: no profile named {ref!r} in {display_path(profiles_dir())} "
            f"(for a file, write a path such as ./{ref}.yaml)"
        )
    return path


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except (OSError, ValueError):  # a name too long for the system, or holding NUL
        return False


def load_profile(path: str | Path, *, spellings: Spellings | None = None) -> dict[str, Any]:
    data = read_yaml(path, spellings=spellings, example="resources: ..., env: ...")
    data.pop("type", None)
    unknown = sorted(shown(key) if not isinstance(key, str) else key for key in data)
    unknown = [key for key in unknown if key not in PROFILE_FIELDS]
    if unknown:
        raise SpecError(
            f"{display_path(path)}: {', '.join(unknown)}: not allowed in a profile "
            f"({_profile_hint(unknown)})"
        )
    return data


def _profile_hint(unknown: list[str]) -> str:
    """What to do with fields a profile does not take: a job file's own field is set in the
    job file (a close profile field's name would mislead: `alternatives` is no `tolerations`);
    a typo gets the closest profile field; otherwise the fields a profile takes."""
    hints = []
    for key in unknown:
        found = difflib.get_close_matches(key, sorted(PROFILE_FIELDS), n=1, cutoff=0.6)
        if key in JobSpec.model_fields or key == "profile":
            hints.append(f"set {key} in the job file")
        elif found:
            hints.append(f"{key}: did you mean {found[0]}?")
    return "; ".join(hints) or f"allowed: {', '.join(sorted(PROFILE_FIELDS))}"


def merge_job(
    job: dict[str, Any],
    *,
    profile: dict[str, Any] | None = None,
    overrides: dict[str, Any] | None = None,
    flags: JobFlags | None = None,
    source: str = "job",
    profile_source: str = "profile",
    spellings: Spellings | None = None,
) -> JobSpec:
    """Profile < job file < command-line flags, merged once, then validated once.

    `flags` are checked one by one first (their errors name the flag); `overrides` are fields
    given by code, validated with the rest; `spellings`: how the files spelled the values YAML
    read as bools and numbers (the job file's over the profile's)."""
    top = {k: v for k, v in (overrides or {}).items() if v is not None}
    if flags is not None:
        top = _deep_merge(top, flags.overrides())
    merged = _deep_merge(profile or {}, {k: v for k, v in job.items() if k != "profile"})
    merged = _deep_merge(_env_as_written(merged, spellings or {}), top)
    if flags is not None:
        flags.check_policy(merged.get("utilization_policy"), source=source)
    # A bad value that only the profile set is reported against the profile's file.
    from_profile = {str(k): profile_source for k in profile or {} if k not in job and k not in top}
    return _validate(JobSpec, merged, source, from_profile, spellings)


def _env_as_written(data: dict[str, Any], spellings: Spellings) -> dict[str, Any]:
    """The job's `env` names and values that YAML read as a bool or a number, given back as
    the file wrote them: an environment holds text, and `DEBUG: yes` means `yes`, not Python's
    `True` (nor `0x1F` 31; `OFF: 1` names OFF, not False). Read before flags and code's
    overrides are merged: theirs are kept as given."""
    env = data.get("env")
    if not isinstance(env, dict) or not spellings:
        return data

    def as_written(place: tuple[Any, ...], value: Any) -> Any:
        spelled = spellings.get(place)
        if spelled is None or type(spelled[1]) is not type(value) or spelled[1] != value:
            return value
        return spelled[0]

    return {
        **data,
        "env": {
            as_written(("env", key, "[key]"), key): as_written(("env", key), value)
            for key, value in env.items()
        },
    }


def load_job(
    path: str | Path,
    *,
    profile: str | None = None,
    overrides: dict[str, Any] | None = None,
    flags: JobFlags | None = None,
) -> JobSpec:
    """Read a job file, apply its profile (or the one named on the command line) and flags.

    A profile named on the command line is relative to the working directory; one named in the
    file is relative to the file."""
    path = Path(path)
    source = display_path(path)
    spelled: Spellings = {}
    data = read_yaml(path, spellings=spelled)
    kind = data.get("type", "task")
    if kind != "task":
        hint = (
            f"use `gpuflow {kind} apply` for a {kind} file"
            if kind in ("fleet", "queue")
            else "a job file says type: task, or no type"
        )
        raise SpecError(f"{source}: type: {shown(kind)} is not a job; {hint}")
    if profile is not None:
        found = resolve_profile(profile, relative_to=Path.cwd(), what="--profile")
    elif "profile" in data:
        found = resolve_profile(data["profile"], relative_to=path.parent, what=f"{source}: profile")
    else:
        found = None
    profile_spelled: Spellings = {}
    return merge_job(
        data,
        profile=load_profile(found, spellings=profile_spelled) if found is not None else None,
        overrides=overrides,
        flags=flags,
        source=source,
        profile_source=display_path(found) if found is not None else "profile",
        spellings={**profile_spelled, **spelled},
    )


def _check_type(data: dict[str, Any], model: type[BaseModel], source: str) -> None:
    """A fleet or queue file says what it is: `type: fleet`, `type: queue` (SAYS_ITS_TYPE)."""
    kind = SAYS_ITS_TYPE[model]
    if "type" not in data:
        raise SpecError(f"{source}: type is missing: a {kind} file says `type: {kind}`")
    if data["type"] != kind:
        raise SpecError(
            f"{source}: type: must be '{kind}' for a {kind} file (got {shown(data['type'])})"
        )


def load_fleet(path: str | Path) -> FleetSpec:
    path = Path(path)
    source = display_path(path)
    spelled: Spellings = {}
    data = read_yaml(path, spellings=spelled)
    _check_type(data, FleetSpec, source)
    return _validate(FleetSpec, data, source, spellings=spelled)


def load_queue(path: str | Path) -> QueueSpec:
    path = Path(path)
    source = display_path(path)
    spelled: Spellings = {}
    data = read_yaml(path, spellings=spelled)
    _check_type(data, QueueSpec, source)
    return _validate(QueueSpec, data, source, spellings=spelled)


def model_of(model: type[M], value: object, what: str) -> M:
    """`value` as a `model`: itself, or validated from a mapping of its fields (a one-line
    SpecError naming `what`, as a file's names the file); SpecError for anything else."""
    if isinstance(value, model):
        return value
    if isinstance(value, Mapping):
        return _validate(model, dict(value), what)
    raise SpecError(
        f"a {what} is a {model.__name__} or a mapping of its fields, not {type(value).__name__}"
    )
