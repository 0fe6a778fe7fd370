"""Connections to the Redis server that holds the router's shared state, and what its errors mean.

The router reaches Redis by a URL, ``redis://host:port/db`` (``rediss://``
for TLS). Credentials never travel in the URL or on a command line, where
they end up in shell history, ``ps`` listings and logs:

- the **password** comes from a file (``password_file=``, or the file named
  by ``VERTUMNUS_REDIS_PASSWORD_FILE``: a mounted Kubernetes Secret) or from
  an environment variable (``VERTUMNUS_REDIS_PASSWORD``, or the variable a
  deployment names with ``password_env=``, e.g. the operator's
  ``REDIS_PASSWORD``); a URL that embeds one is refused, with a message that
  says where to put it instead;
- an **ACL user** comes from the URL (``redis://alice@host``, a user name is
  not a secret) or ``VERTUMNUS_REDIS_USERNAME``; without one, the password is
  the default user's (``requirepass``).

Clients get short socket timeouts and retry a failed command once, at once:
that second try is what reconnects a pooled socket that a Redis restart left
dead, and a server that stays down costs one connect timeout, not redis-py's
default of ten retries with backoff. Timeouts are not retried (the command
may have run).

:func:`translate` turns redis-py's errors into errors that say which server
failed and during what: :class:`RedisUnavailableError` (a
:class:`ConnectionError`: the router falls back to its local view and
re-synchronises later) and :class:`RedisCredentialsError`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import redis
from redis.backoff import NoBackoff
from redis.exceptions import (
    AuthenticationError,
    AuthorizationError,
    NoPermissionError,
    RedisError,
    ResponseError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

__all__ = [
    "ENV_PASSWORD",
    "ENV_PASSWORD_FILE",
    "ENV_USERNAME",
    "RedisAddress",
    "RedisConfigError",
    "RedisCredentialsError",
    "RedisUnavailableError",
    "address_of",
    "parse_redis_url",
    "redis_client",
    "translate",
]

ENV_PASSWORD = "VERTUMNUS_REDIS_PASSWORD"
ENV_PASSWORD_FILE = "VERTUMNUS_REDIS_PASSWORD_FILE"
ENV_USERNAME = "VERTUMNUS_REDIS_USERNAME"

_WHERE = (
    f"put the password in a file and name it with {ENV_PASSWORD_FILE} (or the password_file "
    f"option), or set the environment variable {ENV_PASSWORD}"
)


class RedisConfigError(ValueError):
    """The Redis URL or the credentials' configuration is wrong (nothing was dialled)."""


class RedisUnavailableError(ConnectionError):
    """The Redis server did not answer (down, unreachable, or too slow)."""


class RedisCredentialsError(PermissionError):
    """The Redis server refused the credentials, or the ACL user may not do this."""


@dataclass(frozen=True, slots=True)
class RedisAddress:
    """Where a Redis server is, without any secret (safe to log)."""

    host: str
    port: int = 6379
    db: int = 0
    tls: bool = False
    username: str | None = None

    def __str__(self) -> str:
        user = f"{self.username}@" if self.username else ""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'rediss' if self.tls else 'redis'}://{user}{host}:{self.port}/{self.db}"


