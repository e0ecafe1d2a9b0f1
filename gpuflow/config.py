"""Where gpuflow finds Temporal, and how it connects (always with the pydantic converter).

Like a docker context, GPUFLOW_HOME names the embedded stack that its commands reach: the
address its `gpuflow up` recorded in up.ready, while that process runs. GPUFLOW_TEMPORAL_ADDRESS
(a real cluster) or GPUFLOW_TEMPORAL_PORT still win.

A real cluster may need TLS (a custom CA, a client certificate for mTLS, a server name override)
or an API key (Temporal Cloud). The settings name files; their contents are read when connecting,
so the config stays small, printable and free of key material."""

from __future__ import annotations

import asyncio
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from temporalio.client import Client
from temporalio.service import TLSConfig

from gpuflow.errors import ConnectionFailed, SpecError
from gpuflow.payloads import DATA_CONVERTER
from gpuflow.stack_record import read_stack_record

DEFAULT_TEMPORAL_PORT = 7233

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")

TEMPORAL_VARIABLES = (
    "GPUFLOW_TEMPORAL_ADDRESS",
    "GPUFLOW_TEMPORAL_NAMESPACE",
    "GPUFLOW_TEMPORAL_PORT",
    "GPUFLOW_TEMPORAL_TLS",
    "GPUFLOW_TEMPORAL_TLS_CERT",
    "GPUFLOW_TEMPORAL_TLS_KEY",
    "GPUFLOW_TEMPORAL_TLS_CA",
    "GPUFLOW_TEMPORAL_TLS_SERVER_NAME",
    "GPUFLOW_TEMPORAL_API_KEY",
    "GPUFLOW_TEMPORAL_API_KEY_FILE",
)
"""Every variable `TemporalConfig.from_env` reads."""

PRIVATE_DIR_MODE = 0o700
"""GPUFLOW_HOME and the directories gpuflow keeps jobs, logs and secrets in: owner only."""


def private_dir(path: Path) -> Path:
    """`path` as a directory; created (with missing parents) with mode 0700 when it is missing.
    An existing directory keeps its mode: it may be a place the user chose and shares."""
    if not path.is_dir():
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            path.mkdir(mode=PRIVATE_DIR_MODE)
        except FileExistsError:
            return path  # made by someone else meanwhile: theirs to set
        os.chmod(path, PRIVATE_DIR_MODE)  # whatever the umask
    return path


def gpuflow_home() -> Path:
    return Path(os.environ.get("GPUFLOW_HOME") or Path.home() / ".gpuflow")


def ensure_home(home: Path) -> Path:
    """GPUFLOW_HOME, created 0700; an existing one that this user owns loses its group and
    other bits too, since it holds the database, the dev server's histories and the secrets
    (versions before 0700 created it 0755)."""
    private_dir(home)
    info = home.stat()
    if info.st_uid == os.getuid() and info.st_mode & 0o077:
        os.chmod(home, info.st_mode & 0o700)
    return home


# Which variable sets which file, so errors name what the user wrote.
_FILE_VARIABLES = {
    "tls_cert": "GPUFLOW_TEMPORAL_TLS_CERT",
    "tls_key": "GPUFLOW_TEMPORAL_TLS_KEY",
    "tls_ca": "GPUFLOW_TEMPORAL_TLS_CA",
    "api_key_file": "GPUFLOW_TEMPORAL_API_KEY_FILE",
}


