"""Running a router process: the gRPC server, ``/metrics``, signals, a clean shutdown.

``serve`` is what ``vertumnus router`` and ``vertumnus up`` run. It binds the
public port exclusively (gRPC's port reuse off: a second router on a port in
use fails instead of sharing it), answers health NOT_SERVING until the router
has discovered its workers, and on SIGINT or SIGTERM stops accepting, lets
requests in flight finish (up to ``grace_s``), and exits without a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import grpc
from prometheus_client import start_http_server

from vertumnus.core.store import TrieStore
from vertumnus.router.router import Router
from vertumnus.router.service import NOT_SERVING, SERVING, add_services
from vertumnus.router.settings import RouterSettings

__all__ = ["RunningRouter", "serve", "start_router"]

_log = logging.getLogger("vertumnus.router")


class RunningRouter:
    """A started router and its servers (for tests and for ``vertumnus up``)."""

    def __init__(
        self, router: Router, server: grpc.aio.Server, port: int, metrics_port: int | None
    ) -> None:
        self.router = router
        self.server = server
        self.port = port
        self.metrics_port = metrics_port
        self._metrics_server: Any = None

    @property
    def address(self) -> str:
        host = self.router.settings.listen.rpartition(":")[0]
        return f"{host}:{self.port}"

    async def stop(self, grace_s: float = 5.0) -> None:
        deadline = asyncio.get_running_loop().time() + grace_s
        while self.router.in_flight() and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        await self.server.stop(grace=1.0)
        await self.router.close()
        if self._metrics_server is not None:
            self._metrics_server.shutdown()


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
    router = Router(settings, engines, store=store, router_id=router_id)
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    health = add_services(server, router)
    try:
        port = server.add_insecure_port(settings.listen)
    except RuntimeError as e:
        raise OSError(
            f"cannot listen on {settings.listen}: {e} (is another router running there?)"
        ) from None
    if port == 0:
        raise OSError(f"cannot listen on {settings.listen} (is another router running there?)")
    await health.set("", NOT_SERVING)
    await server.start()
    try:
        await router.start(discover_timeout_s=discover_timeout_s)
        if on_store is not None:
            await on_store(router)
    except BaseException:
        await server.stop(grace=None)
        await router.close()
        raise
    running = RunningRouter(router, server, port, None)
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
    for name in ("", "vertumnus.v1.Prefill", "vertumnus.v1.Admin"):
        await health.set(name, SERVING)
    return running


async def serve(settings: RouterSettings, engines: Sequence[str], **kw) -> int:  # type: ignore[no-untyped-def]
    """Run a router until SIGINT or SIGTERM; returns the exit code."""
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
    print(
        f"vertumnus router {running.router.router_id}: serving {running.router.composition()} on "
        f"{running.address} ({metrics}); Ctrl-C to stop",
        flush=True,
    )
    await stop.wait()
    _log.info("stopping: letting %d requests in flight finish", running.router.in_flight())
    await running.stop()
    return 0
