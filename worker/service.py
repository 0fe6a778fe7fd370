"""The gRPC face of the engine: one ``Worker`` endpoint per rank that leads a worker.

Every rank of the pool gets an endpoint (its own port), because any rank may
become the first rank of a worker after a regroup (a CP1 worker is a single
rank). An endpoint serves the worker its rank leads in the current epoch;
otherwise it answers FAILED_PRECONDITION and its gRPC health is NOT_SERVING,
which is how the router and the operator see workers appear and disappear
across epochs. The ranks behind an endpoint are coordinated by the engine
(:mod:`vertumnus.worker.engine`), not by the endpoint.

Error mapping: :class:`~vertumnus.worker.engine.InvalidRequest` and bad
groupings -> INVALID_ARGUMENT; :class:`~vertumnus.worker.engine.NotReady` ->
FAILED_PRECONDITION; a failure inside a rank -> INTERNAL. None of them stops
the engine.
"""

from __future__ import annotations

import queue
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from vertumnus.worker._proto import worker_pb2, worker_pb2_grpc
from vertumnus.worker.engine import Engine, InvalidRequest, NotReady
from vertumnus.worker.pool import RankError

SERVICE_NAME = "vertumnus.worker.v1.Worker"


def _guard(context: grpc.ServicerContext, fn):
    """Run ``fn`` and turn engine errors into gRPC statuses."""
    try:
        return fn()
    except InvalidRequest as exc:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
    except NotReady as exc:
        context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
    except ValueError as exc:  # e.g. a grouping the lattice cannot form
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
    except RankError as exc:
        context.abort(grpc.StatusCode.INTERNAL, str(exc).splitlines()[0])


class WorkerServicer(worker_pb2_grpc.WorkerServicer):
    def __init__(self, engine: Engine, rank: int, pool_server: PoolServer) -> None:
        self.engine, self.rank, self.pool_server = engine, rank, pool_server

    def Prefill(self, request, context):
        def run():
            out = self.engine.prefill(self.rank, request.request_id, list(request.token_ids))
            return worker_pb2.PrefillResponse(
                request_id=out.request_id,
                first_token_id=out.first_token,
                queue_seconds=out.queue_seconds,
                execution_seconds=out.execution_seconds,
                cached_tokens=out.cached_tokens,
                degree=out.degree,
                epoch=out.epoch,
            )

        return _guard(context, run)

    def StreamCacheEvents(self, request, context):
        _guard(context, lambda: self.engine.worker(self.rank))
        events = self.engine.subscribe()
        try:
            while context.is_active():
                try:
                    e = events.get(timeout=0.2)
                except queue.Empty:
                    continue
                if e.worker != self.rank:
                    continue
                kind = worker_pb2.CacheEvent.STORED if e.kind == "stored" else worker_pb2.CacheEvent.REMOVED
                yield worker_pb2.CacheEvent(
                    kind=kind,
                    block_keys=list(e.block_keys),
                    positions=list(e.positions),
                    rank=e.rank,
                    worker=e.worker,
                    epoch=e.epoch,
                )
        finally:
            self.engine.unsubscribe(events)

    def CopyBlocks(self, request, context):
        def run():
            rep = self.engine.copy_blocks(request.source_worker, self.rank, list(request.block_keys))
            return worker_pb2.CopyBlocksResponse(
                copied_blocks=rep.copied_blocks, skipped_blocks=rep.skipped_blocks,
                bytes=rep.bytes, seconds=rep.seconds,
            )

        return _guard(context, run)

    def EvictBlocks(self, request, context):
        removed = _guard(context, lambda: self.engine.evict_blocks(self.rank, list(request.block_keys)))
        return worker_pb2.EvictBlocksResponse(removed_blocks=removed)

    def ListBlocks(self, request, context):
        held, served = _guard(context, lambda: self.engine.list_blocks(self.rank))
        return worker_pb2.ListBlocksResponse(
            epoch=self.engine.epoch,
            ranks=[
                worker_pb2.RankBlocks(rank=r, block_keys=[k for k, _ in b], positions=[p for _, p in b])
                for r, b in sorted(held.items())
            ],
            served_keys=served,
        )

    def Drain(self, request, context):
        if request.resume:
            _guard(context, lambda: self.engine.resume(self.rank))
        else:
            _guard(context, lambda: self.engine.drain(self.rank))
        self.pool_server.refresh_health()
        return worker_pb2.DrainResponse()

    def Epoch(self, request, context):
        seconds = _guard(context, lambda: self.engine.switch_epoch(request.epoch, list(request.degrees)))
        self.pool_server.refresh_health()
        return worker_pb2.EpochResponse(epoch=self.engine.epoch, switch_seconds=seconds)

    def Describe(self, request, context):
        w = _guard(context, lambda: self.engine.worker(self.rank))
        return worker_pb2.DescribeResponse(
            worker=w.slot.first, degree=w.slot.degree, epoch=self.engine.epoch, draining=w.draining,
            block_size=self.engine.block_size, max_tokens=self.engine.max_tokens,
        )


class PoolServer:
    """gRPC servers for every rank of an engine's pool, on loopback or ``host``."""

    def __init__(self, engine: Engine, host: str = "127.0.0.1", base_port: int = 0, threads: int = 16) -> None:
        self.engine = engine
        self.ports: list[int] = []
        self._servers: list[grpc.Server] = []
        self._health: list[health.HealthServicer] = []
        for rank in range(engine.world):
            server = grpc.server(futures.ThreadPoolExecutor(max_workers=threads))
            worker_pb2_grpc.add_WorkerServicer_to_server(WorkerServicer(engine, rank, self), server)
            health_servicer = health.HealthServicer()
            health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
            port = server.add_insecure_port(f"{host}:{base_port + rank if base_port else 0}")
            if port == 0:
                raise OSError(f"could not bind {host}:{base_port + rank}")
            self.ports.append(port)
            self._servers.append(server)
            self._health.append(health_servicer)
        self.refresh_health()
        for server in self._servers:
            server.start()

    def refresh_health(self) -> None:
        """SERVING where the rank leads a worker that admits requests."""
        for rank, hs in enumerate(self._health):
            w = self.engine.workers.get(rank)
            ok = w is not None and not w.draining
            status = health_pb2.HealthCheckResponse.SERVING if ok else health_pb2.HealthCheckResponse.NOT_SERVING
            hs.set(SERVICE_NAME, status)
            hs.set("", status)

    def address(self, rank: int) -> str:
        return f"127.0.0.1:{self.ports[rank]}"

    def stop(self, grace_s: float = 1.0) -> None:
        for server in self._servers:
            server.stop(grace_s)