@dataclass(frozen=True)
class TemporalConfig:
    address: str
    """host:port of the Temporal frontend."""
    namespace: str = "default"
    embedded: bool = True
    """True when the address is gpuflow's own dev server (`gpuflow up`); it never uses TLS."""
    tls: bool | None = None
    """Use TLS. None: only when a certificate, key, CA, server name or API key is set."""
    tls_cert: Path | None = None
    """PEM client certificate for mTLS; needs `tls_key`."""
    tls_key: Path | None = None
    """PEM private key of `tls_cert`."""
    tls_ca: Path | None = None
    """PEM CA that signed the server's certificate, instead of the system's roots."""
    tls_server_name: str | None = None
    """Name the server's certificate is checked against (and sent as SNI), instead of the host
    in `address`."""
    api_key: str | None = field(default=None, repr=False)
    """API key (Temporal Cloud), sent as a bearer token. Never shown in repr or errors."""
    api_key_file: Path | None = None
    """File that holds the API key, read when connecting; keeps the key out of the environment."""

    def __post_init__(self) -> None:
        problem = self._problem()
        if problem:
            raise SpecError(problem)

    def _tls_settings(self) -> list[str]:
        """Names of the TLS fields that are set."""
        names = ("tls_cert", "tls_key", "tls_ca", "tls_server_name")
        return [name for name in names if getattr(self, name) is not None]

    def _problem(self) -> str | None:
        tls_settings = self._tls_settings()
        if self.embedded and (tls_settings or self.tls or self.has_api_key):
            return (
                "TLS and API key settings apply to a real cluster, not the embedded dev server; "
                "set GPUFLOW_TEMPORAL_ADDRESS"
            )
        if (self.tls_cert is None) != (self.tls_key is None):
            given, missing = ("CERT", "KEY") if self.tls_key is None else ("KEY", "CERT")
            return (
                f"GPUFLOW_TEMPORAL_TLS_{given} is set but GPUFLOW_TEMPORAL_TLS_{missing} is not; "
                "mTLS needs both the client certificate and its key"
            )
        if self.tls is False and tls_settings:
            variables = ", ".join(f"GPUFLOW_TEMPORAL_{name.upper()}" for name in tls_settings)
            return f"GPUFLOW_TEMPORAL_TLS is false but {variables} is set; drop one of them"
        if self.api_key is not None and self.api_key_file is not None:
            return "set GPUFLOW_TEMPORAL_API_KEY or GPUFLOW_TEMPORAL_API_KEY_FILE, not both"
        if self.api_key is not None and not self.api_key.strip():
            return "GPUFLOW_TEMPORAL_API_KEY is empty; unset it or give the key"
        return None

    @property
    def has_api_key(self) -> bool:
        return self.api_key is not None or self.api_key_file is not None

    def read_file(self, name: str) -> bytes | None:
        """The content of the file a setting names (`tls_ca`, `tls_cert`, `tls_key`,
        `api_key_file`), read now; None when unset. An unreadable file is a one-line
        ConnectionFailed naming the variable and the path, never the content."""
        path: Path | None = getattr(self, name)
        if path is None:
            return None
        try:
            return path.read_bytes()
        except OSError as exc:
            reason = exc.strerror or type(exc).__name__
            raise ConnectionFailed(
                f"{_FILE_VARIABLES[name]}: cannot read {path} ({reason})"
            ) from None

    def read_api_key(self) -> str | None:
        """The API key, given directly or read from its file now; None without one."""
        if self.api_key is not None:
            return self.api_key.strip()
        content = self.read_file("api_key_file")
        if content is None:
            return None
        key = content.decode(errors="replace").strip()
        if not key:
            raise ConnectionFailed(f"GPUFLOW_TEMPORAL_API_KEY_FILE: {self.api_key_file} is empty")
        return key

    @property
    def uses_tls(self) -> bool:
        """Whether connections are encrypted: the one place that decides it."""
        if self.embedded:
            return False
        if self.tls is not None:
            return self.tls
        return self.has_api_key or bool(self._tls_settings())

    @classmethod
    def from_env(cls) -> TemporalConfig:
        """Where clients and workers find Temporal; the first that applies:
        GPUFLOW_TEMPORAL_ADDRESS, a real cluster (with the TLS and API key variables);
        GPUFLOW_TEMPORAL_PORT, an embedded dev server on 127.0.0.1;
        the embedded stack that GPUFLOW_HOME's `gpuflow up` runs (its up.ready, while that
        process lives: a stale record is not followed, as its port may be another's now);
        else 127.0.0.1:7233."""
        record = read_stack_record(gpuflow_home())
        if cls.configured() is None and record and record.temporal and record.serving:
            return cls(address=record.temporal, namespace=_namespace())
        return cls.to_serve()

    @classmethod
    def to_serve(cls) -> TemporalConfig:
        """What `gpuflow up` serves: the cluster or port the variables name, else a dev server
        on 127.0.0.1:7233; never the address another stack recorded."""
        default = cls(address=f"127.0.0.1:{DEFAULT_TEMPORAL_PORT}", namespace=_namespace())
        return cls.configured() or default

    @classmethod
    def configured(cls) -> TemporalConfig | None:
        """What GPUFLOW_TEMPORAL_ADDRESS (a cluster, which ignores the port) or
        GPUFLOW_TEMPORAL_PORT (a dev server on 127.0.0.1) ask for; None when neither is set."""
        address = os.environ.get("GPUFLOW_TEMPORAL_ADDRESS")
        if address:
            return cls(
                address=cluster_address(address),
                namespace=_namespace(),
                embedded=False,
                tls=_env_bool("GPUFLOW_TEMPORAL_TLS"),
                tls_cert=_env_path("GPUFLOW_TEMPORAL_TLS_CERT"),
                tls_key=_env_path("GPUFLOW_TEMPORAL_TLS_KEY"),
                tls_ca=_env_path("GPUFLOW_TEMPORAL_TLS_CA"),
                tls_server_name=os.environ.get("GPUFLOW_TEMPORAL_TLS_SERVER_NAME") or None,
                api_key=os.environ.get("GPUFLOW_TEMPORAL_API_KEY") or None,
                api_key_file=_env_path("GPUFLOW_TEMPORAL_API_KEY_FILE"),
            )
        if "GPUFLOW_TEMPORAL_PORT" not in os.environ:
            return None
        port = env_port("GPUFLOW_TEMPORAL_PORT", DEFAULT_TEMPORAL_PORT)
        return cls(address=f"127.0.0.1:{port}", namespace=_namespace())


