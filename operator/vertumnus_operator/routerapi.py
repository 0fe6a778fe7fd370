"""The operator's side of the router's Admin API (``proto/vertumnus/v1/pool.proto``).

The operator never talks to an engine: it drives a transition and reads the demand
through the router replicas, over gRPC (``grpc.aio``):

- ``Admin.TakeWindow(hop)`` on **every** replica, summed: the demand of one hop (each
  replica places its own share of the requests). The hop number makes a repeated call
  (a retry, or an operator restarted within the hop) answer the same report.
- ``Admin.Drain(worker)`` on every replica, once per participant of a transition: each
  replica stops placing there and re-places its queued requests; a worker counts as
  drained when every replica says so.
- ``Admin.Switch(epoch, domain, grouping, removed, kind)`` on every replica: they regroup
  the domain's ranks and update their index. Idempotent, so a switch re-sent after an
  operator restart changes nothing.
- ``Admin.GetPool`` on every replica, for the workers one of them reports FAILED (an
  engine that answers it cannot serve: an SGLang server that exited), which the
  operator replaces, or DRAINING after a rolling update the operator did not finish.
- ``Admin.Drain(worker, resume)`` on every replica: admit again at a worker whose domain
  pod a rolling update replaced (:mod:`vertumnus.operator.rollout`).

:class:`AdminError` carries the gRPC status name and the replica's address.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import grpc
from grpc import aio

from vertumnus._proto import pool_pb2, pool_pb2_grpc
from vertumnus.admintls import AdminTLS
from vertumnus.admintoken import bearer
from vertumnus.core import kappa
from vertumnus.core import transition as tr

__all__ = ["AdminError", "RouterAdmin", "Window"]


class AdminError(RuntimeError):
    def __init__(self, address: str, code: str, details: str) -> None:
        super().__init__(f"router {address}: {code}: {details}")
        self.address = address
        self.code = code
        self.details = details


PlacedRow = tuple[float, int, int, tuple[int, ...], int]
"""A first placement a router listed: (offset, length, cached tokens, block keys, worker;
-1 where the router did not say)."""


@dataclass
class Window:
    """One hop's demand, summed over the router replicas."""

    hop: int
    demand_s: float = 0.0
    requests: int = 0
    long_requests: int = 0
    long_demand_s: float = 0.0
    running_remaining_s: dict[int, float] = field(default_factory=dict)
    """Per worker: the longest remaining running prefill any replica reports."""
    reused_blocks: dict[int, float] = field(default_factory=dict)
    reconfiguring: bool = False
    replicas: int = 0
    capacity: list[kappa.Part] = field(default_factory=list)
    """Every replica's capacity sums (the controller's sample book adds them up)."""
    placed: list[PlacedRow] = field(default_factory=list)
    """Every replica's first placements (:data:`PlacedRow`), for the what-if check, in
    arrival order."""
    placed_left_out: int = 0
    """First placements the replicas only counted (beyond their per-hop limit): the
    list is then not the whole hop."""
    started_s: float = 0.0
    """When the hop began on the operator's monotonic clock (its previous take): the
    placements arrived ``started_s`` + their offset."""
    cache_blocks_per_gpu: int = 0
    """The workers' prefix-cache size in blocks per GPU, the least any replica reports
    (0: none did), for the shadow pools."""


def placed_rows(report: pool_pb2.WindowReport) -> list[PlacedRow]:
    """A report's first placements as :data:`PlacedRow` rows: from its packed columns, and
    from the message per placement an older router sends (no worker)."""
    rows = [
        (p.offset_seconds, p.length, p.cached_tokens, tuple(p.block_keys), -1)
        for p in report.placed
    ]
    c = report.placed_columns
    keys = c.block_keys
    n = len(c.offset_seconds)
    if c.worker and len(c.worker) != n:
        raise ValueError(f"placed_columns: {len(c.worker)} workers for {n} rows")
    workers = list(c.worker) if c.worker else [-1] * n
    end = 0
    for offset, length, cached, count, worker in zip(
        c.offset_seconds, c.length, c.cached_tokens, c.key_counts, workers, strict=True
    ):
        start, end = end, end + count
        rows.append((offset, length, cached, tuple(keys[start:end]), worker))
    if end != len(keys):
        raise ValueError(f"placed_columns: the key counts sum to {end}, there are {len(keys)} keys")
    return rows


