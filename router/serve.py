"""Running a router process: the gRPC server, ``/metrics``, signals, a clean shutdown.

``serve`` is what ``vertumnus router`` and ``vertumnus up`` run. It binds the
public port, and the Admin API's when ``admin_listen`` gives it one, exclusively
(gRPC's port reuse off: a second router on a port in use fails instead of
sharing it), answers health NOT_SERVING until the router
has discovered its workers, and on SIGINT or SIGTERM shuts down gracefully
(:meth:`RunningRouter.stop`): health turns NOT_SERVING, the server takes no new
RPC and tells its clients so (HTTP/2 GOAWAY: they reconnect to another replica),
and the requests in flight — queued at the router or running at a worker, which
for a long prompt can take tens of seconds — are answered, up to
``SHUTDOWN_GRACE_S``; then it exits without a traceback. In Kubernetes the
router's pod waits a few seconds before the signal (a ``preStop`` sleep), so that
the Service stops sending it new connections first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import grpc
from grpc_health.v1 import health_pb2_grpc
from prometheus_client import start_http_server

from vertumnus.core.store import TrieStore
from vertumnus.router.adminauth import AdminAuth, TokenFile
from vertumnus.router.certfiles import CertFiles
from vertumnus.router.router import Router
from vertumnus.router.service import NOT_SERVING, SERVING, add_services
from vertumnus.router.settings import RouterSettings

__all__ = ["SHUTDOWN_GRACE_S", "RunningRouter", "guard_files", "serve", "start_router"]

_log = logging.getLogger("vertumnus.router")

SHUTDOWN_GRACE_S = 30.0
"""How long a router shutting down lets the requests in flight finish (``--shutdown-grace``).
The operator's router pods allow it, and their ``preStop`` sleep, before they are killed."""

_SERVICES = ("", "vertumnus.v1.Prefill", "vertumnus.v1.Admin")
"""What the public port's health service reports on (Admin only where it is served there)."""


class RunningRouter:
    """A started router and its servers (for tests and for ``vertumnus up``)."""

    def __init__(
        self,
        router: Router,
        server: grpc.aio.Server,
        port: int,
        metrics_port: int | None,
        health: Any = None,
        admin: tuple[grpc.aio.Server, int] | None = None,
    ) -> None:
        self.router = router
        self.server = server
        self.port = port
        self.metrics_port = metrics_port
        self.health = health
        self.admin_server: grpc.aio.Server | None = None if admin is None else admin[0]
        """The Admin API's own server (``admin_listen``); None: Admin is on ``server``."""
        self.admin_port = port if admin is None else admin[1]
        self.health_server: grpc.aio.Server | None = None
        """The plaintext port with health alone (``health_listen``); None: none."""
        self.health_port: int | None = None
        self._metrics_server: Any = None

    @property
    def address(self) -> str:
        host = self.router.settings.listen.rpartition(":")[0]
        return f"{host}:{self.port}"

    def _health_names(self) -> tuple[str, ...]:
        return _SERVICES if self.admin_server is None else _SERVICES[:2]

    @property
    def admin_address(self) -> str:
        if self.admin_server is None:
            return self.address
        host = self.router.settings.admin_listen.rpartition(":")[0]
        return f"{host}:{self.admin_port}"

    async def stop(self, grace_s: float = SHUTDOWN_GRACE_S) -> None:
        """Take no new request and answer those in flight, up to ``grace_s`` (what is
        left then is cancelled); then close the router."""
        if self.health is not None:
            for name in self._health_names():
                await self.health.set(name, NOT_SERVING)
        # New RPCs are refused from here (GOAWAY); the router goes on placing and
        # answering the ones it holds while the server waits for them.
        await asyncio.gather(
            *(
                s.stop(grace=grace_s)
                for s in (self.server, self.admin_server, self.health_server)
                if s is not None
            )
        )
        await self.router.close()
        if self._metrics_server is not None:
            self._metrics_server.shutdown()


def guard_files(
    settings: RouterSettings,
) -> tuple[TokenFile | None, CertFiles | None, CertFiles | None]:
    """The files the settings name, read: the Admin token, the Admin port's certificate,
    the public port's (None where none is named). Raises ValueError naming a file that
    cannot be used (``vertumnus router`` checks them so before it starts)."""
    s = settings
    return (
        TokenFile(s.admin_token_file) if s.admin_token_file else None,
        CertFiles(s.admin_tls_cert_file, s.admin_tls_key_file, "admin")
        if s.admin_tls_cert_file
        else None,
        CertFiles(s.tls_cert_file, s.tls_key_file, "public") if s.tls_cert_file else None,
    )


