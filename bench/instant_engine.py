"""An engine that answers at once: the worker protocol with no model behind it.

For measuring the router alone (``bench/router_overhead.py``): every
``Prefill`` returns immediately (first token = the last prompt token), and
the engine publishes the cache events a real one would — STORED for the
request's full blocks, with sequences, parents and an incarnation — so the
router's index, followers and cache manager do their real work. Each rank
has its own endpoint, as ``vertumnus serve`` does; ``Describe``,
``ListBlocks``, ``StreamCacheEvents``, ``Drain`` and ``Epoch`` behave like the
real engine's for a fixed grouping.

    python bench/instant_engine.py --ranks 8 --degrees 4,2,2 --base-port 51000
"""

from __future__ import annotations

import argparse
import asyncio
import random
import signal

import grpc

from vertumnus._proto import worker_pb2, worker_pb2_grpc
from vertumnus.core.keys import token_block_keys


class _Worker:
    def __init__(self, worker: int, degree: int, offset: int) -> None:
        self.worker, self.degree, self.offset = worker, degree, offset
        self.blocks: dict[int, tuple[int, int]] = {}  # key -> (position, parent)
        self.events: list[worker_pb2.CacheEvent] = []
        self.waiters: list[asyncio.Queue[worker_pb2.CacheEvent]] = []


class InstantEngine:
    def __init__(
        self, ranks: int, degrees: list[int], block_size: int = 16, vocab: int = 256
    ) -> None:
        self.ranks, self.block_size, self.vocab = ranks, block_size, vocab
        self.incarnation = random.SystemRandom().getrandbits(63) or 1
        self.epoch = 1
        self.workers: dict[int, _Worker] = {}
        offset = 0
        for d in degrees:
            self.workers[offset] = _Worker(offset, d, offset)
            offset += d
        if offset != ranks:
            raise ValueError(f"degrees {degrees} do not cover {ranks} ranks")

    def publish(
        self, w: _Worker, kind: int, keys: list[int], positions: list[int], parents: list[int]
    ) -> None:
        e = worker_pb2.CacheEvent(
            kind=kind,
            block_keys=keys,
            positions=positions,
            parent_keys=parents,
            worker=w.worker,
            epoch=self.epoch,
            sequence=len(w.events) + 1,
            incarnation=self.incarnation,
        )
        w.events.append(e)
        for q in w.waiters:
            q.put_nowait(e)


class _Servicer(worker_pb2_grpc.WorkerServicer):
    def __init__(self, engine: InstantEngine, rank: int) -> None:
        self.engine, self.rank = engine, rank

    def _worker(self) -> _Worker | None:
        return self.engine.workers.get(self.rank)

    async def _lead(self, context):  # type: ignore[no-untyped-def]
        w = self._worker()
        if w is None:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION, f"rank {self.rank} leads no worker"
            )
        return w

    async def Describe(self, request, context):  # type: ignore[no-untyped-def]
        w = await self._lead(context)
        e = self.engine
        return worker_pb2.DescribeResponse(
            worker=w.worker,
            degree=w.degree,
            offset=w.offset,
            epoch=e.epoch,
            incarnation=e.incarnation,
            block_size=e.block_size,
            max_tokens=65536,
            vocab_size=e.vocab,
            world=e.ranks,
            cache_blocks=1 << 20,
        )

    async def Prefill(self, request, context):  # type: ignore[no-untyped-def]
        w = await self._lead(context)
        tokens = list(request.token_ids)
        keys = list(token_block_keys(tokens, self.engine.block_size))
        cached = 0
        for k in keys:
            if k not in w.blocks:
                break
            cached += 1
        new = keys[cached:]
        if new:
            positions = list(range(cached, len(keys)))
            parents = [keys[p - 1] if p else 0 for p in positions]
            for k, p, par in zip(new, positions, parents, strict=True):
                w.blocks[k] = (p, par)
            self.engine.publish(w, worker_pb2.CacheEvent.STORED, new, positions, parents)
        return worker_pb2.PrefillResponse(
            request_id=request.request_id,
            first_token_id=tokens[-1],
            cached_tokens=min(cached * self.engine.block_size, len(tokens) - 1),
            degree=w.degree,
            epoch=self.engine.epoch,
        )

    async def StreamCacheEvents(self, request, context):  # type: ignore[no-untyped-def]
        w = await self._lead(context)
        q: asyncio.Queue[worker_pb2.CacheEvent] = asyncio.Queue()
        for e in w.events[request.from_sequence :]:
            q.put_nowait(e)
        w.waiters.append(q)
        try:
            while True:
                yield await q.get()
        finally:
            w.waiters.remove(q)

    async def ListBlocks(self, request, context):  # type: ignore[no-untyped-def]
        w = await self._lead(context)
        served = [
            worker_pb2.ServedBlock(key=k, position=p, parent=par)
            for k, (p, par) in w.blocks.items()
        ]
        return worker_pb2.ListBlocksResponse(
            epoch=self.engine.epoch,
            served=served,
            sequence=len(w.events),
            incarnation=self.engine.incarnation,
            worker=w.worker,
        )

    async def Drain(self, request, context):  # type: ignore[no-untyped-def]
        await self._lead(context)
        return worker_pb2.DrainResponse()

    async def CopyBlocks(self, request, context):  # type: ignore[no-untyped-def]
        await self._lead(context)
        return worker_pb2.CopyBlocksResponse()

    async def EvictBlocks(self, request, context):  # type: ignore[no-untyped-def]
        w = await self._lead(context)
        gone = [k for k in request.block_keys if w.blocks.pop(k, None) is not None]
        if gone:
            self.engine.publish(
                w, worker_pb2.CacheEvent.REMOVED, gone, [0] * len(gone), [0] * len(gone)
            )
        return worker_pb2.EvictBlocksResponse(removed_blocks=len(gone))


async def serve(ranks: int, degrees: list[int], base_port: int, host: str = "127.0.0.1") -> None:
    engine = InstantEngine(ranks, degrees)
    servers = []
    for r in range(ranks):
        server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        worker_pb2_grpc.add_WorkerServicer_to_server(_Servicer(engine, r), server)
        server.add_insecure_port(f"{host}:{base_port + r}")
        await server.start()
        servers.append(server)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    print(f"instant engine: {ranks} ranks {degrees} from port {base_port}", flush=True)
    await stop.wait()
    await asyncio.gather(*(s.stop(0) for s in servers))


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--degrees", default="4,2,2")
    ap.add_argument("--base-port", type=int, required=True)
    args = ap.parse_args()
    asyncio.run(serve(args.ranks, [int(d) for d in args.degrees.split(",")], args.base_port))


if __name__ == "__main__":
    main()
