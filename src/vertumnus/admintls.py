"""TLS on the Admin port: the operator's CA, the certificate it issues each pool's routers,
and the credentials its clients verify them with.

The chart makes a CA beside the operator's key (the Secret
``<release>-vertumnus-operator-admin-key``: ``ca.crt``, ``ca.key``). For each pool the
operator issues the routers a server certificate for ``<pool>-router.<namespace>.svc``,
signed by that CA, and writes it into the pool's Secret ``<pool>-router-admin`` beside
the token; the router serves Admin over TLS with it, and the operator dials each
router's address verifying that name against the CA. The token then never crosses the
network in clear text, and the operator talks only to its own pool's routers.

:func:`issue` uses ``cryptography`` (the operator's extra); the rest is gRPC's.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

__all__ = ["AdminTLS", "Issued", "issue", "new_ca", "read_ca", "router_name"]

VALID_DAYS = 90
"""How long an issued router certificate is valid (the operator issues a new one when a
third of that is left)."""


def router_name(pool: str, namespace: str) -> str:
    """The name an issued certificate is for, and the operator verifies: the pool's
    router Service's DNS name."""
    return f"{pool}-router.{namespace}.svc"


@dataclass(frozen=True)
class AdminTLS:
    """How a client verifies a router's Admin port: the CA's certificate (PEM) and the
    name the router's certificate must carry."""

    ca_pem: bytes
    server_name: str

    def credentials(self):  # type: ignore[no-untyped-def]
        import grpc

        return grpc.ssl_channel_credentials(root_certificates=self.ca_pem)

    def options(self) -> list[tuple[str, str]]:
        # The operator dials pod addresses; the name checked is the Service's.
        return [("grpc.ssl_target_name_override", self.server_name)]


@dataclass(frozen=True)
class Issued:
    cert_pem: bytes
    key_pem: bytes
    not_after: datetime.datetime


def read_ca(cert_file: str, key_file: str) -> tuple[bytes, bytes]:
    """The CA's certificate and key (PEM) from two files, checked to belong together.

    Raises ValueError naming the file that cannot be read or parsed, or the mismatch."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    from vertumnus.admintoken import read_bytes

    pems = [read_bytes("admin CA file", path) for path in (cert_file, key_file)]
    try:
        cert = x509.load_pem_x509_certificate(pems[0])
    except ValueError:
        raise ValueError(f"admin CA file {cert_file}: not a PEM certificate") from None
    try:
        key = serialization.load_pem_private_key(pems[1], password=None)
    except (ValueError, TypeError):
        raise ValueError(f"admin CA file {key_file}: not an unencrypted PEM private key") from None
    if cert.public_key().public_numbers() != key.public_key().public_numbers():  # type: ignore[union-attr]
        raise ValueError(f"admin CA files: the key {key_file} is not {cert_file}'s")
    return pems[0], pems[1]


def new_ca(common_name: str, now: datetime.datetime, days: int = 3650) -> tuple[bytes, bytes]:
    """A self-signed CA (certificate, key: PEM; P-256), valid from a day before ``now`` for
    ``days``: what the chart's ``genCA`` makes, for tests and benchmarks (and anyone
    without cert-manager who wants a CA of their own)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def issue(ca_pem: bytes, ca_key_pem: bytes, name: str, now: datetime.datetime) -> Issued:
    """A server certificate for ``name`` (its only DNS name), valid from ``now`` for
    :data:`VALID_DAYS`, with a fresh P-256 key, signed by the CA."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    ca = x509.load_pem_x509_certificate(ca_pem)
    ca_key = serialization.load_pem_private_key(ca_key_pem, password=None)
    key = ec.generate_private_key(ec.SECP256R1())
    not_after = now + datetime.timedelta(days=VALID_DAYS)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        # An hour's slack for clocks that disagree.
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(not_after)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    )
    return Issued(
        cert.public_bytes(serialization.Encoding.PEM),
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
        not_after,
    )
