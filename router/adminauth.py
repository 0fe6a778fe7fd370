"""The Admin API's guard: the token every Admin call must carry.

Admin (``vertumnus.v1.Admin``) can drain every worker of a pool or regroup its
engines, so a router with ``admin_token_file`` answers an Admin call only when it
carries the pool's token, as gRPC metadata ``authorization: Bearer <token>``;
anything else gets ``UNAUTHENTICATED`` and never reaches the router. Prefill,
health and reflection need no token.

The token is the first line of a file: in Kubernetes, the pool's Secret
``<pool>-router-admin`` mounted into the router pod (the operator writes it and
sends the same token). The file is read again whenever it changes, so a rotated
Secret takes effect without a restart: the kubelet replaces a mounted Secret's
file in place. This complements the NetworkPolicy that lets only the operator
reach the admin port: a policy works only where the cluster's network plugin
enforces it, a token everywhere.
"""

from __future__ import annotations

import hmac
import logging
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from vertumnus.admintoken import HEADER, SCHEME, read_token

__all__ = ["ADMIN_PREFIX", "AdminAuth", "TokenFile"]

_log = logging.getLogger("vertumnus.router")

ADMIN_PREFIX = "/vertumnus.v1.Admin/"
"""The full method names of the Admin service start with this."""


class TokenFile:
    """The token in a file, read again when the file changes (a rotated Secret)."""

    def __init__(self, path: str) -> None:
        self.path = path
        # Stamped before the read: a change in between is read again at the next call.
        self._seen = self._stamp()
        self._token = read_token(path)  # a missing or empty file is refused at start

    def _stamp(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def token(self) -> str | None:
        """The current token; None when the file is gone or empty now (every call is
        then refused: failing closed, never open)."""
        stamp = self._stamp()
        if stamp is None:
            return None
        if stamp != self._seen:
            try:
                self._token = read_token(self.path)
            except ValueError as e:
                _log.error("refusing every Admin call: %s", e)
                return None
            self._seen = stamp
        return self._token

    def matches(self, presented: str) -> bool:
        """``presented`` is the current token (compared in constant time)."""
        token = self.token()
        return token is not None and hmac.compare_digest(presented.encode(), token.encode())


LOG_EVERY_S = 60.0
"""At most one warning per this many seconds for refused calls (with their count since the
last): a client retrying in a loop must not flood the log. Each is counted in
``vertumnus_router_admin_refused_total`` all the same."""


class AdminAuth(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Refuses an Admin call without the token, before it reaches the router; each refusal
    is handed to ``refused`` (the method's short name: the router's metric)."""

    def __init__(self, tokens: TokenFile, refused: Callable[[str], None] | None = None) -> None:
        self.tokens = tokens
        self._counted = refused
        self._refuse = grpc.unary_unary_rpc_method_handler(self._unauthenticated)
        self._unlogged = 0
        self._logged_at = -LOG_EVERY_S

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
        details: grpc.HandlerCallDetails,
    ) -> Any:
        if not details.method.startswith(ADMIN_PREFIX) or self._allowed(details):
            return await continuation(details)
        self._refused(details.method)
        return self._refuse

    def _refused(self, method: str) -> None:
        if self._counted is not None:
            self._counted(method[len(ADMIN_PREFIX) :])
        self._unlogged += 1
        now = time.monotonic()
        if now - self._logged_at >= LOG_EVERY_S:
            _log.warning(
                "refused %d Admin call(s) without a valid admin token (the last: %s)",
                self._unlogged,
                method,
            )
            self._unlogged, self._logged_at = 0, now

    def _allowed(self, details: grpc.HandlerCallDetails) -> bool:
        for key, value in details.invocation_metadata or ():
            if key == HEADER and isinstance(value, str) and value.startswith(SCHEME):
                return self.tokens.matches(value[len(SCHEME) :])
        return False

    @staticmethod
    async def _unauthenticated(request: object, context: grpc.aio.ServicerContext) -> None:
        await context.abort(
            grpc.StatusCode.UNAUTHENTICATED,
            "the Admin API needs this pool's admin token (metadata 'authorization: Bearer "
            "<token>'; vertumnus admin --token-file; in Kubernetes the Secret "
            "<pool>-router-admin, key token)",
        )