async def start_router(
    settings: RouterSettings,
    engines: Sequence[str],
    *,
    store: TrieStore | None = None,
    router_id: str = "router-0",
    discover_timeout_s: float = 60.0,
    on_store: Callable[[Router], Awaitable[None]] | None = None,
) -> RunningRouter:
    """Bind the ports, discover the engines, start serving."""
    # Read before anything starts: a router told to guard Admin never serves it unguarded.
    tokens, certs, public = guard_files(settings)
    router = Router(settings, engines, store=store, router_id=router_id)
    guard = [] if tokens is None else [AdminAuth(tokens, router.metrics.admin_refused)]
    options = [("grpc.so_reuseport", 0)]
    # The guard sits on the server that has Admin; it lets every other service through.
    if settings.admin_listen:
        server = grpc.aio.server(options=options)
        admin: grpc.aio.Server | None = grpc.aio.server(options=options, interceptors=guard)
    else:
        server, admin = grpc.aio.server(options=options, interceptors=guard), None
    health = add_services(server, router, admin)
    port = _bind(server, settings.listen, None if public is None else public.credentials())
    probes: grpc.aio.Server | None = None
    if settings.health_listen:
        # Health alone, in plaintext, for the kubelet's probes (they speak no TLS); the
        # same servicer, so it says what the public port's says.
        probes = grpc.aio.server(options=options)
        health_pb2_grpc.add_HealthServicer_to_server(health, probes)
        health_port = _bind(probes, settings.health_listen)
    admin_port = (
        _bind(admin, settings.admin_listen, None if certs is None else certs.credentials())
        if admin is not None
        else port
    )
    await health.set("", NOT_SERVING)
    servers = [s for s in (server, admin, probes) if s is not None]
    for s in servers:
        await s.start()
    try:
        await router.start(discover_timeout_s=discover_timeout_s)
        if on_store is not None:
            await on_store(router)
    except BaseException:
        for s in servers:
            await s.stop(grace=None)
        await router.close()
        raise
    running = RunningRouter(
        router, server, port, None, health, None if admin is None else (admin, admin_port)
    )
    if probes is not None:
        running.health_server, running.health_port = probes, health_port
    if settings.metrics_listen:
        host, _, mport = settings.metrics_listen.rpartition(":")
        try:
            http, _thread = start_http_server(
                int(mport), addr=host, registry=router.metrics.registry
            )
        except OSError as e:
            await running.stop(0)
            raise OSError(f"cannot serve metrics on {settings.metrics_listen}: {e}") from None
        running._metrics_server = http
        running.metrics_port = http.server_port
    for name in running._health_names():
        await health.set(name, SERVING)
    return running


def _bind(
    server: grpc.aio.Server, listen: str, credentials: grpc.ServerCredentials | None = None
) -> int:
    try:
        if credentials is None:
            port = server.add_insecure_port(listen)
        else:
            port = server.add_secure_port(listen, credentials)
    except RuntimeError as e:
        raise OSError(
            f"cannot listen on {listen}: {e} (is another router running there?)"
        ) from None
    if port == 0:
        raise OSError(f"cannot listen on {listen} (is another router running there?)")
    return port


async def serve(  # type: ignore[no-untyped-def]
    settings: RouterSettings,
    engines: Sequence[str],
    grace_s: float = SHUTDOWN_GRACE_S,
    **kw,
) -> int:
    """Run a router until SIGINT or SIGTERM, then stop within ``grace_s``; returns the
    exit code."""
    running = await start_router(settings, engines, **kw)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    metrics = (
        f"metrics: http://{settings.metrics_listen.rpartition(':')[0]}:{running.metrics_port}/metrics"
        if running.metrics_port
        else "no metrics endpoint"
    )
    admin = f"Admin on {running.admin_address}" if running.admin_server else "Admin there too"
    tls = " over TLS" if settings.tls_cert_file else ""
    probes = (
        f"; health alone on {settings.health_listen.rpartition(':')[0]}:{running.health_port}"
        if running.health_server
        else ""
    )
    print(
        f"vertumnus router {running.router.router_id}: serving {running.router.composition()} on "
        f"{running.address}{tls} ({admin}; {metrics}{probes}); Ctrl-C to stop",
        flush=True,
    )
    await stop.wait()
    _log.info(
        "stopping: taking no new request, letting %d in flight finish (up to %g s)",
        running.router.in_flight(),
        grace_s,
    )
    await running.stop(grace_s)
    return 0
