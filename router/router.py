"""The router: the routing core's step loop over real CP workers, in asyncio.

One :class:`Router` serves one pool. For each accepted request it runs the
serving core's steps (:mod:`vertumnus.core.routing`) and carries out what
they say:

- **admission**: at most ``admission_limit`` requests accepted and not
  finished; beyond it the caller gets ``RESOURCE_EXHAUSTED`` instead of an
  unbounded queue;
- **placement**: ``schedule`` reserves Ê at the chosen worker; the request
  joins that worker's FIFO queue here, in the router, and is forwarded when
  the worker is free — one prefill at a time per worker, the model the cost
  model and the simulator assume, and what lets a drain take queued
  requests back;
- **forwarding** with a deadline (the client's, and a per-attempt bound
  derived from Ê); the pending blocks a decision asks for (a recent split or
  merge) are copied to the worker first (``CopyBlocks``);
- **failures**: a worker that drops the connection, times out or answers
  ``UNAVAILABLE`` has the request placed again (``failed`` + ``schedule``, up
  to ``max_attempts``), and is taken out of the candidate set until it
  answers again;
- **the index** follows every worker's cache events (:mod:`.follower`);
- **the cache manager**: periodic scans; copies and reclamations are carried
  out through the workers (``CopyBlocks`` / ``EvictBlocks``) and become
  visible to placement only through the workers' own events;
- **transitions** (split/merge): the core's state machine
  (:mod:`vertumnus.core.transition`) — drains, the engines' ``Epoch`` switch,
  the reconciliation plan at the commit, after which the pool's queues are
  placed again so the new workers take their share — whether this router
  runs the controller itself (``vertumnus up``) or an operator asks through
  the Admin API;
- **window demand** for the composition controller (:meth:`take_window`).

Everything runs on one event loop; the core is called only from it. ``now``
is the loop's monotonic clock, in seconds since the router started.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import grpc
import numpy as np

from vertumnus._proto import worker_pb2
from vertumnus.core import kappa, planner, transition
from vertumnus.core.cachemanager import CacheManager, Copy, Reclaim
from vertumnus.core.control import Controller
from vertumnus.core.decision import RouteDecision
from vertumnus.core.keys import token_block_keys
from vertumnus.core.lattice import Layout, Slot
from vertumnus.core.metrics import SloRule
from vertumnus.core.policies.vertumnus import CostModelPolicy
from vertumnus.core.reconcile import PendingCopy, ReconcilePlan, plan_merge, plan_split
from vertumnus.core.routing import Invalidation, RoutingCore, placement_order
from vertumnus.core.store import TrieStore, prefix_of
from vertumnus.core.trie import PrefixTrie
from vertumnus.core.types import Composition, Request
from vertumnus.profiles import load_capacity, load_model
from vertumnus.router.follower import Follower
from vertumnus.router.metrics import RouterMetrics
from vertumnus.router.settings import RouterSettings
from vertumnus.router.validate import BadRequest, check_prefill
from vertumnus.router.workers import (
    Endpoints,
    EngineInfo,
    WorkerAddress,
    discover,
    grouping_request,
)

__all__ = ["PrefillResult", "Router", "RouterError"]

_log = logging.getLogger("vertumnus.router")

TRANSITIONS_KEPT = 1000
"""How many of its own transitions' records a router keeps (``transitions_done``)."""

_RETRYABLE = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.INTERNAL,
    grpc.StatusCode.FAILED_PRECONDITION,  # the worker is draining or regrouped
}
"""Worker answers after which the request is placed again elsewhere."""


class RouterError(Exception):
    """An error for the caller: a gRPC status code and a message naming what is wrong."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class PrefillResult:
    request_id: str
    first_token_id: int
    worker: int
    degree: int
    epoch: int
    cached_tokens: int
    queue_seconds: float
    execution_seconds: float
    ttft_seconds: float
    attempts: int
    predicted_seconds: float


@dataclass(eq=False)
class _Pending:
    """One accepted request, from admission to its answer."""

    request: Request
    client_id: str
    tokens: Sequence[int]  # as the client sent them (a protobuf field): forwarded as is
    future: asyncio.Future[PrefillResult]
    received: float
    deadline: float
    attempts: int = 0
    decision: RouteDecision | None = None
    first_placement: bool = True
    forwarded_at: float = 0.0
    slo_s: float = 0.0


@dataclass
class _Worker:
    """The router's view of one worker beyond the core's WorkerState."""

    address: WorkerAddress
    queue: deque[_Pending] = field(default_factory=deque)
    running: _Pending | None = None
    ahead: _Pending | None = None
    """Forwarded behind ``running`` and waiting at the worker, so that the worker
    starts it without idling for a round trip to the router; the core sees it as
    queued until ``running`` ends."""
    early: tuple[worker_pb2.PrefillResponse, float] | None = None
    """``ahead``'s reply when it came before ``running``'s (one engine step served both)."""
    idle: asyncio.Event = field(default_factory=asyncio.Event)
    unreachable: bool = False
    failure: str = ""
    """What the worker's Describe says keeps it from serving (empty: nothing)."""
    draining: bool = False
    epoch: int = 0

    def at_worker(self) -> list[_Pending]:
        """The requests forwarded to the worker and not yet answered."""
        return [p for p in (self.running, self.ahead) if p is not None]


@dataclass
class _Hop:
    """What the composition controller reads per hop (first placements only)."""

    demand_s: float = 0.0
    requests: int = 0
    long_requests: int = 0
    long_demand_s: float = 0.0
    reused: dict[int, float] = field(default_factory=dict)
    placed: list[tuple[Request, int, int, float]] = field(default_factory=list)
    """The first placements (request, cached tokens counted on, worker, Ê), for the
    local controller's what-if check and capacity samples."""
    completed: list[tuple[int, float]] = field(default_factory=list)
    """(request id, TTFT) of the requests served, for the local controller's
    capacity samples."""
    capacity: list[kappa.Part] = field(default_factory=list)
    """The replica's capacity sums, set when the hop is taken (operator-run pools)."""
    started_s: float = 0.0
    """When the hop began (the router's clock): the listed placements' arrivals are
    reported relative to it, so that replicas' clocks need not agree."""
    listed: list[tuple[float, int, int, tuple[int, ...], int]] = field(default_factory=list)
    """Operator-run pools: the first placements (arrival after ``started_s``, length,
    cached tokens counted on, block keys, worker), for the operator's what-if check."""
    left_out: int = 0
    """First placements beyond ``RouterSettings.report_requests``, only counted."""


