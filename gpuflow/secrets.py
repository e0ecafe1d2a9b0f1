"""Secrets: values a job needs (tokens, passwords) that must never enter a workflow payload, the
Temporal UI or a log.

A job refers to a secret by name in its env, `HF_TOKEN: ${{ secrets.hf_token }}`; the reference
travels through Temporal, the value does not. The host agent resolves references when it starts
the process, from the secrets file of its machine (GPUFLOW_HOME/secrets.json, mode 0600), which
`gpuflow secret set` writes and ssh provisioning copies to the host over SSH. The agent masks
the values it injected in every log byte it hands over.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Iterable
from pathlib import Path

from gpuflow.config import private_dir
from gpuflow.errors import GpuflowError, SpecError
from gpuflow.naming import SECRET_REF

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")

MIN_MASKED_LENGTH = 4
"""Values shorter than this are not masked in logs (CI systems skip very short values too):
replacing every `1` or `no` in a log would shred it and tell a reader little of the value.
`gpuflow secret set` warns about such values."""


class MissingSecret(GpuflowError):
    """A job refers to a secret the host does not have."""


class SecretsFileError(GpuflowError):
    """The secrets file exists but cannot be read as secrets: the user must fix or remove it."""


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
    """The stored secrets; a file that is not a JSON object of strings is a SecretsFileError."""
    path = path or secrets_file()
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise SecretsFileError(
            f"secrets file {path} cannot be read: {exc.strerror or exc}; fix or remove it"
        ) from None
    except UnicodeDecodeError:  # its message would quote a byte of the file
        raise SecretsFileError(
            f"secrets file {path} is not valid JSON: not UTF-8 text; fix or remove it"
        ) from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise SecretsFileError(
            f"secrets file {path} is not valid JSON: {exc}; fix or remove it"
        ) from None
    if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
        raise SecretsFileError(
            f"secrets file {path} is not valid JSON: expected an object of name: value "
            "strings; fix or remove it"
        )
    return {str(k): v for k, v in data.items()}


def set_secret(name: str, value: str, path: Path | None = None) -> None:
    if not _NAME.match(name):
        raise SpecError(f"secret name {name!r} must be letters, digits, '_' or '-'")
    path = path or secrets_file()
    data = load(path)
    data[name] = value
    set_all(data, path)


def delete_secret(name: str, path: Path | None = None) -> bool:
    path = path or secrets_file()
    data = load(path)
    if name not in data:
        return False
    del data[name]
    set_all(data, path)
    return True


def set_all(data: dict[str, str], path: Path) -> None:
    """Replace the file atomically with a fresh 0600 file: a leftover temporary file, whatever
    its mode or owner, is never reused, so its mode cannot leak into the secrets file."""
    private_dir(path.parent)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w") as handle:
            json.dump(data, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


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


def check_stored(specs_env: Iterable[dict[str, str]], path: Path) -> None:
    """SpecError naming the secrets the jobs' env refer to that are not stored in `path`
    (the control plane's file, which hosts get theirs from). An unreadable file says nothing
    here: a host's agent refuses the start then, naming the file."""
    wanted = {name for env in specs_env for name in referenced(env).values()}
    if not wanted:
        return
    try:
        stored = load(path)
    except SecretsFileError:
        return
    missing = sorted(wanted - set(stored))
    if missing:
        known = ", ".join(sorted(stored)) or "none"
        raise SpecError(
            f"env: no secret named {', '.join(missing)} (gpuflow secret set NAME; known: {known})"
        )
