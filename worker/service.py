"""The gRPC face of the engine: one ``Worker`` endpoint per rank.

Every rank of the pool gets an endpoint (its own port), because any rank may
become the first rank of a worker after a regroup (a CP1 worker is a single
rank). Rank r's endpoint serves the worker whose first rank (``offset``) is
r in the current epoch, whatever its pool-level id; the endpoints of the
other ranks answer FAILED_PRECONDITION naming the worker they belong to and
the endpoint that serves it, and report NOT_SERVING in gRPC health — which
is how the router and the operator see workers appear and disappear across
epochs. ``Epoch`` is pool-wide and accepted on every endpoint. The ranks
behind an endpoint are coordinated by the engine
(:mod:`vertumnus.worker.engine`), not by the endpoint.

Besides each rank's ``Worker`` health, every endpoint answers the health of the
**pod** (:data:`POD_SERVICE`): SERVING from the moment the engine serves until it
stops, whatever its workers do. It is what the kubelet probes (a gRPC probe): a
worker that drains, regroups or fails (an SGLang server that exited) is the
router's and the operator's business, per worker, and must not take the whole
domain pod out of its Service or have it counted as a lost domain.

Servers are bound before the engine starts (:class:`PoolServer`, then
:meth:`PoolServer.start`), so a port that is taken fails in a second, not
after the model loaded; gRPC's port sharing (``SO_REUSEPORT``) is off, so a
second engine on the same ports fails instead of both receiving requests.

Error mapping: :class:`~vertumnus.worker.errors.InvalidRequest` and bad
groupings -> INVALID_ARGUMENT; :class:`~vertumnus.worker.errors.NotReady` ->
FAILED_PRECONDITION; a failure inside a rank -> INTERNAL. None of them stops
the engine. The generated stubs live in :mod:`vertumnus._proto` (built from
``proto/`` at install time).
"""

from __future__ import annotations

import queue
import socket
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from vertumnus._proto import worker_pb2, worker_pb2_grpc
from vertumnus.core.lattice import Slot

from .errors import InvalidRequest, NotReady
from .events import WorkerEvent, WorkerGone
from .lattice import ENGINE_DOMAIN
from .pool import RankError

if TYPE_CHECKING:  # the engine imports torch; binding the ports (PoolServer) does not need it
    from .dispatch import WorkerRunner
    from .engine import Engine

SERVICE_NAME = "vertumnus.worker.v1.Worker"
POD_SERVICE = "vertumnus.worker.v1.Pod"
"""The gRPC health service of the engine as a whole (the domain pod's readiness)."""
MAX_PORT = 65535

_KINDS = {
    "stored": worker_pb2.CacheEvent.STORED,
    "removed": worker_pb2.CacheEvent.REMOVED,
    "cleared": worker_pb2.CacheEvent.CLEARED,
    "resync": worker_pb2.CacheEvent.RESYNC,
}

T = TypeVar("T")


def _abort(context: grpc.ServicerContext, code: grpc.StatusCode, message: str) -> NoReturn:
    context.abort(code, message)
    raise AssertionError("unreachable: context.abort raises")


def _guard(context: grpc.ServicerContext, fn: Callable[[], T]) -> T:
    """Run ``fn`` and turn engine errors into gRPC statuses."""
    try:
        return fn()
    except InvalidRequest as exc:
        _abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc))
    except NotReady as exc:
        _abort(context, grpc.StatusCode.FAILED_PRECONDITION, str(exc))
    except ValueError as exc:  # e.g. a grouping the lattice cannot form
        _abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc))
    except RankError as exc:
        _abort(context, grpc.StatusCode.INTERNAL, str(exc).splitlines()[0])


def event_message(e: WorkerEvent) -> worker_pb2.CacheEvent:
    return worker_pb2.CacheEvent(
        kind=_KINDS[e.kind],
        block_keys=list(e.block_keys),
        positions=list(e.positions),
        parent_keys=[p or 0 for p in e.parents],
        rank=e.rank,
        worker=e.worker,
        epoch=e.epoch,
        sequence=e.sequence,
        incarnation=e.incarnation,
    )


