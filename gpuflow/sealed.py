"""Secrets sealed for the control plane, so that a value never enters a Temporal payload or
history in clear (DESIGN.md, invariant 7) although `gpuflow secret set` goes through Temporal.

The control plane has an X25519 key pair (its private half in GPUFLOW_HOME/control-key, 0600,
on the control worker only). The client fetches the public half through the API, and seals the
value to it: an ephemeral X25519 key, HKDF-SHA256 of the shared secret, AES-256-GCM with the
secret's name as associated data (a sealed value cannot be replayed under another name). The
history holds the ephemeral public key, the nonce and the ciphertext; only the control worker
can open them, and it writes the value to its secrets file, from which ssh provisioning copies
it to hosts and local and simulated agents read it.

`cryptography` is imported inside the functions: this module's model is part of the API
workflow's payloads, and workflow code never loads it.
"""

from __future__ import annotations

import base64
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel

from gpuflow.config import private_dir
from gpuflow.errors import GpuflowError

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

_INFO = b"gpuflow sealed secret v1"
KEY_FILE = "control-key"


class SealedSecret(BaseModel):
    name: str
    sender: str
    """The ephemeral public key, base64."""
    nonce: str
    ciphertext: str


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _key(shared: bytes, sender: bytes, recipient: bytes) -> bytes:
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    return HKDF(algorithm=hashes.SHA256(), length=32, salt=sender + recipient, info=_INFO).derive(
        shared
    )


def _raw_public(private: X25519PrivateKey) -> bytes:
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    return private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def seal(name: str, value: str, recipient: str) -> SealedSecret:
    """`value` sealed to the control plane's public key `recipient` (base64)."""
    from cryptography.hazmat.primitives.asymmetric.x25519 import (
        X25519PrivateKey,
        X25519PublicKey,
    )
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    try:
        recipient_raw = base64.b64decode(recipient, validate=True)
        their = X25519PublicKey.from_public_bytes(recipient_raw)
    except ValueError:
        raise GpuflowError("the control plane's public key is malformed") from None
    ephemeral = X25519PrivateKey.generate()
    sender = _raw_public(ephemeral)
    key = _key(ephemeral.exchange(their), sender, recipient_raw)
    nonce = os.urandom(12)
    ciphertext = AESGCM(key).encrypt(nonce, value.encode(), name.encode())
    return SealedSecret(
        name=name, sender=_b64(sender), nonce=_b64(nonce), ciphertext=_b64(ciphertext)
    )


def open_sealed(sealed: SealedSecret, private: X25519PrivateKey) -> str:
    """The value; GpuflowError when it was not sealed to `private` or was altered."""
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PublicKey
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    try:
        sender = base64.b64decode(sealed.sender, validate=True)
        nonce = base64.b64decode(sealed.nonce, validate=True)
        ciphertext = base64.b64decode(sealed.ciphertext, validate=True)
        key = _key(
            private.exchange(X25519PublicKey.from_public_bytes(sender)),
            sender,
            _raw_public(private),
        )
        return AESGCM(key).decrypt(nonce, ciphertext, sealed.name.encode()).decode()
    except (ValueError, InvalidTag, UnicodeDecodeError):
        raise GpuflowError(
            f"secret {sealed.name}: the sealed value cannot be opened (sealed to another "
            "control plane's key, or altered); set it again"
        ) from None


def public_key(private: X25519PrivateKey) -> str:
    return _b64(_raw_public(private))


def control_key(home: Path) -> X25519PrivateKey:
    """The control plane's private key, made (0600) on first use."""
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
    from cryptography.hazmat.primitives.serialization import (
        Encoding,
        NoEncryption,
        PrivateFormat,
    )

    path = home / KEY_FILE
    try:
        return X25519PrivateKey.from_private_bytes(path.read_bytes())
    except FileNotFoundError:
        pass
    except ValueError:
        raise GpuflowError(f"{path} is not a gpuflow control key; remove it") from None
    private = X25519PrivateKey.generate()
    raw = private.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
    private_dir(home)
    fd, tmp = tempfile.mkstemp(dir=home, prefix=f".{KEY_FILE}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(raw)
        # Two control workers making it at once: the first one's stays, both use it.
        os.link(tmp, path)
    except FileExistsError:
        return control_key(home)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return private