class RouterAdmin:
    """Admin clients for a set of router replicas (``host:port``), channels kept open."""

    def __init__(
        self,
        addresses: Sequence[str],
        token: str,
        tls: AdminTLS | None = None,
        timeout_s: float = 10.0,
    ) -> None:
        if not addresses:
            raise ValueError("no router address")
        self.addresses = tuple(addresses)
        self.tls = tls
        self.timeout_s = timeout_s
        self._metadata = bearer(token)
        """The pool's Admin token, on every call (:mod:`vertumnus.admintoken`)."""
        if tls is None:
            self._channels = {a: aio.insecure_channel(a) for a in self.addresses}
        else:
            # Each router's certificate must name the pool's router Service, signed by
            # the operator's CA: the token goes to this pool's routers only, encrypted.
            creds, options = tls.credentials(), tls.options()
            self._channels = {a: aio.secure_channel(a, creds, options) for a in self.addresses}
        self._stubs = {a: pool_pb2_grpc.AdminStub(c) for a, c in self._channels.items()}
        self._taken: tuple[int, float, float] | None = None
        """(hop, its start, when it was taken) of the last take."""

    async def close(self) -> None:
        await asyncio.gather(*(c.close() for c in self._channels.values()))

    async def _call(self, address: str, method: str, request: object, timeout: float) -> object:
        stub = self._stubs[address]
        try:
            return await getattr(stub, method)(request, timeout=timeout, metadata=self._metadata)
        except aio.AioRpcError as e:
            code = e.code()
            name = code.name if isinstance(code, grpc.StatusCode) else str(code)
            raise AdminError(address, name, e.details() or "") from None

    async def _all(self, method: str, request: object, timeout: float) -> list[object]:
        return list(
            await asyncio.gather(*(self._call(a, method, request, timeout) for a in self.addresses))
        )

    async def take_window(self, hop: int) -> Window:
        now = time.monotonic()
        reports = await self._all("TakeWindow", pool_pb2.TakeWindowRequest(hop=hop), self.timeout_s)
        w = Window(hop=hop, replicas=len(reports))
        for r in reports:
            assert isinstance(r, pool_pb2.WindowReport)
            w.demand_s += r.demand_seconds
            w.requests += r.requests
            w.long_requests += r.long_requests
            w.long_demand_s += r.long_demand_seconds
            w.reconfiguring = w.reconfiguring or r.reconfiguring
            for load in r.workers:
                w.running_remaining_s[load.worker] = max(
                    w.running_remaining_s.get(load.worker, 0.0), load.running_remaining_seconds
                )
                w.reused_blocks[load.worker] = (
                    w.reused_blocks.get(load.worker, 0.0) + load.reused_blocks
                )
            w.capacity += [
                kappa.Part(
                    c.hop, c.degree, c.demand_seconds, c.requests, c.done, c.tokens, c.met_tokens
                )
                for c in r.capacity
            ]
            w.placed += placed_rows(r)
            w.placed_left_out += r.placed_left_out
            if r.cache_blocks_per_gpu:
                w.cache_blocks_per_gpu = min(
                    w.cache_blocks_per_gpu or r.cache_blocks_per_gpu, r.cache_blocks_per_gpu
                )
        w.placed.sort(key=lambda row: row[0])
        if self._taken is not None and self._taken[0] == hop:
            w.started_s = self._taken[1]  # a retried take: the same hop, the same start
        else:
            # The hop began at the previous take; the first one's is taken to end now.
            w.started_s = (
                self._taken[2]
                if self._taken is not None
                else now - max((row[0] for row in w.placed), default=0.0)
            )
            self._taken = (hop, w.started_s, now)
        return w

    async def failed_workers(self) -> dict[int, str]:
        """Worker → why, for every worker a replica reports FAILED (the first reason)."""
        out: dict[int, str] = {}
        for r in await self._all("GetPool", pool_pb2.GetPoolRequest(), self.timeout_s):
            assert isinstance(r, pool_pb2.PoolStatus)
            for w in r.workers:
                if w.state == pool_pb2.WorkerStatus.FAILED:
                    out.setdefault(w.worker, w.failure or "no reason given")
        return out

    async def drain(self, worker: int, timeout_s: float) -> bool:
        """Drain ``worker`` at every replica; True once all say it is drained."""
        req = pool_pb2.DrainRequest(worker=worker, timeout_seconds=timeout_s)
        replies = await self._all("Drain", req, timeout_s + self.timeout_s)
        return all(isinstance(r, pool_pb2.DrainResponse) and r.drained for r in replies)

    async def resume(self, worker: int) -> None:
        """Admit at ``worker`` again at every replica (after a drain that no switch
        followed: its domain pod was replaced in a rolling update)."""
        await self._all("Drain", pool_pb2.DrainRequest(worker=worker, resume=True), self.timeout_s)

    async def draining_workers(self) -> set[int]:
        """The workers some replica reports DRAINING."""
        out: set[int] = set()
        for r in await self._all("GetPool", pool_pb2.GetPoolRequest(), self.timeout_s):
            assert isinstance(r, pool_pb2.PoolStatus)
            out |= {w.worker for w in r.workers if w.state == pool_pb2.WorkerStatus.DRAINING}
        return out

    async def switch(self, action: tr.Switch, kind: str, engine_timeout_s: float = 60.0) -> float:
        """Send ``action`` to every replica; the longest switch time any reported. The
        replicas wait up to ``engine_timeout_s`` for the engine's regroup."""
        req = pool_pb2.SwitchRequest(
            epoch=action.epoch,
            domain=action.domain,
            grouping=[
                pool_pb2.Slot(worker=s.worker, degree=s.degree, domain=s.domain, offset=s.offset)
                for s in action.grouping
            ],
            removed=list(action.removed),
            kind=kind,
        )
        replies = await self._all("Switch", req, engine_timeout_s + self.timeout_s)
        return max(
            (r.switch_seconds for r in replies if isinstance(r, pool_pb2.SwitchResponse)),
            default=0.0,
        )