def _namespace() -> str:
    return os.environ.get("GPUFLOW_TEMPORAL_NAMESPACE", "default")


def env_port(variable: str, default: int) -> int:
    """The port a variable names; `default` when it is unset."""
    raw = os.environ.get(variable, str(default))
    if not raw.strip().isdigit() or not 0 < int(raw) < 65536:
        raise SpecError(f"{variable} must be a port number, not {raw!r}")
    return int(raw)


def cluster_address(raw: str) -> str:
    """GPUFLOW_TEMPORAL_ADDRESS as HOST:PORT. A URL is refused: the SDK only warned of its
    scheme, then failed on a target it had mangled (`[http://host:7233]:7233`)."""
    value = raw.strip()
    host_port = value.split("://", 1)[-1].split("/", 1)[0]
    address = with_port(host_port) if host_port else ""
    port = address.rsplit(":", 1)[-1]
    port_ok = port.isdigit() and 0 < int(port) < 65536
    if host_port != value or not port_ok:
        example = host_port if host_port and port_ok else "temporal.example.com:7233"
        raise SpecError(
            f"GPUFLOW_TEMPORAL_ADDRESS must be HOST[:PORT], without a scheme or path "
            f"(e.g. {example}), not {raw!r}"
        )
    return address


def with_port(address: str) -> str:
    """HOST[:PORT] with Temporal's port when none is given (`temporal.example.com` reached
    port 80; `[::1]` and `::1` are IPv6 hosts)."""
    if address.startswith("["):
        return address if "]:" in address else f"{address}:{DEFAULT_TEMPORAL_PORT}"
    if address.count(":") > 1:  # a bare IPv6 address
        return f"[{address}]:{DEFAULT_TEMPORAL_PORT}"
    return address if ":" in address else f"{address}:{DEFAULT_TEMPORAL_PORT}"


