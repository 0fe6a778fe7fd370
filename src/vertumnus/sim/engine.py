"""The discrete-event simulator: an event loop over the routing core, in simulated time.

A simulated pool is a set of workers, each a FIFO queue served by the
prefill-time model E_C (one prefill at a time per worker — a CP worker
spends all its ranks on one long prefill) with an LRU prefix cache
(:class:`~vertumnus.core.blockcache.BlockCache`). Every placement decision
and its bookkeeping belong to the routing core
(:class:`~vertumnus.core.routing.RoutingCore`), the same code the router
runs; this module only plays the workers and the clock:

1. on arrival, :meth:`RoutingCore.schedule` at ``now`` (q_w refreshed, the
   policy decides, Ê reserved) and the request joins the worker's queue;
2. when a worker frees up it starts its next request: the prefix actually
   cached *now* (it may have changed since placement) sets R and P, any
   pending blocks the decision asked to copy first are copied
   (``PoolConfig.reconcile_bandwidth_Bps``), the service time is E_C(R, P)
   and the cached blocks are touched; the core hears ``started``;
3. on completion the request's blocks enter the worker's cache, the cache
   events go to the core (the global prefix index), TTFT = finish − arrival
   + T_ext is recorded and the core hears ``finished``.

Anything else — a controller window, a cache-manager scan, a transition's
steps — is a callback scheduled with :meth:`Simulation.at`. Time is a float
in seconds; ties are broken by scheduling order, so runs are deterministic.

**Changing the pool while it runs** (the executor in
:mod:`vertumnus.sim.reconfig` drives these from the core's transition
actions; design.md section 5): :meth:`Simulation.drain` takes workers out of
the candidate set, places their queued requests again (arrival time kept, so
their TTFT includes the detour) and calls back once their running prefill is
done; :meth:`Simulation.remove_workers` / :meth:`Simulation.add_worker`
change the membership; :meth:`Simulation.commit_epoch` records the
composition and releases arrivals that were **held** because no worker was
available; :meth:`Simulation.rebalance` then places the pool's queues again,
so the new workers take their share of what queued meanwhile.

Invariant: every request is completed exactly once or rejected (no worker of
the pool could ever hold it); placing again and holding never lose one.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vertumnus.core.blockcache import BlockCache, CacheDelta
from vertumnus.core.costmodel import PrefillModel
from vertumnus.core.decision import RouteDecision
from vertumnus.core.metrics import Completion, SloRule
from vertumnus.core.policies.base import Policy
from vertumnus.core.routing import Invalidation, RoutingCore, placement_order
from vertumnus.core.types import Composition, Request, cached_tokens

if TYPE_CHECKING:
    from vertumnus.core.cachemanager import CacheManager


@dataclass(frozen=True)
class PoolConfig:
    """A simulated prefill pool."""

    composition: Composition
    model: PrefillModel
    block_size: int = 512
    """Tokens per cache block (the trace's block size)."""
    cache_blocks_per_gpu: int = 1000
    """Prefix-cache capacity per GPU, in blocks. The KV of a CP worker's
    cached prefixes is partitioned over its ranks, so a degree-C worker holds
    C times this. 1000 blocks of 512 tokens at 96 KiB/token is ~50 GB of an
    H200's 141 GB."""
    t_ext_s: float = 0.05
    """T_ext: seconds from prefill end to first token (KV transfer to decode,
    first decode step), a constant."""
    slo: SloRule = field(default_factory=SloRule)
    kv_bytes_per_token: int = 98304
    """KV bytes per token (Qwen3-30B-A3B: 48 layers x 4 KV heads x 128 x 2 x bf16)."""
    reconcile_bandwidth_Bps: float = 100e9
    """Bytes per second when a pending block's missing KV is copied between the
    ranks of one NVLink domain. H200 NVLink is 450 GB/s per direction per GPU;
    we take 100 GB/s effective for a small, latency-bound gather/scatter."""
    reconcile_latency_s: float = 0.001
    """Fixed cost of one reconciliation copy (setup, synchronization)."""

    def __post_init__(self) -> None:
        for deg in set(self.composition.degrees):
            if not self.model.supports(deg):
                raise ValueError(
                    f"profile {self.model.name!r} has no coefficients for degree {deg} "
                    f"(it covers {', '.join(map(str, self.model.degrees))})"
                )
        if self.block_size < 1:
            raise ValueError(f"block size must be >= 1, got {self.block_size}")
        if self.cache_blocks_per_gpu < 0:
            raise ValueError("cache blocks per GPU must be >= 0")
        if self.t_ext_s < 0:
            raise ValueError("T_ext must be >= 0")


@dataclass(slots=True)
class Job:
    request: Request
    decision: RouteDecision
    placed_s: float


@dataclass(eq=False)
class SimWorker:
    id: int
    degree: int
    cache: BlockCache
    queue: deque[Job] = field(default_factory=deque)
    running: Job | None = None
    finish_s: float = 0.0
    busy_s: float = 0.0
    epoch: int = 0
    """Configuration epoch the worker was created under."""


@dataclass(frozen=True, slots=True)
class Reconciliation:
    """Pending blocks copied (or found invalid) before a prefill that reused them."""

    t_s: float
    request_id: int
    worker: int
    copied_blocks: int
    """Blocks whose missing KV was copied before the prefill started."""
    dropped_blocks: int
    """Blocks dropped because no valid copy remained (recomputed: a miss)."""
    transfer_s: float


@dataclass
class SimResult:
    completions: list[Completion]
    busy_fraction: dict[int, float]
    """Per worker id: time busy / simulated span."""
    span_s: float
    rejected: list[int]
    """Ids of requests no worker could ever take (too long for every worker)."""
    reconfigurations: int = 0
    """Split/merge transitions carried out (adaptive pools)."""
    composition_timeline: list[tuple[float, str]] = field(default_factory=list)
    """(time, composition) at the start and after every reconfiguration."""


PlacementListener = Callable[[Request, RouteDecision, bool], None]
"""``fn(request, decision, first)``: ``first`` is False for a request placed again."""


class Simulation:
    """One run of one policy over one pool; ``core`` is its routing core (the policy's view)."""

    def __init__(
        self,
        pool: PoolConfig,
        policy: Policy,
        *,
        cache_manager: CacheManager | None = None,
        worker_ids: Sequence[int] | None = None,
    ) -> None:
        self.pool = pool
        self.policy = policy
        self.core = RoutingCore(policy, pool.model, pool.block_size, cache_manager=cache_manager)
        self.now = 0.0
        self.completions: list[Completion] = []
        self.rejected: list[int] = []
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._by_id: dict[int, SimWorker] = {}
        self.slo_degree = max(pool.model.degrees)
        self.epoch = 1
        self.reconfigurations = 0
        self.composition_timeline: list[tuple[float, str]] = [(0.0, str(pool.composition))]
        self.reconciliations: list[Reconciliation] = []
        self.invalidations: list[tuple[float, int, int]] = []
        """(time, worker, blocks dropped) each time pending blocks lost their only
        source (a miss for whoever reuses them next)."""
        self.membership_listeners: list[Callable[[list[int], list[int]], None]] = []
        """Called as ``fn(removed_ids, added_ids)`` at every epoch commit."""
        self.placement_listeners: list[PlacementListener] = []
        """Called after every placement, placements again of drained requests included."""
        self.start_listeners: list[Callable[[int, Request, int], None]] = []
        """Called as ``fn(worker, request, reused_blocks)`` when a prefill starts."""
        self.completion_listeners: list[Callable[[Completion], None]] = []
        """Called with every completion as it is recorded."""
        self.attachments: dict[str, Any] = {}
        """Shell components riding on this run (controller, executor, cache manager)."""
        self._held: deque[tuple[Request, bool]] = deque()
        self._retired: list[SimWorker] = []
        self._drain_waits: list[tuple[set[int], Callable[[], None]]] = []
        ids = list(worker_ids) if worker_ids is not None else list(range(pool.composition.workers))
        if len(ids) != pool.composition.workers:
            raise ValueError(f"{len(ids)} worker ids for {pool.composition.workers} workers")
        for wid, degree in zip(ids, pool.composition.degrees, strict=True):
            self.add_worker(wid, degree)

    # -- pool membership -------------------------------------------------------

    @property
    def model(self) -> PrefillModel:
        return self.pool.model

    def add_worker(self, wid: int, degree: int, cache: BlockCache | None = None) -> SimWorker:
        capacity = self.pool.cache_blocks_per_gpu * degree
        self.core.add_worker(wid, degree, capacity)
        worker = SimWorker(wid, degree, cache if cache is not None else BlockCache(capacity))
        self._by_id[wid] = worker
        return worker

    def worker(self, wid: int) -> SimWorker:
        return self._by_id[wid]

    def sim_workers(self) -> list[SimWorker]:
        return list(self._by_id.values())

    def running_remaining(self) -> dict[int, float]:
        """Worker id → seconds left of the prefill it is running (0: idle): what a
        drain of it would wait for."""
        now = self.now
        return {
            w.id: max(0.0, w.finish_s - now) if w.running is not None else 0.0
            for w in self._by_id.values()
        }

    def has_worker(self, wid: int) -> bool:
        return wid in self._by_id

    @property
    def composition(self) -> Composition:
        """The degrees of the workers in the pool now (available or not)."""
        return Composition(tuple(w.degree for w in self._by_id.values()))

    def remove_workers(self, wids: Sequence[int]) -> None:
        """Take idle, empty workers out of the pool; their blocks leave the index, and
        blocks elsewhere that only they could reconcile are dropped there."""
        workers = [self._by_id[w] for w in wids]
        for worker in workers:
            if worker.running is not None or worker.queue:
                raise RuntimeError(f"worker {worker.id} still has work; drain it first")
        removal = self.core.remove_workers(wids)
        for worker in workers:
            del self._by_id[worker.id]
            self._retired.append(worker)
        for inv in removal.invalidations:
            self._invalidate(inv)

    def _invalidate(self, inv: Invalidation) -> None:
        worker = self._by_id[inv.worker]
        dropped = 0
        for key in inv.keys:
            if key in worker.cache:
                delta = worker.cache.remove_subtree(key)
                dropped += len(delta.removed)
                self.apply_cache_delta(worker, delta)
        if dropped:
            self.invalidations.append((self.now, worker.id, dropped))

    # -- reconfiguration -------------------------------------------------------

    def drain(self, wids: Iterable[int], on_drained: Callable[[], None]) -> None:
        """Stop admitting at ``wids``, place their queue again, call back when they are idle.

        In-flight prefills finish where they are (under the old geometry).
        Requests placed again keep their arrival time; one that no other
        worker can take right now is held until the next epoch commit.
        """
        members = [self._by_id[w] for w in wids]
        self.core.set_available((w.id for w in members), False)
        for w in members:
            jobs = list(w.queue)
            w.queue.clear()
            for req in self.core.withdraw(w.id, [j.request.id for j in jobs]):
                if not self.submit(req, first=False):
                    self._held.append((req, False))
        busy = {w.id for w in members if w.running is not None}
        if busy:
            self._drain_waits.append((busy, on_drained))
        else:
            self.at(self.now, on_drained)

    def commit_epoch(self, removed: Sequence[int], added: Sequence[int]) -> None:
        """A reconfiguration is done: new epoch, timeline entry, held arrivals released."""
        self.epoch += 1
        self.reconfigurations += 1
        for wid in added:
            self._by_id[wid].epoch = self.epoch
        self.composition_timeline.append((self.now, str(self.composition)))
        for fn in self.membership_listeners:
            fn(list(removed), list(added))
        self.release_held()

    def rebalance(self) -> int:
        """Take back every queued request of the available workers and place them
        again, oldest first (:meth:`RoutingCore.withdraw_queues`): after a commit,
        the queues the old layout built spread over the new workers. Returns how
        many went to another worker."""
        members = [w for w in self._by_id.values() if w.queue and self.core.worker(w.id).available]
        queues = {w.id: [j.request.id for j in w.queue] for w in members}
        before = {rid: w for w, ids in queues.items() for rid in ids}
        for w in members:
            w.queue.clear()
        moved = 0
        for req in placement_order(self.core.withdraw_queues(queues)):
            if not self.submit(req, first=False):
                self._held.append((req, False))
            decision = self.core.decision(req.id)
            moved += decision is None or decision.worker != before[req.id]
        return moved

    def release_held(self) -> None:
        """Place arrivals held while no worker could take them."""
        held, self._held = self._held, deque()
        for req, first in held:
            if not self.submit(req, first):
                if self._reconfiguring():
                    self._held.append((req, first))
                else:
                    self.rejected.append(req.id)

    def _reconfiguring(self) -> bool:
        return any(not s.available for s in self.core.workers)

    # -- event scheduling ------------------------------------------------------

    def at(self, t: float, fn: Callable[[], None]) -> None:
        """Run ``fn`` at simulated time ``t`` (not before now)."""
        heapq.heappush(self._heap, (max(t, self.now), next(self._seq), fn))

    # -- request flow ----------------------------------------------------------

    def submit(self, request: Request, first: bool = True) -> bool:
        """Place ``request`` (a new arrival, or ``first=False`` a request placed again);
        False if no worker can take it now."""
        decision = self.core.schedule(request, self.now)
        if decision is None:
            return False
        worker = self._by_id[decision.worker]
        worker.queue.append(Job(request, decision, self.now))
        if worker.running is None:
            self._start_next(worker)
        for fn in self.placement_listeners:
            fn(request, decision, first)
        return True

    def _start_next(self, worker: SimWorker) -> None:
        if worker.running is not None or not worker.queue:
            return
        job = worker.queue.popleft()
        req = job.request
        matched = worker.cache.match(req.block_keys)
        transfer = 0.0
        if job.decision.copies and matched:
            matched, transfer = self._copy_pending(worker, job, matched)
        worker.cache.touch(req.block_keys, matched)
        for fn in self.start_listeners:
            fn(worker.id, req, matched)
        p = cached_tokens(matched, req.length, self.pool.block_size)
        service = transfer + self.pool.model.predict(worker.degree, req.length - p, p)
        worker.running = job
        worker.finish_s = self.now + service
        worker.busy_s += service
        self.core.started(req.id, self.now, worker.finish_s)
        self.at(worker.finish_s, lambda: self._finish(worker, job, p))

    def _copy_pending(self, worker: SimWorker, job: Job, matched: int) -> tuple[int, float]:
        """Carry out the decision's copies of pending blocks among the ``matched`` leading
        ones; returns the blocks that may be reused and the copy time.

        A copy whose source left the pool meanwhile cuts the reusable prefix at
        its first block, which is dropped from the cache with its descendants.
        """
        keys = job.request.block_keys
        position = {k: i for i, k in enumerate(keys[:matched])}
        copied = dropped = 0
        for copy in job.decision.copies:
            if copy.source != worker.id and copy.source not in self._by_id:
                first = min((position[k] for k in copy.blocks if k in position), default=None)
                if first is not None:
                    delta = worker.cache.remove_subtree(keys[first])
                    self.apply_cache_delta(worker, delta)
                    dropped += len(delta.removed)
                    matched = first
                    position = {k: i for k, i in position.items() if i < first}
        for copy in job.decision.copies:
            if copy.source == worker.id or copy.source in self._by_id:
                copied += sum(1 for k in copy.blocks if k in position)
        transfer = 0.0
        if copied:
            # Half of each block's KV is on the wrong ranks after a split or
            # merge (CP partitions a block's tokens over the worker's ranks).
            nbytes = copied * self.pool.block_size * self.pool.kv_bytes_per_token * 0.5
            transfer = self.pool.reconcile_latency_s + nbytes / self.pool.reconcile_bandwidth_Bps
        if copied or dropped:
            self.reconciliations.append(
                Reconciliation(self.now, job.request.id, worker.id, copied, dropped, transfer)
            )
        return matched, transfer

    def _finish(self, worker: SimWorker, job: Job, cached: int) -> None:
        req = job.request
        worker.running = None
        self.apply_cache_delta(worker, worker.cache.insert(req.block_keys))
        self.completions.append(
            Completion(
                request_id=req.id,
                arrival_s=req.arrival_s,
                length=req.length,
                cached_tokens=cached,
                ttft_s=self.now - req.arrival_s + self.pool.t_ext_s,
                worker=worker.id,
                degree=worker.degree,
                tau_s=self.pool.slo.tau(self.pool.model, req.length, self.slo_degree),
            )
        )
        for fn in self.completion_listeners:
            fn(self.completions[-1])
        self.core.finished(req.id)
        if self.core.worker(worker.id).available or worker.queue:
            self._start_next(worker)
        if worker.running is None and self._drain_waits:
            self._drained(worker)

    def _drained(self, worker: SimWorker) -> None:
        for i, (busy, fn) in enumerate(self._drain_waits):
            if worker.id in busy:
                busy.discard(worker.id)
                if not busy:
                    del self._drain_waits[i]
                    fn()
                return

    def apply_cache_delta(self, worker: SimWorker, delta: CacheDelta) -> None:
        self.core.apply_cache_events(
            worker.id, delta.stored, delta.removed, used_blocks=len(worker.cache)
        )

    # -- main loop -------------------------------------------------------------

    def run(
        self,
        requests: Iterable[Request],
        progress: Callable[[int], None] | None = None,
    ) -> SimResult:
        """Replay ``requests`` (sorted by arrival) to completion."""
        arrivals = iter(requests)
        nxt = next(arrivals, None)
        heap = self._heap
        done = 0
        while nxt is not None or heap:
            if nxt is not None and (not heap or nxt.arrival_s <= heap[0][0]):
                self.now = nxt.arrival_s
                if not self.submit(nxt):
                    # No candidate now: hold it if workers are mid-reconfiguration
                    # (they will be back), else no worker can ever take it.
                    if self._reconfiguring():
                        self._held.append((nxt, True))
                    else:
                        self.rejected.append(nxt.id)
                done += 1
                if progress is not None and done % 256 == 0:
                    progress(256)
                nxt = next(arrivals, None)
            else:
                t, _, fn = heapq.heappop(heap)
                self.now = t
                fn()
        if progress is not None:
            progress(done % 256)
        # Held requests can only remain if a reconfiguration never committed.
        self.rejected.extend(r.id for r, _ in self._held)
        self._held.clear()
        span = self.now if self.now > 0 else 1.0
        return SimResult(
            completions=self.completions,
            busy_fraction={w.id: w.busy_s / span for w in [*self._retired, *self._by_id.values()]},
            span_s=self.now,
            rejected=self.rejected,
            reconfigurations=self.reconfigurations,
            composition_timeline=list(self.composition_timeline),
        )
