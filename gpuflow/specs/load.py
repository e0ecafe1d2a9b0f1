"""Reading YAML files into specs, merging profiles, and turning validation errors into one line.

`merge_job` is the one place where profile, job file and command-line overrides meet
(flags beat the job file, which beats the profile).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from gpuflow.errors import SpecError
from gpuflow.specs.fleet import FleetSpec
from gpuflow.specs.job import JobSpec

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


def describe_validation_error(error: ValidationError, *, source: str) -> str:
    """One line per problem: where, the value, and what is allowed."""
    lines = []
    for item in error.errors():
        where = ".".join(str(part) for part in item["loc"]) or "(top level)"
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            message = "unknown field (check the spelling)"
        elif item["type"] == "missing":
            message = "required field is missing"
        value = item.get("input")
        shown = (
            "" if item["type"] in ("missing",) or isinstance(value, dict) else f" (got {value!r})"
        )
        lines.append(f"{source}: {where}: {message}{shown}")
    return "\n".join(lines)


def read_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.exists():
        raise SpecError(f"{path}: no such file")
    if path.is_dir():
        raise SpecError(f"{path}: is a directory, not a YAML file")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise SpecError(f"{path}: malformed YAML{where}: {problem}") from None
    if not isinstance(data, dict):
        raise SpecError(
            f"{path}: expected a mapping of fields at the top, got {type(data).__name__}"
        )
    return data


def _validate(model: type[M], data: dict[str, Any], source: str) -> M:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise SpecError(describe_validation_error(exc, source=source)) from None


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


def resolve_profile(ref: str, *, relative_to: Path | None = None) -> Path:
    """A profile is a path (relative to the job file) or a name under GPUFLOW_HOME/profiles."""
    candidates = [Path(ref)]
    if relative_to is not None:
        candidates.insert(0, relative_to / ref)
    candidates.append(profiles_dir() / f"{ref}.yaml")
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise SpecError(
        f"profile {ref!r} not found (looked for {', '.join(str(c) for c in candidates)})"
    )


def load_profile(path: str | Path) -> dict[str, Any]:
    data = read_yaml(path)
    data.pop("type", None)
    unknown = sorted(set(data) - PROFILE_FIELDS)
    if unknown:
        raise SpecError(
            f"{path}: {', '.join(unknown)}: not allowed in a profile "
            f"(allowed: {', '.join(sorted(PROFILE_FIELDS))})"
        )
    return data


def merge_job(
    job: dict[str, Any],
    *,
    profile: dict[str, Any] | None = None,
    overrides: dict[str, Any] | None = None,
    source: str = "job",
) -> JobSpec:
    """Profile < job file < command-line flags, merged once, then validated once."""
    merged = _deep_merge(profile or {}, {k: v for k, v in job.items() if k != "profile"})
    merged = _deep_merge(merged, {k: v for k, v in (overrides or {}).items() if v is not None})
    return _validate(JobSpec, merged, source)


def load_job(
    path: str | Path,
    *,
    profile: str | None = None,
    overrides: dict[str, Any] | None = None,
) -> JobSpec:
    """Read a job file, apply its profile (or the one named on the command line) and flags."""
    path = Path(path)
    data = read_yaml(path)
    if data.get("type", "task") != "task":
        raise SpecError(f"{path}: type: {data['type']!r} is not a job; use `gpuflow fleet apply`")
    ref = profile or data.get("profile")
    profile_data = load_profile(resolve_profile(ref, relative_to=path.parent)) if ref else None
    return merge_job(data, profile=profile_data, overrides=overrides, source=str(path))


def load_fleet(path: str | Path) -> FleetSpec:
    path = Path(path)
    data = read_yaml(path)
    if data.get("type") != "fleet":
        raise SpecError(
            f"{path}: type: must be 'fleet' for a fleet file (got {data.get('type')!r})"
        )
    return _validate(FleetSpec, data, str(path))