def _env_bool(variable: str) -> bool | None:
    raw = os.environ.get(variable)
    if raw is None or not raw.strip():
        return None
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise SpecError(f"{variable} must be true or false, not {raw!r}")


def _env_path(variable: str) -> Path | None:
    raw = os.environ.get(variable)
    return Path(raw).expanduser() if raw and raw.strip() else None


def _tls(config: TemporalConfig) -> TLSConfig | bool:
    if not config.uses_tls:
        return False
    return TLSConfig(
        server_root_ca_cert=config.read_file("tls_ca"),
        domain=config.tls_server_name,
        client_cert=config.read_file("tls_cert"),
        client_private_key=config.read_file("tls_key"),
    )


async def connect_temporal(config: TemporalConfig | None = None) -> Client:
    config = config or TemporalConfig.from_env()
    tls = _tls(config)
    api_key = config.read_api_key()
    try:
        return await Client.connect(
            config.address,
            namespace=config.namespace,
            data_converter=DATA_CONVERTER,
            tls=tls,
            api_key=api_key,
        )
    except Exception as exc:
        if config.embedded:
            hint = "start it with `gpuflow up`"
        elif config.uses_tls:
            hint = "check GPUFLOW_TEMPORAL_ADDRESS and the GPUFLOW_TEMPORAL_TLS_* variables"
        else:
            hint = "check GPUFLOW_TEMPORAL_ADDRESS, or GPUFLOW_TEMPORAL_TLS=true if it needs TLS"
        reason = connect_reason(exc)
        if api_key:
            reason = reason.replace(api_key, "<api key>")
        via = " over TLS" if config.uses_tls else ""
        raise ConnectionFailed(
            f"cannot reach Temporal at {config.address}{via} ({reason}); {hint}"
        ) from None


# The SDK's transport errors are Rust's debug output; the words in them, most telling first:
# the OS's (`Os { code: 111, kind: ConnectionRefused, message: "Connection refused" }`), an
# error's text or name (`error: InvalidCertificate(UnknownIssuer)`), hyper's, any message, and
# at least the kind of error (`kind: UnexpectedEof`).
_TRANSPORT_WORDS = (
    re.compile(r'Os \{[^}]*message: "([^"]+)"'),
    re.compile(r'error: "([^"]+)"'),
    re.compile(r"error: (\w+\(\w+\))"),
    re.compile(r'hyper::Error\(\w+, "([^"]+)"\)'),
    re.compile(r'message: "([^"]+)"'),
    re.compile(r"kind: (\w+)"),
)


def _spoken(name: str) -> str:
    """`InvalidCertificate(UnknownIssuer)` as "invalid certificate: unknown issuer"."""
    words = re.sub(r"(?<=[a-z])(?=[A-Z])", " ", name).lower()
    return words.replace("(", ": ").replace(")", "")


def connect_reason(exc: BaseException) -> str:
    """Why a connection failed, in one line of words ("connection refused"), never the
    transport's debug output (`tonic::transport::Error(Transport, ConnectError(...))`)."""
    text = str(exc).strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    if "tonic::" not in first:
        return first
    found = next((m for p in _TRANSPORT_WORDS if (m := p.search(first))), None)
    if found is None:
        return "the connection failed"
    words = found.group(1)
    words = _spoken(words) if " " not in words else words[:1].lower() + words[1:]
    if '"dns error"' in first:
        return f"cannot resolve the host: {words}"
    if "after connection" in first:
        return f"connected, but no Temporal answered: {words}"
    return words


async def connect_when_ready(config: TemporalConfig, *, within_s: float) -> Client:
    """`connect_temporal` to a server that is starting: a dev server opens its port before its
    frontend is healthy ('Frontend is not healthy yet'), so a refused connection is tried again
    every half second until `within_s` has passed; then its error is raised."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            return await connect_temporal(config)
        except ConnectionFailed:
            if time.monotonic() >= deadline:
                raise
            await asyncio.sleep(0.5)
