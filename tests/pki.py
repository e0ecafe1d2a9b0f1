"""A throwaway certificate authority for TLS tests: a CA, a server certificate for one DNS name
and a client certificate, written as PEM files."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


@dataclass
class Pki:
    """A throwaway CA, a server certificate for SERVER_NAME and a client certificate."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _issue(
    common_name: str,
    *,
    issuer: tuple[ec.EllipticCurvePrivateKey, x509.Name] | None = None,
    dns_name: str | None = None,
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    signing_key, issuer_name = issuer or (key, subject)
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None), critical=True)
    )
    if dns_name:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.DNSName(dns_name)]), critical=False
        )
    return key, builder.sign(signing_key, hashes.SHA256())


def _write_pem(
    directory: Path, stem: str, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate
) -> tuple[Path, Path]:
    cert_path, key_path = directory / f"{stem}.pem", directory / f"{stem}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


def make_pki(directory: Path, server_name: str) -> Pki:
    ca_key, ca_cert = _issue("gpuflow test CA")
    server_key, server_cert = _issue(
        "temporal", issuer=(ca_key, ca_cert.subject), dns_name=server_name
    )
    client_key, client_cert = _issue("gpuflow-agent", issuer=(ca_key, ca_cert.subject))
    ca_path, _ = _write_pem(directory, "ca", ca_key, ca_cert)
    server_paths = _write_pem(directory, "server", server_key, server_cert)
    client_paths = _write_pem(directory, "client", client_key, client_cert)
    return Pki(ca_path, *server_paths, *client_paths)