class WorkerServicer(worker_pb2_grpc.WorkerServicer):
    """The endpoint of one rank; serves the worker that rank leads."""

    def __init__(self, server: PoolServer, rank: int) -> None:
        self.server, self.rank = server, rank

    @property
    def engine(self) -> Engine:
        engine = self.server.engine
        assert engine is not None, "PoolServer.start(engine) runs before any server accepts calls"
        return engine

    def _lead(self, context: grpc.ServicerContext) -> WorkerRunner:
        """The worker this endpoint serves, or FAILED_PRECONDITION saying where to go."""
        w = self.engine.worker_at(self.rank)
        if w is None:
            _abort(context, grpc.StatusCode.FAILED_PRECONDITION, self.server.redirect(self.rank))
        return w

    def Prefill(
        self, request: worker_pb2.PrefillRequest, context: grpc.ServicerContext
    ) -> worker_pb2.PrefillResponse:
        w = self._lead(context)
        out = _guard(
            context,
            lambda: self.engine.prefill(w.slot.worker, request.request_id, list(request.token_ids)),
        )
        return worker_pb2.PrefillResponse(
            request_id=out.request_id,
            first_token_id=out.first_token,
            queue_seconds=out.queue_seconds,
            execution_seconds=out.execution_seconds,
            cached_tokens=out.cached_tokens,
            degree=out.degree,
            epoch=out.epoch,
        )

    def StreamCacheEvents(
        self, request: worker_pb2.StreamCacheEventsRequest, context: grpc.ServicerContext
    ) -> Iterator[worker_pb2.CacheEvent]:
        w = self._lead(context)
        stream = w.events.subscribe(
            request.from_sequence,
            incarnation=request.incarnation,
            epoch=request.epoch,
            current_epoch=self.engine.epoch,
        )
        with stream:
            while context.is_active():
                try:
                    e = stream.get(timeout=0.2)
                except queue.Empty:
                    continue
                except WorkerGone as exc:
                    _abort(context, grpc.StatusCode.FAILED_PRECONDITION, str(exc))
                yield event_message(e)

    def CopyBlocks(
        self, request: worker_pb2.CopyBlocksRequest, context: grpc.ServicerContext
    ) -> worker_pb2.CopyBlocksResponse:
        w = self._lead(context)
        rep = _guard(
            context,
            lambda: self.engine.copy_blocks(
                request.source_worker, w.slot.worker, list(request.block_keys)
            ),
        )
        return worker_pb2.CopyBlocksResponse(
            copied_blocks=rep.copied_blocks,
            skipped_blocks=rep.skipped_blocks,
            bytes=rep.bytes,
            seconds=rep.seconds,
        )

    def EvictBlocks(
        self, request: worker_pb2.EvictBlocksRequest, context: grpc.ServicerContext
    ) -> worker_pb2.EvictBlocksResponse:
        w = self._lead(context)
        removed = _guard(
            context, lambda: self.engine.evict_blocks(w.slot.worker, list(request.block_keys))
        )
        return worker_pb2.EvictBlocksResponse(removed_blocks=removed)

    def FlushCache(
        self, request: worker_pb2.FlushCacheRequest, context: grpc.ServicerContext
    ) -> worker_pb2.FlushCacheResponse:
        w = self._lead(context)
        removed = _guard(context, lambda: self.engine.flush_cache(w.slot.worker))
        return worker_pb2.FlushCacheResponse(removed_blocks=removed)

    def ListBlocks(
        self, request: worker_pb2.ListBlocksRequest, context: grpc.ServicerContext
    ) -> worker_pb2.ListBlocksResponse:
        w = self._lead(context)
        listing = _guard(context, lambda: self.engine.list_blocks(w.slot.worker))
        return worker_pb2.ListBlocksResponse(
            epoch=listing.epoch,
            ranks=[
                worker_pb2.RankBlocks(
                    rank=r,
                    block_keys=[b.key for b in blocks],
                    positions=[b.position for b in blocks],
                    parent_keys=[b.parent or 0 for b in blocks],
                )
                for r, blocks in listing.held.items()
            ],
            served=[
                worker_pb2.ServedBlock(key=b.key, position=b.position, parent=b.parent or 0)
                for b in listing.served
            ],
            sequence=listing.sequence,
            incarnation=listing.incarnation,
            worker=listing.worker,
        )

    def Drain(
        self, request: worker_pb2.DrainRequest, context: grpc.ServicerContext
    ) -> worker_pb2.DrainResponse:
        w = self._lead(context)
        if request.resume:
            _guard(context, lambda: self.engine.resume(w.slot.worker))
        else:
            _guard(context, lambda: self.engine.drain(w.slot.worker))
        self.server.refresh_health()
        return worker_pb2.DrainResponse()

    def Epoch(
        self, request: worker_pb2.EpochRequest, context: grpc.ServicerContext
    ) -> worker_pb2.EpochResponse:
        slots = [Slot(s.worker, s.degree, ENGINE_DOMAIN, s.offset) for s in request.grouping]
        if not slots:
            _abort(
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                "grouping: empty; list every worker of the engine",
            )
        try:
            report = self.engine.switch_epoch(request.epoch, slots)
        except NotReady as exc:
            _abort(context, grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        except ValueError as exc:
            _abort(context, grpc.StatusCode.INVALID_ARGUMENT, f"grouping: {exc}")
        except RankError as exc:
            _abort(context, grpc.StatusCode.INTERNAL, str(exc).splitlines()[0])
        self.server.refresh_health()
        return worker_pb2.EpochResponse(
            epoch=report.epoch, switch_seconds=report.seconds, unchanged=report.unchanged
        )

    def Describe(
        self, request: worker_pb2.DescribeRequest, context: grpc.ServicerContext
    ) -> worker_pb2.DescribeResponse:
        w = self._lead(context)
        engine = self.engine
        return worker_pb2.DescribeResponse(
            worker=w.slot.worker,
            degree=w.slot.degree,
            offset=w.slot.offset,
            epoch=engine.epoch,
            incarnation=engine.incarnation,
            draining=w.draining,
            block_size=engine.block_size,
            max_tokens=engine.max_tokens,
            vocab_size=engine.vocab_size,
            world=engine.world,
            cache_blocks=engine.cache_blocks_per_rank * w.slot.degree,
            failure=w.failure or "",
        )


def _check_free(host: str, port: int) -> None:
    """Raise OSError (with the system's reason) if ``host:port`` cannot be listened on."""
    infos = socket.getaddrinfo(
        host.strip("[]") or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(
            socket.SOL_SOCKET, socket.SO_REUSEADDR, 1
        )  # as gRPC does: TIME_WAIT is no conflict
        s.bind(address)


class PoolServer:
    """gRPC servers for every rank of a pool, on ``host``; rank r on ``base_port + r``.

    ``base_port=0`` picks free ports (tests). Construction binds every port
    (raising OSError naming the rank and port that failed, ValueError for
    ports outside 1..65535) and serves nothing until :meth:`start`.
    """

    def __init__(
        self, world: int, *, host: str = "127.0.0.1", base_port: int = 0, threads: int = 16
    ) -> None:
        if base_port and not (base_port >= 1 and base_port + world - 1 <= MAX_PORT):
            raise ValueError(
                f"ports {base_port}..{base_port + world - 1} for {world} ranks: a port is 1..{MAX_PORT}"
            )
        self.host = host
        self.engine: Engine | None = None
        self.ports: list[int] = []
        self._servers: list[grpc.Server] = []
        self._health: list[Any] = []
        try:
            for rank in range(world):
                self._bind(rank, base_port + rank if base_port else 0, threads)
        except BaseException:
            self.stop(0)
            raise

    def _bind(self, rank: int, port: int, threads: int) -> None:
        where = f"{self.host}:{port}"
        if port:
            try:
                _check_free(self.host, port)
            except OSError as exc:
                raise OSError(
                    f"cannot listen on {where} for rank {rank}: {exc.strerror or exc}"
                ) from None
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=threads, thread_name_prefix=f"rank{rank}-rpc"),
            options=[("grpc.so_reuseport", 0)],
        )
        worker_pb2_grpc.add_WorkerServicer_to_server(WorkerServicer(self, rank), server)
        health_servicer = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        try:
            bound = server.add_insecure_port(where)
        except RuntimeError:
            bound = 0
        if not bound:
            server.stop(0)
            raise OSError(
                f"cannot listen on {where} for rank {rank} (in use, or not an address of this host)"
            )
        for name in (SERVICE_NAME, "", POD_SERVICE):
            health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        self.ports.append(bound)
        self._servers.append(server)
        self._health.append(health_servicer)

    def start(self, engine: Engine) -> PoolServer:
        """Serve ``engine`` (its world must match) on the bound ports."""
        if engine.world != len(self._servers):
            raise ValueError(
                f"an engine of {engine.world} ranks on servers for {len(self._servers)}"
            )
        self.engine = engine
        self.refresh_health()
        for hs in self._health:
            hs.set(POD_SERVICE, health_pb2.HealthCheckResponse.SERVING)
        for server in self._servers:
            server.start()
        return self

    def refresh_health(self) -> None:
        """SERVING where the rank leads a worker that admits requests."""
        if self.engine is None:
            return
        for rank, hs in enumerate(self._health):
            w = self.engine.worker_at(rank)
            ok = w is not None and not w.draining
            status = (
                health_pb2.HealthCheckResponse.SERVING
                if ok
                else health_pb2.HealthCheckResponse.NOT_SERVING
            )
            hs.set(SERVICE_NAME, status)
            hs.set("", status)

    def address(self, rank: int) -> str:
        """Where a client on this machine reaches rank ``rank``'s endpoint."""
        return f"127.0.0.1:{self.ports[rank]}"

    def endpoint(self, rank: int) -> str:
        """Rank ``rank``'s endpoint as bound (``host:port``)."""
        return f"{self.host}:{self.ports[rank]}"

    def redirect(self, rank: int) -> str:
        """Why rank ``rank``'s endpoint serves nothing, and which endpoint to use."""
        assert self.engine is not None
        w = self.engine.worker_of(rank)
        s = w.slot
        return (
            f"rank {rank} is not the first rank of a worker in epoch {self.engine.epoch}: it is rank "
            f"{rank - s.offset} of {w.describe()}; send worker {s.worker}'s calls to the endpoint of "
            f"rank {s.offset}, {self.endpoint(s.offset)}"
        )

    def stop(self, grace_s: float | None = 1.0) -> None:
        for hs in self._health:
            hs.set(POD_SERVICE, health_pb2.HealthCheckResponse.NOT_SERVING)
        events = [server.stop(grace_s) for server in self._servers]
        for e in events:
            e.wait()