def _redacted(url: str) -> str:
    """``url`` with its password (if any) replaced by ``***``."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    return parts._replace(netloc=f"{user}:***@{host}").geturl()


def parse_redis_url(url: str) -> RedisAddress:
    """The address in ``redis://[user@]host[:port][/db]`` (or ``rediss://``).

    Raises :class:`RedisConfigError` for another scheme, a missing host, a bad
    port or database, query options, and — naming where it belongs — an
    embedded password.
    """
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise RedisConfigError(f"bad Redis URL {_redacted(url)!r}: {exc}") from None
    if parts.password is not None:
        raise RedisConfigError(
            f"the Redis URL {_redacted(url)!r} embeds a password: remove it from the URL and "
            f"{_WHERE} (a password in a URL or on a command line ends up in shell history, "
            "process listings and logs)"
        )
    if parts.scheme not in ("redis", "rediss"):
        raise RedisConfigError(
            f"bad Redis URL {url!r}: the scheme must be redis:// or rediss:// (TLS), "
            f"not {parts.scheme or 'missing'!r}"
        )
    if not parts.hostname:
        raise RedisConfigError(f"bad Redis URL {url!r}: no host (expected redis://host:port/db)")
    if parts.query or parts.fragment:
        raise RedisConfigError(
            f"bad Redis URL {url!r}: query options are not read here; pass them to redis_client()"
        )
    path = parts.path.strip("/")
    if path and not path.isdigit():
        raise RedisConfigError(
            f"bad Redis URL {url!r}: the path must be a database number, not {path!r}"
        )
    return RedisAddress(
        host=parts.hostname,
        port=6379 if port is None else port,
        db=int(path) if path else 0,
        tls=parts.scheme == "rediss",
        username=unquote(parts.username) if parts.username else None,
    )


def _password(
    password_file: str | os.PathLike[str] | None,
    password_env: str | None,
    environ: Mapping[str, str],
) -> str | None:
    """The password from the one place configured (None: no password)."""
    file_source = None
    if password_file is not None:
        file_source = (Path(password_file), "the password_file option")
    elif environ.get(ENV_PASSWORD_FILE):
        file_source = (Path(environ[ENV_PASSWORD_FILE]), ENV_PASSWORD_FILE)
    env_names = [n for n in dict.fromkeys((password_env, ENV_PASSWORD)) if n and environ.get(n)]
    if file_source is not None and env_names:
        raise RedisConfigError(
            f"the Redis password is given twice ({file_source[1]} and ${env_names[0]}): keep one"
        )
    if file_source is not None:
        path, named_by = file_source
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise RedisConfigError(
                f"cannot read the Redis password file {str(path)!r} (named by {named_by}): "
                f"{exc.strerror or exc}"
            ) from None
        # One trailing newline is the file's, not the password's (echo > file).
        secret = text[:-1] if text.endswith("\n") else text
        secret = secret[:-1] if secret.endswith("\r") else secret
        if not secret:
            raise RedisConfigError(
                f"the Redis password file {str(path)!r} (named by {named_by}) is empty"
            )
        return secret
    return environ[env_names[0]] if env_names else None


def redis_client(
    url: str,
    *,
    password_file: str | os.PathLike[str] | None = None,
    password_env: str | None = None,
    environ: Mapping[str, str] | None = None,
    socket_timeout: float = 2.0,
    connect_timeout: float = 0.5,
    ssl_ca_certs: str | None = None,
    client_name: str | None = "vertumnus",
    **options: Any,
) -> redis.Redis:
    """A client for ``url`` with credentials from a file or the environment.

    ``password_file``: a file holding the password (a trailing newline is
    dropped); else ``$VERTUMNUS_REDIS_PASSWORD_FILE``; else the variable
    ``password_env`` (when given) or ``$VERTUMNUS_REDIS_PASSWORD``. Giving it
    in two places is refused. The ACL user is the URL's or
    ``$VERTUMNUS_REDIS_USERNAME``. ``environ`` replaces ``os.environ`` (tests).
    Nothing is dialled here: the first command connects.
    """
    env = os.environ if environ is None else environ
    address = parse_redis_url(url)
    username = address.username or env.get(ENV_USERNAME) or None
    password = _password(password_file, password_env, env)
    if username and password is None:
        raise RedisConfigError(
            f"Redis user {username!r} is configured without a password: {_WHERE}"
        )
    if address.tls:
        options.setdefault("ssl", True)
        if ssl_ca_certs is not None:
            options.setdefault("ssl_ca_certs", ssl_ca_certs)
    return redis.Redis(
        host=address.host,
        port=address.port,
        db=address.db,
        username=username,
        password=password,
        socket_timeout=socket_timeout,
        socket_connect_timeout=connect_timeout,
        retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
        client_name=client_name,
        **options,
    )


def address_of(client: Any) -> str:
    """Where ``client`` dials, for error messages (never a secret)."""
    try:
        kw = client.connection_pool.connection_kwargs
    except AttributeError:
        return repr(client)
    if kw.get("path"):
        return f"unix://{kw['path']}?db={kw.get('db', 0)}"
    tls = "SSL" in getattr(
        getattr(client.connection_pool, "connection_class", None), "__name__", ""
    )
    return str(
        RedisAddress(
            host=str(kw.get("host", "localhost")),
            port=int(kw.get("port", 6379)),
            db=int(kw.get("db", 0)),
            tls=tls,
            username=kw.get("username"),
        )
    )


_CREDENTIAL_CODES = ("NOAUTH", "WRONGPASS", "NOPERM")


def translate(exc: RedisError, client: Any, during: str) -> Exception:
    """The error to raise for ``exc`` (redis-py's) that happened to ``client``
    during ``during`` ("matched_blocks in namespace 'pool-a'"): ``exc`` itself
    when it is none of the connection or credential kinds."""
    where = address_of(client)
    cause = str(exc).rstrip(".") or type(exc).__name__
    if isinstance(exc, AuthenticationError | AuthorizationError | NoPermissionError) or (
        isinstance(exc, ResponseError) and str(exc).startswith(_CREDENTIAL_CODES)
    ):
        kw = getattr(getattr(client, "connection_pool", None), "connection_kwargs", {})
        who = f"user {kw['username']!r}" if kw.get("username") else "the default user"
        if not kw.get("password"):
            who += ", no password configured"
        return RedisCredentialsError(
            f"Redis at {where} refused {during} ({who}): {cause}. Check the user (URL or "
            f"{ENV_USERNAME}), the password ({ENV_PASSWORD_FILE} or {ENV_PASSWORD}) and the "
            "user's ACL (it needs the ~vt:* keys and EVALSHA/SCRIPT LOAD)"
        )
    if isinstance(exc, RedisConnectionError | RedisTimeoutError):
        return RedisUnavailableError(f"Redis at {where} is unavailable ({during}): {cause}")
    return exc
