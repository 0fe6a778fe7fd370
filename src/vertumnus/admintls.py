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
import hashlib
import hmac
from dataclasses import dataclass

__all__ = [
    "AdminTLS",
    "Issued",
    "cert_seed",
    "issue",
    "new_ca",
    "period_of",
    "pool_certificate",
    "read_ca",
    "router_name",
]

VALID_DAYS = 90
"""How long an issued router certificate is valid."""
PERIOD_DAYS = 30
"""With a seed (:func:`cert_seed`), every issue within one period of this many days (counted
from the Unix epoch) gives the same certificate, byte for byte: a restarted operator, or a
peer that takes over, issues what the routers hold already, and the pool's Secret does not
change. The next period's certificate replaces it with two thirds of its validity left."""


def period_of(now: datetime.datetime) -> int:
    """The issuing period ``now`` falls in (:data:`PERIOD_DAYS`)."""
    return int(now.timestamp() // (PERIOD_DAYS * 86400))


def cert_seed(key: bytes, namespace: str, name: str, uid: str) -> bytes:
    """What a pool's routers' certificates are derived from: an HMAC-SHA256 of the pool's
    identity under the operator's key (as its Admin token is, for another purpose)."""
    return hmac.new(key, f"admin-cert/{namespace}/{name}/{uid}".encode(), hashlib.sha256).digest()


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
        # The operator dials pod addresses; the name checked is the Service's. Empty: the
        # name the client dials.
        return [("grpc.ssl_target_name_override", self.server_name)] if self.server_name else []


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


def new_ca(
    common_name: str, now: datetime.datetime, days: int = 3650, rsa: bool = False
) -> tuple[bytes, bytes]:
    """A self-signed CA (certificate, key: PEM; P-256, or RSA 2048 as the chart's ``genCA``
    makes), valid from a day before ``now`` for ``days``: for tests and benchmarks (and
    anyone without cert-manager who wants a CA of their own)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.asymmetric import rsa as rsa_keys
    from cryptography.x509.oid import NameOID

    key: ec.EllipticCurvePrivateKey | rsa_keys.RSAPrivateKey = (
        rsa_keys.generate_private_key(public_exponent=65537, key_size=2048)
        if rsa
        else ec.generate_private_key(ec.SECP256R1())
    )
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


_P256_ORDER = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551


def pool_certificate(
    ca: tuple[bytes, bytes], key: bytes, namespace: str, pool: str, uid: str, now: datetime.datetime
) -> Issued:
    """The certificate the operator with ``key`` issues the routers of pool
    ``namespace/pool`` (``uid``) from ``ca`` at ``now``: for :func:`router_name`, derived
    from :func:`cert_seed`, so the same all through ``now``'s period."""
    name = router_name(pool, namespace)
    return issue(ca[0], ca[1], name, now, cert_seed(key, namespace, pool, uid))


def issue(
    ca_pem: bytes,
    ca_key_pem: bytes,
    name: str,
    now: datetime.datetime,
    seed: bytes | None = None,
) -> Issued:
    """A server certificate for ``name`` (its only DNS name), valid for :data:`VALID_DAYS`,
    with a P-256 key, signed by the CA. Without ``seed``: a fresh key, valid from ``now``.
    With one (:func:`cert_seed`): the key, serial number and validity derived from it and
    ``now``'s period (:data:`PERIOD_DAYS`), and the signature deterministic (RFC 6979 for
    an EC CA; an RSA CA's PKCS #1 v1.5 signature is), so the same in the whole period."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    ca = x509.load_pem_x509_certificate(ca_pem)
    ca_key = serialization.load_pem_private_key(ca_key_pem, password=None)
    if seed is None:
        key = ec.generate_private_key(ec.SECP256R1())
        serial, start = x509.random_serial_number(), now
    else:
        period = period_of(now)

        def derived(what: str) -> int:
            mac = hmac.new(seed, f"{what}/{period}".encode(), hashlib.sha256).digest()
            return int.from_bytes(mac, "big")

        key = ec.derive_private_key(derived("key") % (_P256_ORDER - 1) + 1, ec.SECP256R1())
        serial = (derived("serial") >> 104) | (1 << 151)  # positive, 152 bits (< 20 octets)
        start = datetime.datetime.fromtimestamp(period * PERIOD_DAYS * 86400, datetime.UTC)
    not_after = start + datetime.timedelta(days=VALID_DAYS)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(serial)
        # An hour's slack for clocks that disagree.
        .not_valid_before(start - datetime.timedelta(hours=1))
        .not_valid_after(not_after)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
    )
    deterministic = isinstance(ca_key, ec.EllipticCurvePrivateKey)
    cert = builder.sign(
        ca_key,  # type: ignore[arg-type]
        hashes.SHA256(),
        ecdsa_deterministic=True if deterministic else None,
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
