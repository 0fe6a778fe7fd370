"""``vertumnus worker --engine sglang`` without ``--print-command``: run the adapter.

Binds the ``Worker`` endpoints first (rank r on ``--grpc-base-port + r``, the same
:class:`~vertumnus.worker.service.PoolServer` as ``vertumnus serve``: a taken port
fails at once, before any server loads a model), starts the grouping's SGLang
servers (:class:`~.adapter.SglangEngine`) and waits until every one is healthy, then
serves until SIGINT or SIGTERM: it drains the workers, stops the endpoints, and stops
the servers (SIGTERM, then SIGKILL). A second signal exits at once. Exit 0 after a
clean stop, 1 when the servers did not start (the message names each and why), 2 for
bad arguments.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import TYPE_CHECKING, cast

from vertumnus.core.lattice import Slot

from ..errors import NotReady
from ..service import PoolServer
from .adapter import AdapterSettings, SglangEngine
from .command import SglangOptions

if TYPE_CHECKING:
    from ..engine import Engine

__all__ = ["run_adapter", "serve_engine"]


def serve_engine(engine: SglangEngine, server: PoolServer) -> PoolServer:
    """Serve ``engine`` on the bound endpoints; a worker whose server fails turns
    NOT_SERVING in gRPC health at once."""
    engine.on_change = server.refresh_health
    # PoolServer and its servicer use only the engine surface SglangEngine implements
    # (worker_at, worker_of, prefill, drain, resume, switch_epoch, list_blocks,
    # flush_cache, copy_blocks, evict_blocks, epoch, incarnation, sizes): duck-typed.
    return server.start(cast("Engine", engine))


def run_adapter(
    world: int,
    slots: list[Slot],
    options: SglangOptions,
    settings: AdapterSettings,
    *,
    host: str,
    grpc_base_port: int,
) -> int:
    try:
        server = PoolServer(world, host=host, base_port=grpc_base_port)
    except (OSError, ValueError) as exc:
        print(f"vertumnus: error: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

    def on_signal(signum: int, frame: object) -> None:
        if stop.is_set():  # a second signal: stop now (the servers' group dies with us)
            print("vertumnus: stopping now, without draining", file=sys.stderr)
            os._exit(130)
        stop.set()

    for sig in previous:
        signal.signal(sig, on_signal)
    try:
        try:
            engine = SglangEngine(world, slots, options, settings)
        except (NotReady, ValueError) as exc:
            server.stop(0)
            print(f"vertumnus: error: {exc}", file=sys.stderr)
            return 1
        with engine:
            if not stop.is_set():
                serve_engine(engine, server)
                for w in (engine.worker(s.worker) for s in engine.grouping()):
                    print(
                        f"{w.describe()} at {server.endpoint(w.slot.offset)} "
                        f"(SGLang pid {w.server.pid}, HTTP port {w.command.ports['http']})",
                        file=sys.stderr,
                    )
                print(
                    f"serving {world} GPUs, epoch {engine.epoch}; Ctrl-C or SIGTERM stops "
                    "(workers are drained first)",
                    file=sys.stderr,
                    flush=True,
                )
                while not stop.wait(1.0):
                    pass
            print("vertumnus: stopping: draining workers", file=sys.stderr)
            for s in engine.grouping():
                try:
                    engine.drain(s.worker)
                except NotReady as exc:
                    print(f"vertumnus: {exc}", file=sys.stderr)
            server.refresh_health()
            server.stop(5.0)
        print("vertumnus: stopped", file=sys.stderr)
        return 0
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
