"""Secrets: values a job needs (tokens, passwords) that must never enter a workflow payload, the
Temporal UI or a log.

A job refers to a secret by name in its env, `HF_TOKEN: ${{ secrets.hf_token }}`; the reference
travels through Temporal, the value does not. The host agent resolves references when it starts
the process, from the secrets file of its machine (GPUFLOW_HOME/secrets.json, mode 0600), which
`gpuflow secret set` writes and ssh provisioning copies to the host over SSH.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from gpuflow.errors import GpuflowError, SpecError

SECRET_REF = re.compile(r"^\$\{\{\s*secrets\.([A-Za-z_][A-Za-z0-9_-]*)\s*\}\}$")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")


class MissingSecret(GpuflowError):
    """A job refers to a secret the host does not have."""


def secrets_file(home: Path | None = None) -> Path:
    if os.environ.get("GPUFLOW_SECRETS_FILE"):
        return Path(os.environ["GPUFLOW_SECRETS_FILE"])
    base = home or Path(os.environ.get("GPUFLOW_HOME") or Path.home() / ".gpuflow")
    return base / "secrets.json"


def referenced(env: dict[str, str]) -> dict[str, str]:
    """env key -> secret name, for the values that are secret references."""
    out = {}
    for key, value in env.items():
        match = SECRET_REF.match(value.strip())
        if match:
            out[key] = match.group(1)
    return out


def load(path: Path | None = None) -> dict[str, str]:
    path = path or secrets_file()
    if not path.exists():
        return {}
    data = json.loads(path.read_text())
    return {str(k): str(v) for k, v in data.items()}


def set_secret(name: str, value: str, path: Path | None = None) -> None:
    if not _NAME.match(name):
        raise SpecError(f"secret name {name!r} must be letters, digits, '_' or '-'")
    path = path or secrets_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    data = load(path)
    data[name] = value
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(data, handle)
    tmp.replace(path)


def delete_secret(name: str, path: Path | None = None) -> bool:
    path = path or secrets_file()
    data = load(path)
    if name not in data:
        return False
    del data[name]
    set_all(data, path)
    return True


def set_all(data: dict[str, str], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(data, handle)
    tmp.replace(path)


def resolve(env: dict[str, str], *, host: str, path: Path | None = None) -> dict[str, str]:
    """The env with secret references replaced by their values on this host."""
    refs = referenced(env)
    if not refs:
        return dict(env)
    values = load(path)
    missing = sorted({name for name in refs.values() if name not in values})
    if missing:
        raise MissingSecret(
            f"host {host} has no secret {', '.join(missing)} "
            f"(set it with `gpuflow secret set {missing[0]}`)"
        )
    return {key: values[refs[key]] if key in refs else value for key, value in env.items()}
