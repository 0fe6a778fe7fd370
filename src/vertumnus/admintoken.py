"""The Admin API's token, as every party spells it: the router that checks it
(:mod:`vertumnus.router.adminauth`), the operator that writes it into each pool's
Secret and sends it, and ``vertumnus admin``.

A call carries the token as gRPC metadata ``authorization: Bearer <token>``. A file
holds it on its first line. The operator does not store tokens: it derives each
pool's from its own key (:func:`pool_token`), so a restarted operator sends what it
wrote before without reading any Secret back, and a pool deleted and created again
under the same name (a new uid) gets a new token.
"""

from __future__ import annotations

import base64
import hashlib
import hmac

__all__ = ["HEADER", "SCHEME", "bearer", "pool_token", "read_bytes", "read_key", "read_token"]

HEADER = "authorization"
SCHEME = "Bearer "

MIN_KEY_BYTES = 16
"""The shortest operator key accepted: a short key would make every pool's token guessable."""


def bearer(token: str) -> tuple[tuple[str, str]]:
    """The call metadata that carries ``token``."""
    return ((HEADER, SCHEME + token),)


def read_token(path: str) -> str:
    """The token in ``path`` (its first line, without surrounding blanks).

    Raises ValueError naming the file when it cannot be read or holds no token."""
    try:
        with open(path, encoding="utf-8") as f:
            token = f.readline().strip()
    except OSError as e:
        raise ValueError(f"admin token file {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise ValueError(f"admin token file {path}: not UTF-8 text") from None
    if not token:
        raise ValueError(f"admin token file {path}: empty (expected the token on its first line)")
    return token


def read_bytes(what: str, path: str) -> bytes:
    """The file's bytes; ValueError ``"{what} {path}: why"`` when it cannot be read."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise ValueError(f"{what} {path}: {e.strerror or e}") from None


def read_key(path: str) -> bytes:
    """The operator's key: the file's bytes without surrounding blanks.

    Raises ValueError naming the file when it cannot be read or is too short."""
    key = read_bytes("admin key file", path).strip()
    if len(key) < MIN_KEY_BYTES:
        raise ValueError(
            f"admin key file {path}: {len(key)} bytes, need at least {MIN_KEY_BYTES} "
            "(e.g. head -c 32 /dev/urandom | base64)"
        )
    return key


def pool_token(key: bytes, namespace: str, name: str, uid: str) -> str:
    """The Admin token of the pool ``namespace/name`` with ``uid``: an HMAC-SHA256 of
    its identity under the operator's ``key``, URL-safe base64 (43 characters)."""
    digest = hmac.new(key, f"{namespace}/{name}/{uid}".encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
