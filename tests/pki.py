"""Certificates the TLS tests generate for themselves: a CA, server and client ends."""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class PKI:
    dir: Path
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    rogue_cert: Path  # a client cert from a CA the server does not trust
    rogue_key: Path


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _issue(subject, key, issuer, issuer_key, *, ca=False, san=None, usage=None):
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(_name(issuer))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()), False
        )
    )
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), True
        )
    if san:
        builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
    if usage:
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _write(path: Path, cert, key) -> tuple[Path, Path]:
    cert_path, key_path = path.with_suffix(".crt"), path.with_suffix(".key")
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


def make_pki(d: Path) -> PKI:
    """A CA, a server certificate (IP SAN 127.0.0.1: Prometheus, in Go, ignores the CN),
    a client certificate, and a client certificate from a CA nobody trusts."""
    keys = {n: ec.generate_private_key(ec.SECP256R1()) for n in ("ca", "srv", "cli", "rca", "rc")}
    ca = _issue("test-ca", keys["ca"], "test-ca", keys["ca"], ca=True)
    ca_path, _ = _write(d / "ca", ca, keys["ca"])
    san = [
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.DNSName("localhost"),
    ]
    srv = _issue(
        "localhost",
        keys["srv"],
        "test-ca",
        keys["ca"],
        san=san,
        usage=ExtendedKeyUsageOID.SERVER_AUTH,
    )
    cli = _issue(
        "scraper", keys["cli"], "test-ca", keys["ca"], usage=ExtendedKeyUsageOID.CLIENT_AUTH
    )
    rogue_ca = _issue("rogue-ca", keys["rca"], "rogue-ca", keys["rca"], ca=True)
    rogue = _issue(
        "scraper", keys["rc"], "rogue-ca", keys["rca"], usage=ExtendedKeyUsageOID.CLIENT_AUTH
    )
    rogue_cert, rogue_key = _write(d / "rogue", rogue, keys["rc"])
    with rogue_cert.open("ab") as fh:  # send the chain so only trust, not shape, differs
        fh.write(rogue_ca.public_bytes(serialization.Encoding.PEM))
    server_cert, server_key = _write(d / "server", srv, keys["srv"])
    client_cert, client_key = _write(d / "client", cli, keys["cli"])
    return PKI(d, ca_path, server_cert, server_key, client_cert, client_key, rogue_cert, rogue_key)