class Router:
    """One pool's router; see the module docstring. ``engines`` are the rank-0
    addresses of the pool's engines, one per NVLink domain, in domain order."""

    def __init__(
        self,
        settings: RouterSettings,
        engines: Sequence[str],
        *,
        store: TrieStore | None = None,
        router_id: str = "router-0",
    ) -> None:
        if not engines:
            raise ValueError("a router needs at least one engine address (--engine HOST:PORT)")
        self.settings = settings
        self.engines = list(engines)
        self.router_id = router_id
        self.model = load_model(settings.profile)
        self.store: TrieStore = (
            store if store is not None else PrefixTrie(f"{settings.pool}:{self.model.name}")
        )
        manager = (
            CacheManager(settings.cache_manager) if settings.cache_manager is not None else None
        )
        self.core: RoutingCore | None = None
        self._manager = manager
        self.metrics = RouterMetrics(router_id)
        self.endpoints = Endpoints()
        self.workers: dict[int, _Worker] = {}
        self.followers: dict[int, Follower] = {}
        self.engine_info: list[EngineInfo] = []
        self.pool: transition.PoolState | None = None
        self.controller: Controller | None = None
        self._ids = itertools.count(1)
        self._by_client: dict[str, _Pending] = {}
        self._held: deque[_Pending] = deque()
        self._hop = _Hop()
        self._last_hop: tuple[int, _Hop] | None = None
        self._capacity = kappa.ReplicaBook()
        """This replica's share of the capacity samples of an operator-run pool (the
        local controller, if any, tracks its own)."""
        self._slo = SloRule()
        self._tasks: list[asyncio.Task[None]] = []
        self._t0 = 0.0
        self._closing = False
        self._transition_lock = asyncio.Lock()
        self.block_size = 0
        self.max_tokens = 0
        self.vocab_size = 0
        self.transitions_done: deque[dict[str, object]] = deque(maxlen=TRANSITIONS_KEPT)
        """The transitions this router ran itself, newest last (a long-lived router with
        its own controller keeps the last ``TRANSITIONS_KEPT``, not every one)."""
        self.store_kind = "memory" if isinstance(self.store, PrefixTrie) else "redis"
        self._board: object | None = None

    @property
    def store_degraded(self) -> bool:
        """The shared store is unreachable: placement uses this replica's own view."""
        return bool(getattr(self.store, "degraded", False))

    @property
    def runs_transitions(self) -> bool:
        """This router carries out splits and merges itself (the local pool, a router
        without an operator); else an external controller (the operator) does."""
        return not self.settings.external_controller

    # -- life cycle -------------------------------------------------------------------

    def now(self) -> float:
        """Seconds since the router started (monotonic)."""
        return time.monotonic() - self._t0

    async def start(self, *, discover_timeout_s: float = 60.0) -> None:
        """Discover the engines' workers, build the index from their snapshots, start serving."""
        self._t0 = time.monotonic()
        self.engine_info = [
            await self._discover(d, addr, discover_timeout_s) for d, addr in enumerate(self.engines)
        ]
        sizes = {e.block_size for e in self.engine_info}
        if len(sizes) != 1:
            raise ValueError(f"the engines use different block sizes {sorted(sizes)}")
        self.block_size = sizes.pop()
        self.max_tokens = max(e.max_tokens for e in self.engine_info)
        self.vocab_size = min(e.vocab_size for e in self.engine_info)
        for e in self.engine_info:
            for w in e.workers:
                if not self.model.supports(w.slot.degree):
                    raise ValueError(
                        f"worker {w.id} of {e.address} has degree {w.slot.degree}, which profile "
                        f"{self.model.name!r} does not cover ({', '.join(map(str, self.model.degrees))})"
                    )
        start_store = getattr(self.store, "start", None)
        if start_store is not None:
            await start_store()
        self.core = RoutingCore(
            CostModelPolicy(self.settings.placement),
            self.model,
            self.block_size,
            store=self.store,
            cache_manager=self._manager,
        )
        domain_size = max(e.world for e in self.engine_info)
        slots = [w.slot for e in self.engine_info for w in e.workers]
        self.pool = transition.initial_pool(
            Layout(tuple(sorted(slots, key=lambda s: (s.domain, s.offset))), domain_size),
            epoch=max(e.epoch for e in self.engine_info),
        )
        for e in self.engine_info:
            for w in e.workers:
                self._add_worker(w, e.epoch, e.incarnation, resync_first=True)
        await asyncio.gather(*(f.synced(10.0) for f in self.followers.values()))
        client = getattr(self.store, "client", None)
        if client is not None and self.settings.share_load:
            from vertumnus.router.loadboard import RedisLoadBoard

            self._board = RedisLoadBoard(client, self.store.namespace, self.router_id)
            self._spawn(self._share_load(), "load-board")
        if self._manager is not None:
            self._spawn(self._scan_loop(), "cache-manager")
        if self.settings.controller is not None:
            self._start_controller(self.settings.controller)
        # Collections are timed from here on (vertumnus_process_gc_pause_seconds).
        self.metrics.gc_pauses.start()
        self._spawn(self._metrics_loop(), "metrics")
        _log.info(
            "router %s serving %s (%d workers, epoch %d)",
            self.router_id,
            self.composition(),
            len(self.workers),
            self.pool.epoch,
        )

    async def _discover(self, domain: int, address: str, timeout_s: float) -> EngineInfo:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return await discover(self.endpoints, domain, address)
            except grpc.aio.AioRpcError as e:
                if time.monotonic() > deadline:
                    raise RouterError(
                        grpc.StatusCode.UNAVAILABLE,
                        f"engine {address} did not answer within {timeout_s:.0f} s ({e.code().name}: {e.details()})",
                    ) from None
                await asyncio.sleep(0.2)

    async def close(self) -> None:
        """Stop accepting, fail what is still waiting, stop every task."""
        self._closing = True
        self.metrics.gc_pauses.stop()
        for p in list(self._by_client.values()):
            if not p.future.done():
                p.future.set_exception(
                    RouterError(grpc.StatusCode.UNAVAILABLE, "the router is shutting down")
                )
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.gather(*(f.stop() for f in self.followers.values()))
        stop_store = getattr(self.store, "stop", None)
        if stop_store is not None:
            await stop_store()
        await self.endpoints.close()

    def _spawn(self, coro, name: str) -> asyncio.Task[None]:  # type: ignore[no-untyped-def]
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.append(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[None]) -> None:
        if task in self._tasks:
            self._tasks.remove(task)
        if not task.cancelled() and task.exception() is not None and not self._closing:
            _log.error("task %s failed", task.get_name(), exc_info=task.exception())

    # -- workers ------------------------------------------------------------------------

    def _add_worker(
        self, address: WorkerAddress, epoch: int, incarnation: int, *, resync_first: bool
    ) -> None:
        assert self.core is not None
        wid = address.id
        self.core.add_worker(wid, address.slot.degree, cache_capacity_blocks=address.cache_blocks)
        state = _Worker(address, epoch=epoch)
        state.idle.set()
        self.workers[wid] = state
        if self.settings.index_source == "store":
            return  # the index comes from the shared store's change stream
        f = Follower(
            wid,
            self.endpoints.stub(address.address),
            self._apply_events,
            epoch=epoch,
            incarnation=0 if resync_first else incarnation,
            resync_first=resync_first,
            retry_s=self.settings.worker_retry_s,
            forget_after_s=self.settings.worker_forget_s,
            on_unreachable=self._reachability,
        )
        self.followers[wid] = f
        f.start()

    async def _metrics_loop(self) -> None:
        """Refresh what /metrics reads (it is served from another thread: it gets a
        snapshot taken here, never the live state)."""
        while True:
            self.metrics.snapshot(self)
            await asyncio.sleep(1.0)

    async def _share_load(self) -> None:
        """Exchange outstanding work per worker with the other replicas (Redis)."""
        assert self.core is not None and self._board is not None
        board: Any = self._board
        failing = False
        while True:
            await asyncio.sleep(self.settings.load_share_interval_s)
            mine = self.core.own_outstanding(self.now())
            try:
                others = await asyncio.to_thread(board.exchange, mine)
            except ConnectionError:
                others = {}
            except Exception:
                # One bad round must not end the sharing for the router's lifetime;
                # logged once per streak of failures, not every interval.
                if not failing:
                    _log.exception("load sharing: an exchange failed; retrying every interval")
                failing = True
                continue
            failing = False
            self.core.set_external_load(others)

    def _apply_events(self, worker: int, stored, removed, cleared: bool) -> None:  # type: ignore[no-untyped-def]
        if self.core is None or worker not in self.workers:
            return
        self.core.apply_cache_events(worker, stored, removed, cleared=cleared)

    def _reachability(self, worker: int, unreachable: bool) -> None:
        w = self.workers.get(worker)
        if w is None or self.core is None:
            return
        if unreachable and not w.unreachable:
            # Ask it why (a failed SGLang server ends its event stream at once, so
            # this learns of a failure before any request goes there).
            self._spawn(self._probe(worker), f"probe-{worker}")
        w.unreachable = unreachable
        self.core.set_available([worker], not unreachable and not w.draining)
        self.metrics.worker_reachable(worker, not unreachable)
        if not unreachable:
            self._release_held()
            self._kick(worker)

    def in_flight(self) -> int:
        """Requests accepted and not answered."""
        return len(self._by_client)

    def composition(self) -> Composition:
        return Composition(tuple(w.address.slot.degree for w in self.workers.values()))

    # -- the request path -----------------------------------------------------------

    async def prefill(
        self,
        request_id: str,
        tokens: Sequence[int],
        *,
        timeout_s: float | None = None,
        ttft_slo_s: float = 0.0,
    ) -> PrefillResult:
        """Serve one prefill; raises :class:`RouterError` with the status to answer."""
        if self.core is None or self._closing:
            raise RouterError(grpc.StatusCode.UNAVAILABLE, "the router is not serving")
        started = time.perf_counter()
        try:
            # One array of the ids for the checks and the hashing (a protobuf
            # repeated field converts to it in C); the field itself is forwarded.
            try:
                ids = np.array(tokens, dtype=np.int64)
            except (OverflowError, ValueError, TypeError):
                ids = np.empty((0, 0), dtype=np.int64)
            if ids.ndim != 1:
                raise BadRequest(
                    f"token_ids: not a list of 64-bit integers (request {request_id})"
                ) from None
            check_prefill(
                request_id,
                ids,
                ttft_slo_s,
                max_tokens=self.max_tokens,
                vocab_size=self.vocab_size,
            )
        except BadRequest as e:
            self.metrics.outcome("invalid")
            raise RouterError(grpc.StatusCode.INVALID_ARGUMENT, str(e)) from None
        if request_id in self._by_client:
            self.metrics.outcome("duplicate")
            raise RouterError(
                grpc.StatusCode.ALREADY_EXISTS, f"request_id: {request_id!r} is already in flight"
            )
        if len(self._by_client) >= self.settings.admission_limit:
            self.metrics.outcome("rejected")
            raise RouterError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"the router holds {len(self._by_client)} requests, its admission limit; retry later",
            )
        now = self.now()
        keys = token_block_keys(ids, self.block_size)
        request = Request(next(self._ids), now, len(tokens), keys)
        loop = asyncio.get_running_loop()
        timeout = timeout_s if timeout_s is not None else self.settings.request_timeout_s
        p = _Pending(request, request_id, tokens, loop.create_future(), now, now + timeout)
        p.slo_s = ttft_slo_s
        self._by_client[request_id] = p
        # A timer, not wait_for(shield(...)): two tasks fewer per request.
        deadline = loop.call_later(timeout, self._expire, p, timeout)
        try:
            self._place(p)
            self.metrics.placement_seconds(time.perf_counter() - started)
            return await p.future
        except asyncio.CancelledError:
            # The client went away: what is still queued for it need not run.
            self._abandon(p)
            self.metrics.outcome("cancelled")
            raise
        finally:
            deadline.cancel()
            self._by_client.pop(request_id, None)

    def _expire(self, p: _Pending, timeout: float) -> None:
        if p.future.done():
            return
        p.future.set_exception(
            RouterError(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"request {p.client_id}: no first token within {timeout:.3g} s",
            )
        )
        self._abandon(p)
        self.metrics.outcome("deadline")

    def _place(self, p: _Pending) -> None:
        """Schedule ``p`` (again); queue it, hold it, or fail it."""
        assert self.core is not None
        decision = self.core.schedule(p.request, self.now())
        if decision is None:
            if self._reconfiguring() or any(
                w.unreachable or w.draining for w in self.workers.values()
            ):
                self._held.append(p)  # workers will be back: wait for them
                return
            self._fail(
                p,
                RouterError(
                    grpc.StatusCode.UNAVAILABLE,
                    f"no worker can take a request of {p.request.length} tokens",
                ),
            )
            return
        p.decision = decision
        if p.first_placement:
            p.first_placement = False
            hop = self._hop
            hop.demand_s += decision.estimate_s
            hop.requests += 1
            control = self.settings.controller
            long = control.long_threshold if control else self.settings.long_threshold
            if p.request.length > long:
                hop.long_requests += 1
                hop.long_demand_s += decision.estimate_s
            if control is not None:
                hop.placed.append(
                    (p.request, decision.cached_tokens, decision.worker, decision.estimate_s)
                )
            else:
                if len(hop.listed) < self.settings.report_requests:
                    r = p.request
                    hop.listed.append(
                        (
                            r.arrival_s - hop.started_s,
                            r.length,
                            decision.cached_tokens,
                            r.block_keys,
                            decision.worker,
                        )
                    )
                else:
                    hop.left_out += 1
                degree = self.workers[decision.worker].address.slot.degree
                self._capacity.placed(
                    p.request.id,
                    degree,
                    decision.estimate_s,
                    p.request.length,
                    self._slo.tau(self.model, p.request.length, degree),
                )
        w = self.workers[decision.worker]
        w.queue.append(p)
        w.idle.clear()
        self._kick(decision.worker)

    def _kick(self, worker: int) -> None:
        """Forward the next queued request if the worker is free, or one ahead of time
        if it runs one and has none waiting."""
        w = self.workers.get(worker)
        if w is None or not w.queue or w.unreachable:
            return
        assert self.core is not None
        if w.running is None:
            p = w.queue.popleft()
            w.running = p
            self._start(p)
        elif w.ahead is None and self.settings.forward_ahead and not w.draining:
            p = w.queue.popleft()
            w.ahead = p
            self.core.forwarded(p.request.id)
        else:
            return
        p.attempts += 1  # placements that never reached a worker (drains) do not count
        p.forwarded_at = self.now()
        self._spawn(self._attempt(worker, p), f"prefill-{p.client_id}")

    def _start(self, p: _Pending) -> None:
        assert self.core is not None and p.decision is not None
        now = self.now()
        self.core.started(p.request.id, now, now + p.decision.estimate_s)

    def _promote(self, w: _Worker) -> None:
        """``running`` ended: the request waiting at the worker is the one it runs now."""
        w.running, w.ahead = w.ahead, None
        if w.running is not None:
            self._start(w.running)
            if w.early is not None:
                reply, ended = w.early
                w.early = None
                self._succeeded(w, w.running, reply, ended)

    async def _attempt(self, worker: int, p: _Pending) -> None:
        w = self.workers[worker]
        d = p.decision
        assert d is not None and self.core is not None
        budget = min(
            p.deadline - self.now(),
            self.settings.attempt_timeout_floor_s
            + self.settings.attempt_timeout_factor * d.estimate_s,
        )
        try:
            if d.copies:
                await self._copy_pending(worker, d.copies, budget)
            reply = await self.endpoints.stub(w.address.address).Prefill(
                worker_pb2.PrefillRequest(request_id=p.client_id, token_ids=p.tokens),
                timeout=max(budget, 0.001),
            )
        except grpc.aio.AioRpcError as e:
            self._attempt_failed(worker, p, e)
            return
        if w.ahead is p:
            # Served in the same engine step as ``running``, whose reply is still on
            # its way: the core learns of both in order, when that reply comes.
            w.early = (reply, self.now())
            return
        self._succeeded(w, p, reply, self.now())

    def _succeeded(
        self, w: _Worker, p: _Pending, reply: worker_pb2.PrefillResponse, ended: float
    ) -> None:
        assert self.core is not None and p.decision is not None
        worker = w.address.slot.worker
        self.core.finished(p.request.id)
        if w.running is p:
            self._promote(w)
        if not p.future.done():
            result = PrefillResult(
                p.client_id,
                reply.first_token_id,
                worker,
                reply.degree,
                reply.epoch,
                reply.cached_tokens,
                (p.forwarded_at - p.received) + reply.queue_seconds,
                reply.execution_seconds,
                ended - p.received,
                p.attempts,
                p.decision.estimate_s,
            )
            p.future.set_result(result)
            self._hop.reused[worker] = (
                self._hop.reused.get(worker, 0.0) + reply.cached_tokens / self.block_size
            )
            self.metrics.completed(
                result, w.address.slot.degree, reply.cached_tokens, len(p.tokens), p.slo_s
            )
            if self.settings.controller is not None:
                self._hop.completed.append((p.request.id, ended - p.received))
            else:
                self._capacity.completed(p.request.id, ended - p.received)
        self._after_run(worker)

    def _after_run(self, worker: int) -> None:
        w = self.workers.get(worker)
        if w is None:
            return
        if w.running is None and w.ahead is None and not w.queue:
            w.idle.set()
        self._kick(worker)

    def _off_worker(self, w: _Worker, p: _Pending) -> None:
        """``p``'s attempt at ``w`` ended without a reply."""
        if w.running is p:
            self._promote(w)
        elif w.ahead is p:
            w.ahead, w.early = None, None

    def _attempt_failed(self, worker: int, p: _Pending, e: grpc.aio.AioRpcError) -> None:
        assert self.core is not None
        code = e.code()
        w = self.workers[worker]
        if code == grpc.StatusCode.INVALID_ARGUMENT:
            # The worker refused the request itself: placing it elsewhere will not help.
            if w.running is p:
                self.core.finished(p.request.id)
            else:  # still queued, for the core
                self.core.failed(p.request.id)
            self._off_worker(w, p)
            self._fail(p, RouterError(code, e.details() or "the worker refused the request"))
            self._after_run(worker)
            return
        self.core.failed(p.request.id)
        self._off_worker(w, p)
        self.metrics.attempt_failed(worker, code.name)
        _log.warning(
            "request %s: worker %d failed (%s: %s)",
            p.client_id,
            worker,
            code.name,
            e.details(),
            extra={
                "request_id": p.client_id,
                "worker": worker,
                "code": code.name,
                "attempt": p.attempts,
            },
        )
        if code in (
            grpc.StatusCode.UNAVAILABLE,
            grpc.StatusCode.DEADLINE_EXCEEDED,
            grpc.StatusCode.UNKNOWN,
            # Draining, regrouped behind this router's back, or failed (an SGLang
            # server that exited): out until its Describe says it serves again.
            grpc.StatusCode.FAILED_PRECONDITION,
        ):
            self._mark_unreachable(worker)
        if (
            code not in _RETRYABLE
            or p.attempts >= self.settings.max_attempts
            or self.now() >= p.deadline
        ):
            self._fail(
                p,
                RouterError(
                    grpc.StatusCode.UNAVAILABLE,
                    f"request {p.client_id}: {p.attempts} attempt(s) failed, last at worker {worker} "
                    f"({code.name}: {e.details()})",
                ),
            )
        elif not p.future.done():
            self.metrics.outcome("replaced")
            self._place(p)
        self._after_run(worker)

    def _mark_unreachable(self, worker: int) -> None:
        """Stop placing at a worker that failed; its follower sees it come back.
        The requests queued behind the failed one go elsewhere at once."""
        w = self.workers.get(worker)
        if w is None or self.core is None:
            return
        if not w.unreachable:
            w.unreachable = True
            self.metrics.worker_reachable(worker, False)
            self._spawn(self._probe(worker), f"probe-{worker}")
        self.core.set_available([worker], False)
        self._withdraw_queue(worker)

    async def _probe(self, worker: int) -> None:
        """Ask an unreachable worker who it is until it answers as itself, serving (not
        draining, no failure), then admit again."""
        while True:
            w = self.workers.get(worker)
            if w is None or not w.unreachable:
                return
            try:
                d = await self.endpoints.stub(w.address.address).Describe(
                    worker_pb2.DescribeRequest(), timeout=2.0
                )
            except grpc.aio.AioRpcError:
                await asyncio.sleep(self.settings.worker_retry_s)
                continue
            if d.worker == worker and not d.failure and not d.draining:
                w.failure = ""
                self._reachability(worker, False)
                return
            if d.failure and d.failure != w.failure:
                # It answers, but cannot serve (a crashed SGLang server): stay away
                # until an Epoch replaces it.
                w.failure = d.failure
                _log.warning("worker %d reports a failure: %s", worker, d.failure)
            await asyncio.sleep(self.settings.worker_retry_s)

    def _withdraw_queue(self, worker: int) -> None:
        assert self.core is not None
        w = self.workers[worker]
        queued = list(w.queue)
        w.queue.clear()
        for r in self.core.withdraw(worker, [q.request.id for q in queued]):
            del r
        for q in queued:
            self._place(q)

    async def _copy_pending(
        self, worker: int, copies: Sequence[PendingCopy], budget: float
    ) -> None:
        """Copy the pending blocks a placement reuses before its prefill (lazy reconciliation)."""
        w = self.workers[worker]
        for c in copies:
            source = c.source if c.source in self.workers else None
            if source is None:
                continue  # the source left meanwhile: the worker recomputes (a miss)
            try:
                rep = await self.endpoints.stub(w.address.address).CopyBlocks(
                    worker_pb2.CopyBlocksRequest(source_worker=source, block_keys=list(c.keys)),
                    timeout=max(budget, 0.001),
                )
                self.metrics.reconciled(rep.copied_blocks)
            except grpc.aio.AioRpcError as e:
                # Not fatal: the prefill recomputes what is missing. Say so.
                _log.info(
                    "worker %d: reconciliation copy from %d failed: %s",
                    worker,
                    source,
                    e.details(),
                    extra={"worker": worker, "source": source},
                )

    def _fail(self, p: _Pending, error: RouterError) -> None:
        if not p.future.done():
            p.future.set_exception(error)
            self.metrics.outcome("failed")

    def _abandon(self, p: _Pending) -> None:
        """The client gave up: forget the request unless it is running at a worker
        (its answer is then dropped when it comes)."""
        assert self.core is not None
        p.future.cancel()
        d = self.core.decision(p.request.id)
        if d is None:
            if p in self._held:
                self._held.remove(p)
            return
        w = self.workers.get(d.worker)
        if w is not None and p in w.queue:
            w.queue.remove(p)
            self.core.failed(p.request.id)
            self._after_run(d.worker)

    def _release_held(self) -> None:
        held, self._held = self._held, deque()
        for p in held:
            if not p.future.done():
                self._place(p)

    def _reconfiguring(self) -> bool:
        return self.pool is not None and bool(self.pool.transitions)

    # -- the cache manager -------------------------------------------------------------

    async def _scan_loop(self) -> None:
        assert self._manager is not None
        interval = self.settings.scan_interval_s or self._manager.settings.scan_interval_s
        while True:
            await asyncio.sleep(interval)
            self.scan()

    def scan(self) -> tuple[int, int, int]:
        """One cache-manager scan now; its copies and reclamations start. Returns
        (copies, reclaims, tracked blocks)."""
        if self._manager is None or self.core is None:
            raise RouterError(
                grpc.StatusCode.FAILED_PRECONDITION, "this router runs no cache manager"
            )
        plan = self._manager.scan(self.core)
        for op in plan.copies:
            self._spawn(self._copy(op), f"copy-{op.key:x}")
        for rop in plan.reclaims:
            self._spawn(self._reclaim(rop), f"reclaim-{rop.key:x}")
        self.metrics.scan(len(plan.copies), len(plan.reclaims))
        return len(plan.copies), len(plan.reclaims), plan.tracked_nodes

    async def _copy(self, op: Copy) -> None:
        assert self._manager is not None
        dst = self.workers.get(op.destination)
        ok = False
        if dst is not None and op.source in self.workers and not dst.unreachable:
            try:
                await self.endpoints.stub(dst.address.address).CopyBlocks(
                    worker_pb2.CopyBlocksRequest(source_worker=op.source, block_keys=list(op.keys)),
                    timeout=30.0,
                )
                ok = True
            except grpc.aio.AioRpcError as e:
                _log.info(
                    "copy of %#x to worker %d failed: %s", op.key, op.destination, e.details()
                )
        if any(o is op for o in self._manager.copies_in_flight):
            self._manager.copy_finished(op, installed=ok)
            self.metrics.copy_done(ok)

    async def _reclaim(self, op: Reclaim) -> None:
        assert self._manager is not None and self.core is not None
        w = self.workers.get(op.worker)
        ok = False
        in_use = self._manager.in_use(op.worker, op.key) or (
            w is not None
            and any(op.key in q.request.block_keys for q in [*w.queue, *w.at_worker()])
        )
        children = self.store.children(op.key)
        has_child = any(op.worker in self.store.holders(c) for c in children)
        if w is not None and not in_use and not has_child and not w.unreachable:
            try:
                rep = await self.endpoints.stub(w.address.address).EvictBlocks(
                    worker_pb2.EvictBlocksRequest(block_keys=[op.key]), timeout=10.0
                )
                ok = rep.removed_blocks > 0
            except grpc.aio.AioRpcError as e:
                _log.info("reclaim of %#x at worker %d failed: %s", op.key, op.worker, e.details())
        if any(o is op for o in self._manager.reclaims_in_flight):
            self._manager.reclaim_finished(op, deleted=ok)
            self.metrics.reclaim_done(ok)

    # -- window demand ----------------------------------------------------------------

    def take_window(self, hop: int) -> tuple[int, _Hop, dict[int, float], bool]:
        """The demand of first placements since the last take (the same answer again for
        the same ``hop``), with each worker's running remainder and whether a transition
        is in flight."""
        if self._last_hop is not None and self._last_hop[0] == hop:
            report = self._last_hop[1]
        else:
            report, self._hop = self._hop, _Hop(started_s=self.now())
            report.capacity = self._capacity.take(hop)
            self._last_hop = (hop, report)
        assert self.core is not None
        return hop, report, self.core.running_remaining(self.now()), self._reconfiguring()

    # -- the controller (local pool) ---------------------------------------------------

    def _start_controller(self, settings: planner.PlannerSettings) -> None:
        assert self.pool is not None
        capacity = load_capacity(self.model.name)
        state = planner.ControllerState(layout=self.pool.layout, epoch=self.pool.epoch)
        self.controller = Controller(
            state,
            capacity,
            settings,
            self.model,
            self.settings.placement,
            self.block_size,
            cache_blocks_per_gpu=self.cache_blocks_per_gpu() or None,
        )
        self._spawn(self._control_loop(), "controller")

    def cache_blocks_per_gpu(self) -> int:
        """The workers' prefix-cache size in blocks per GPU: the least over the engines
        (0 before they are discovered)."""
        return min((e.cache_blocks_per_rank for e in self.engine_info), default=0)

    async def _control_loop(self) -> None:
        assert self.controller is not None and self.core is not None
        hop_n = 0
        while True:
            await asyncio.sleep(self.controller.settings.hop)
            hop_n += 1
            _, hop, running, busy = self.take_window(hop_n)
            windows = self.controller.windows
            windows.add(hop.demand_s, hop.requests, hop.long_requests, hop.long_demand_s)
            for request, cached, worker, estimate_s in hop.placed:
                windows.seen(request, cached, worker)
                self.controller.track(request, worker, estimate_s)
            if self.controller.shadows is not None:
                # On a thread: the shadows place every request of the hop again, once
                # each (milliseconds on a large pool), and the loop keeps serving.
                arrived = sorted((row[0] for row in hop.placed), key=lambda r: r.arrival_s)
                await asyncio.to_thread(self.controller.shadow_serve, arrived)
            for request_id, ttft_s in hop.completed:
                self.controller.completed(request_id, ttft_s)
            for worker, blocks in hop.reused.items():
                windows.reused(worker, blocks)
            t0 = time.perf_counter()
            tick = self.controller.tick(running, busy)
            self.metrics.controller_seconds(time.perf_counter() - t0)
            if tick is not None and tick.kappa is not None:
                self.metrics.kappa(tick.kappa)
            if tick is not None and tick.whatif is not None:
                self.metrics.whatif_verdict(tick.whatif.verdict)
                _log.debug("controller what-if: %s", tick.whatif.to_dict())
            if tick is not None and tick.ops:
                _log.info(
                    "controller: %s (utilization %.2f)",
                    ", ".join(map(str, tick.ops)),
                    tick.utilization,
                )
                for op in tick.ops:
                    self._spawn(self._run_op(op), f"transition-{op}")

    async def _run_op(self, op: planner.Op) -> None:
        try:
            commit = await self.reconfigure(op)
        except RouterError as e:
            _log.warning("transition %s not carried out: %s", op, e.message)
            return
        if self.controller is not None:
            more = self.controller.committed(
                op,
                commit.new_ids,
                [s.worker for s in commit.removed],
                self.core.running_remaining(self.now()),  # type: ignore[union-attr]
            )
            for nxt in more:
                self._spawn(self._run_op(nxt), f"transition-{nxt}")

    # -- transitions ------------------------------------------------------------------

    async def reconfigure(self, op: planner.Op) -> transition.Commit:
        """Carry out one split or merge end to end: drain, switch, commit."""
        assert self.pool is not None
        try:
            self.pool, t, actions = transition.begin(self.pool, op)
        except transition.TransitionError as e:
            raise RouterError(grpc.StatusCode.FAILED_PRECONDITION, str(e)) from None
        started = self.now()
        self.metrics.transition_started(t.kind)
        commit: transition.Commit | None = None
        drained_at = started
        switch_s = 0.0
        moved = 0
        while actions:
            action = actions.pop(0)
            if isinstance(action, transition.Drain):
                await asyncio.gather(*(self.drain(w) for w in action.workers))
                drained_at = self.now()
                for w in action.workers:
                    self.pool, more = transition.drained(self.pool, action.transition, w)
                    actions.extend(more)
            elif isinstance(action, transition.Switch):
                switch_s = await self._switch_engine(action)
                self.pool, more = transition.switched(self.pool, action.transition)
                actions.extend(more)
            else:
                commit = action
                moved = self._commit(action)
        assert commit is not None
        total = self.now() - started
        record = {
            "kind": commit.kind,
            "removed": [s.worker for s in commit.removed],
            "added": commit.new_ids,
            "epoch": commit.epoch,
            "started_s": started,
            "drain_s": drained_at - started,
            "switch_s": switch_s,
            "total_s": total,
            "composition": str(self.composition()),
            "reason": op.reason,
            "moved": moved,
        }
        self.transitions_done.append(record)
        self.metrics.transition_done(commit.kind, drained_at - started, switch_s, total)
        _log.info("transition %s committed: %s", record["kind"], record)
        return commit

    async def drain(
        self,
        worker: int,
        *,
        resume: bool = False,
        wait: bool = True,
        timeout_s: float | None = None,
    ) -> tuple[bool, int]:
        """Stop admitting at ``worker``, place its queue elsewhere, wait for its running
        prefill; then have its engine drain it too (a regroup needs that). Idempotent."""
        w = self.workers.get(worker)
        if w is None or self.core is None:
            raise RouterError(grpc.StatusCode.NOT_FOUND, f"worker {worker} is not in the pool")
        stub = self.endpoints.stub(w.address.address)
        if resume:
            # The engine first: until it admits again (an engine still starting, after
            # its pod was replaced), the worker stays drained and requests wait for it.
            try:
                await stub.Drain(worker_pb2.DrainRequest(resume=True), timeout=10.0)
            except grpc.aio.AioRpcError as e:
                raise RouterError(
                    grpc.StatusCode.UNAVAILABLE, f"worker {worker} did not resume: {e.details()}"
                ) from None
            w.draining = False
            self.core.set_available([worker], not w.unreachable)
            self._release_held()
            if not w.unreachable:
                self._rebalance(f"worker {worker} resumed")
            return False, 0
        w.draining = True
        self.core.set_available([worker], False)
        replaced = len(w.queue)
        self._withdraw_queue(worker)
        if not wait:
            return not w.at_worker(), replaced
        timeout = timeout_s or self.settings.drain_timeout_s
        try:
            await asyncio.wait_for(w.idle.wait(), timeout)
        except TimeoutError:
            raise RouterError(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"worker {worker} still runs a prefill after {timeout:.0f} s",
            ) from None
        try:
            await stub.Drain(worker_pb2.DrainRequest(), timeout=timeout)
        except grpc.aio.AioRpcError as e:
            if not w.unreachable:
                raise RouterError(
                    grpc.StatusCode.UNAVAILABLE, f"worker {worker} did not drain: {e.details()}"
                ) from None
        return True, replaced

    async def _switch_engine(self, action: transition.Switch) -> float:
        engine = self.engine_info[action.domain]
        started = time.perf_counter()
        try:
            reply = await self.endpoints.stub(engine.address).Epoch(
                grouping_request(action.epoch, action.grouping),
                timeout=self.settings.switch_timeout_s,
            )
        except grpc.aio.AioRpcError as e:
            raise RouterError(
                grpc.StatusCode.UNAVAILABLE,
                f"engine {engine.address} refused epoch {action.epoch}: {e.code().name}: {e.details()}",
            ) from None
        del reply
        return time.perf_counter() - started

    def _commit(self, commit: transition.Commit) -> int:
        """The new workers exist: move the KV metadata, swap the workers, release what
        waited, place the queues again; returns how many queued requests moved."""
        assert self.core is not None
        plan = self._reconcile_plan(commit)
        removal = self.core.remove_workers([s.worker for s in commit.removed])
        for s in commit.removed:
            w = self.workers.pop(s.worker)
            f = self.followers.pop(s.worker)
            self._spawn(f.stop(), f"unfollow-{s.worker}")
            for q in w.queue:  # nothing should be left; be safe
                self._place(q)
        for inv in removal.invalidations:
            self._invalidate(inv)
        engine = self.engine_info[commit.removed[0].domain]
        for s in commit.added:
            address = WorkerAddress(
                s, engine.rank_address(s.offset), engine.cache_blocks_per_rank * s.degree
            )
            self._add_worker(address, commit.epoch, engine.incarnation, resync_first=False)
            if self.settings.index_source == "workers":
                # The metadata moves (a replica that follows the store gets it from there).
                stored = [
                    (k, i, path[i - 1] if i else None)
                    for path in plan.prefixes[s.worker]
                    for i, k in enumerate(path)
                ]
                self.core.apply_cache_events(s.worker, stored)
            self.core.set_pending(s.worker, plan.pending[s.worker])
        self._release_held()
        moved = self._rebalance(f"epoch {commit.epoch}")
        self.metrics.snapshot(self)
        return moved

    def _rebalance(self, why: str) -> int:
        """Where capacity joined (a commit's new workers, a drained worker resumed),
        place every queued request again, oldest first (not the ones forwarded to a
        worker already): the queues built while that capacity was missing spread over
        it instead of waiting behind the workers they are at
        (:meth:`RoutingCore.withdraw_queues`). Returns how many moved."""
        assert self.core is not None
        members = {i: w for i, w in self.workers.items() if w.queue and not w.draining}
        if not members:
            return 0
        pending = {p.request.id: p for w in members.values() for p in w.queue}
        queues = {i: [p.request.id for p in w.queue] for i, w in members.items()}
        before = {rid: i for i, ids in queues.items() for rid in ids}
        for w in members.values():
            w.queue.clear()
        for r in placement_order(self.core.withdraw_queues(queues)):
            self._place(pending[r.id])
        moved = sum(
            1 for rid, p in pending.items() if p.decision and p.decision.worker != before[rid]
        )
        self.metrics.moved(moved)
        _log.info("%s: %d of %d queued requests placed on other workers", why, moved, len(pending))
        return moved

    def _reconcile_plan(self, commit: transition.Commit) -> ReconcilePlan:
        olds = [s.worker for s in commit.removed]
        prefixes = {w: self._prefixes_of(w) for w in olds}
        if commit.kind == "replace":
            # The failed worker's cache died with its engine: nothing moves.
            return ReconcilePlan({commit.added[0].worker: ()}, {commit.added[0].worker: {}})
        if commit.kind == "split":
            a, b = commit.added
            return plan_split(prefixes[olds[0]], (a.worker, b.worker), 1 << 30)
        assert self.core is not None
        return plan_merge(
            prefixes[olds[0]],
            prefixes[olds[1]],
            (olds[0], olds[1]),
            commit.added[0].worker,
            self.core.pending(olds[0]),
            self.core.pending(olds[1]),
        )

    def _prefixes_of(self, worker: int) -> list[tuple[int, ...]]:
        """The worker's cached prefixes as root→leaf chains, from the index (no recency is
        known here: shortest first, then by key, so the plan is deterministic)."""
        keys = set(self.store.worker_keys(worker))
        parents = {b.parent for k in keys if (b := self.store.block(k)) is not None}
        out = []
        for k in keys - parents:
            path = prefix_of(self.store, k)
            if path is not None and all(x in keys for x in path):
                out.append(path)
        out.sort(key=lambda p: (len(p), p[-1]))
        return out

    def _invalidate(self, inv: Invalidation) -> None:
        assert self.core is not None
        self.core.apply_cache_events(inv.worker, removed=list(inv.keys))

    async def switch(
        self, epoch: int, domain: int, grouping: Sequence[Slot], removed: Sequence[int], kind: str
    ) -> tuple[float, list[int]]:
        """An external controller's switch (the operator runs the state machine and
        has drained ``removed`` through :meth:`drain`): regroup ``domain`` under
        ``epoch`` at its engine and commit here. Idempotent: the epoch and grouping
        already in force succeed and change nothing."""
        assert self.pool is not None
        grouping = tuple(sorted(grouping, key=lambda s: s.offset))
        if epoch == self.pool.epoch and grouping == self.pool.layout.domain(domain):
            return 0.0, []
        if epoch <= self.pool.epoch:
            raise RouterError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"epoch {epoch} is not newer than the pool's epoch {self.pool.epoch}",
            )
        try:
            leaving = tuple(self.pool.layout.slot(w) for w in removed)
        except KeyError as e:
            raise RouterError(grpc.StatusCode.NOT_FOUND, f"removed: {e.args[0]}") from None
        added = tuple(s for s in grouping if s.worker not in self.workers)
        op: transition.Op
        if kind == "split" and len(leaving) == 1 and len(added) == 2:
            op = planner.Split(leaving[0].worker)
        elif kind == "merge" and len(leaving) == 2 and len(added) == 1:
            op = planner.Merge((leaving[0].worker, leaving[1].worker))
        elif (
            kind == "replace"
            and len(leaving) == 1
            and len(added) == 1
            and (added[0].degree, added[0].offset) == (leaving[0].degree, leaving[0].offset)
        ):
            op = transition.Replace(leaving[0].worker)
        else:
            raise RouterError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"grouping: not a {kind} of workers {sorted(removed)} (adds {[s.worker for s in added]})",
            )
        undrained = [
            w for w in removed if not self.workers[w].draining or not self.workers[w].idle.is_set()
        ]
        if undrained:
            raise RouterError(
                grpc.StatusCode.FAILED_PRECONDITION, f"workers {undrained} are not drained"
            )
        async with self._transition_lock:
            seconds = await self._switch_engine(
                transition.Switch(0, epoch, domain, grouping, tuple(removed), added)
            )
            slots = [s for s in self.pool.layout.slots if s.worker not in set(removed)] + list(
                added
            )
            slots.sort(key=lambda s: (s.domain, s.offset))
            self.pool = replace(
                self.pool,
                layout=Layout(tuple(slots), self.pool.layout.domain_size),
                epoch=epoch,
                next_worker=max(self.pool.next_worker, *(s.worker + 1 for s in added)),
            )
            self._commit(transition.Commit(0, epoch, kind, op, leaving, added))
        return seconds, [s.worker for s in added]
