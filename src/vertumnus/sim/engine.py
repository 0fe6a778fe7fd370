"""The discrete-event simulator: a shell that runs the policy core on a trace.

A simulated pool is a set of workers, each a FIFO queue served by the
prefill-time model E_C (one prefill at a time per worker — a CP worker
spends all its ranks on one long prefill). The shell does what the router
does in a real deployment, with simulated time instead of a clock:

1. on arrival, refresh every worker's outstanding work q_w, ask the policy
   for a worker, **reserve** Ê there at once, queue the request;
2. when a worker frees up, start its next request: the prefix actually cached
   *now* (it may have changed since placement) sets R and P, the service time
   is E_C(R, P), and the cached blocks are touched;
3. on completion, the request's blocks enter the worker's LRU cache, the
   resulting cache events update the global prefix trie, and
   TTFT = finish − arrival + T_ext is recorded.

Policies see the pool through :class:`PoolView` (workers, model, exact
matched prefixes from the trie). Anything else — a controller window, a
cache-manager scan — is a callback scheduled with :meth:`Simulation.at`.
Time is a float in seconds; ties are broken by scheduling order, so runs are
deterministic.

**Changing the pool while it runs** (the executor in
:mod:`vertumnus.sim.reconfig` drives these; design.md section 5):

- :meth:`Simulation.drain` takes workers out of the candidate set, re-places
  their queued requests through the policy (arrival time kept, so their TTFT
  includes the detour) and calls back once their running prefill is done;
- :meth:`Simulation.remove_worker` / :meth:`Simulation.add_worker` change the
  membership; :meth:`Simulation.commit_epoch` bumps the configuration epoch,
  records the composition, releases arrivals that were **held** because no
  worker was available, and tells membership listeners (the cache manager);
- a worker's cached blocks may be **pending** reconciliation (its geometry
  changed under them): the first request that reuses one first copies the
  missing part of the block's KV at ``reconcile_bandwidth_Bps``, and the
  prefix only counts as cached once that copy is done. A pending block whose
  copy source is gone is dropped and its part of the prefix is recomputed.

Invariant: every request is completed exactly once or rejected (no worker of
the pool could ever hold it); re-placement and holding never lose one.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vertumnus.core.blockcache import BlockCache, CacheDelta
from vertumnus.core.costmodel import PrefillModel
from vertumnus.core.metrics import Completion, SloRule
from vertumnus.core.placement import WorkerState
from vertumnus.core.policies.base import Policy
from vertumnus.core.trie import PrefixTrie
from vertumnus.core.types import Composition, Request, cached_tokens


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
    estimate_s: float
    """Ê reserved at placement."""
    preferred_degree: int
    placed_s: float


@dataclass(eq=False)
class SimWorker:
    state: WorkerState
    cache: BlockCache
    queue: deque[Job] = field(default_factory=deque)
    running: Job | None = None
    finish_s: float = 0.0
    busy_s: float = 0.0
    queued_estimate_s: float = 0.0
    """Σ Ê of the queued jobs; q_w = this + the running job's remaining time."""
    epoch: int = 0
    """Configuration epoch the worker was created under."""
    pending: dict[int, int] = field(default_factory=dict)
    """Cached block key → worker whose ranks hold the rest of its KV
    (:data:`OWN_RANKS` when this worker's own ranks do), for blocks whose
    geometry changed and that are not yet reconciled."""
    reused_blocks: float = 0.0
    """Cached blocks reused here; the controller shell decays it per window."""

    @property
    def id(self) -> int:
        return self.state.id

    @property
    def degree(self) -> int:
        return self.state.degree


OWN_RANKS = -1
"""``SimWorker.pending`` source meaning: the missing KV is on this worker's own ranks."""


@dataclass(frozen=True, slots=True)
class Reconciliation:
    """A pending prefix reconciled (or found invalid) when a request first reused it."""

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


class Simulation:
    """One run of one policy over one pool. Implements ``PoolView`` for the policy."""

    def __init__(self, pool: PoolConfig, policy: Policy) -> None:
        self.pool = pool
        self.policy = policy
        self.now = 0.0
        self.trie = PrefixTrie()
        self.completions: list[Completion] = []
        self.rejected: list[int] = []
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._ids = itertools.count()
        self._by_id: dict[int, SimWorker] = {}
        self._states: list[WorkerState] = []
        self.slo_degree = max(pool.model.degrees)
        self.epoch = 0
        self.reconfigurations = 0
        self.composition_timeline: list[tuple[float, str]] = [(0.0, str(pool.composition))]
        self.reconciliations: list[Reconciliation] = []
        self.membership_listeners: list[Callable[[list[int], list[int]], None]] = []
        """Called as ``fn(removed_ids, added_ids)`` at every epoch commit."""
        self.placement_listeners: list[Callable[[Request, SimWorker, float], None]] = []
        """Called as ``fn(request, worker, Ê)`` after every placement, re-placements
        of drained requests included (a listener that counts arrivals dedupes by id)."""
        self.attachments: dict[str, Any] = {}
        """Shell components riding on this run (controller, executor, cache manager)."""
        self._held: deque[Request] = deque()
        self._retired: list[SimWorker] = []
        self._drain_waits: list[tuple[set[int], Callable[[], None]]] = []
        for degree in pool.composition.degrees:
            self.add_worker(degree)

    # -- PoolView --------------------------------------------------------------

    @property
    def workers(self) -> Sequence[WorkerState]:
        return self._states

    @property
    def model(self) -> PrefillModel:
        return self.pool.model

    @property
    def block_size(self) -> int:
        return self.pool.block_size

    def matched_blocks(self, request: Request) -> Mapping[int, int]:
        return self.trie.matched_blocks(request.block_keys)

    # -- pool membership -------------------------------------------------------

    def add_worker(self, degree: int, cache: BlockCache | None = None) -> SimWorker:
        wid = next(self._ids)
        capacity = self.pool.cache_blocks_per_gpu * degree
        state = WorkerState(id=wid, degree=degree, cache_capacity_blocks=capacity)
        worker = SimWorker(state=state, cache=cache if cache is not None else BlockCache(capacity))
        self._by_id[wid] = worker
        self._states.append(state)
        return worker

    def worker(self, wid: int) -> SimWorker:
        return self._by_id[wid]

    def sim_workers(self) -> list[SimWorker]:
        return list(self._by_id.values())

    def has_worker(self, wid: int) -> bool:
        return wid in self._by_id

    @property
    def composition(self) -> Composition:
        """The degrees of the workers in the pool now (available or not)."""
        return Composition(tuple(w.degree for w in self._by_id.values()))

    def remove_worker(self, wid: int) -> None:
        """Take an idle, empty worker out of the pool and forget its cache metadata."""
        worker = self._by_id[wid]
        if worker.running is not None or worker.queue:
            raise RuntimeError(f"worker {wid} still has work; drain it first")
        del self._by_id[wid]
        self._states.remove(worker.state)
        self._retired.append(worker)
        self.trie.drop_worker(wid)

    # -- reconfiguration -------------------------------------------------------

    def drain(self, wids: Iterable[int], on_drained: Callable[[], None]) -> None:
        """Stop admitting at ``wids``, re-place their queue, call back when they are idle.

        In-flight prefills finish where they are (under the old geometry).
        Re-placed requests keep their arrival time; if no other worker can
        take one right now it is held until the next epoch commit.
        """
        members = [self._by_id[w] for w in wids]
        for w in members:
            w.state.available = False
        for w in members:
            jobs = list(w.queue)
            w.queue.clear()
            w.queued_estimate_s = 0.0
            w.state.queued = 0
            for job in jobs:
                if not self.submit(job.request):
                    self._held.append(job.request)
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

    def release_held(self) -> None:
        """Place arrivals held while no worker could take them."""
        held, self._held = self._held, deque()
        for req in held:
            if not self.submit(req):
                if self._reconfiguring():
                    self._held.append(req)
                else:
                    self.rejected.append(req.id)

    def _reconfiguring(self) -> bool:
        return any(not s.available for s in self._states)

    # -- event scheduling ------------------------------------------------------

    def at(self, t: float, fn: Callable[[], None]) -> None:
        """Run ``fn`` at simulated time ``t`` (not before now)."""
        heapq.heappush(self._heap, (max(t, self.now), next(self._seq), fn))

    # -- request flow ----------------------------------------------------------

    def refresh_outstanding(self) -> None:
        """q_w = queued Ê + the running prefill's remaining time, at ``now``."""
        now = self.now
        for w in self._by_id.values():
            rest = w.finish_s - now if w.running is not None and w.finish_s > now else 0.0
            w.state.outstanding_s = w.queued_estimate_s + rest

    def submit(self, request: Request) -> bool:
        """Place ``request`` (a new arrival or a re-placed one); False if no worker can take it."""
        self.refresh_outstanding()
        decision = self.policy.decide(request, self)
        if decision is None:
            return False
        worker = self._by_id[decision.worker]
        if not worker.state.available:
            raise RuntimeError(f"policy {self.policy.name} chose unavailable worker {worker.id}")
        estimate = decision.estimate_s
        if estimate is None:
            matched = self.trie.matched_blocks(request.block_keys).get(worker.id, 0)
            p = cached_tokens(matched, request.length, self.pool.block_size)
            estimate = self.pool.model.predict(worker.degree, request.length - p, p)
        self.enqueue(worker, Job(request, estimate, decision.preferred_degree, self.now))
        self.policy.observe_placed(request, worker.id, self)
        for fn in self.placement_listeners:
            fn(request, worker, estimate)
        return True

    def enqueue(self, worker: SimWorker, job: Job) -> None:
        worker.queue.append(job)
        worker.queued_estimate_s += job.estimate_s
        worker.state.queued += 1
        worker.state.outstanding_s += job.estimate_s
        if worker.running is None:
            self._start_next(worker)

    def _start_next(self, worker: SimWorker) -> None:
        if worker.running is not None or not worker.queue:
            return
        job = worker.queue.popleft()
        worker.queued_estimate_s -= job.estimate_s
        worker.state.queued -= 1
        req = job.request
        matched = worker.cache.match(req.block_keys)
        transfer = 0.0
        if worker.pending and matched:
            matched, transfer = self._reconcile(worker, req, matched)
        worker.cache.touch(req.block_keys, matched)
        worker.reused_blocks += matched
        p = cached_tokens(matched, req.length, self.pool.block_size)
        service = transfer + self.pool.model.predict(worker.degree, req.length - p, p)
        worker.running = job
        worker.state.running = 1
        worker.finish_s = self.now + service
        worker.busy_s += service
        self.at(worker.finish_s, lambda: self._finish(worker, job, p))

    def _reconcile(self, worker: SimWorker, req: Request, matched: int) -> tuple[int, float]:
        """Install the pending blocks among the ``matched`` leading ones before they are used.

        Returns the blocks that may actually be reused and the copy time. A
        pending block whose source of KV left the pool cuts the reusable
        prefix there; it and its descendants are dropped from the cache.
        """
        pending = worker.pending
        keys = req.block_keys
        copied = dropped = 0
        for i in range(matched):
            src = pending.get(keys[i])
            if src is None:
                continue
            if src != OWN_RANKS and src not in self._by_id:
                delta = worker.cache.remove_subtree(keys[i])
                self.apply_cache_delta(worker, delta)
                dropped = len(delta.removed)
                matched = i
                break
            del pending[keys[i]]
            copied += 1
        transfer = 0.0
        if copied:
            # Half of each block's KV is on the wrong ranks after a split or
            # merge (CP partitions a block's tokens over the worker's ranks).
            nbytes = copied * self.pool.block_size * self.pool.kv_bytes_per_token * 0.5
            transfer = self.pool.reconcile_latency_s + nbytes / self.pool.reconcile_bandwidth_Bps
        if copied or dropped:
            self.reconciliations.append(
                Reconciliation(self.now, req.id, worker.id, copied, dropped, transfer)
            )
        return matched, transfer

    def _finish(self, worker: SimWorker, job: Job, cached: int) -> None:
        req = job.request
        worker.running = None
        worker.state.running = 0
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
        self.policy.observe_completed(req, worker.id)
        if worker.state.available or worker.queue:
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
        self.trie.apply(worker.id, delta.stored, delta.removed)
        worker.state.cache_used_blocks = len(worker.cache)
        if worker.pending:
            for key in delta.removed:
                worker.pending.pop(key, None)

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
                        self._held.append(nxt)
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
        self.rejected.extend(r.id for r in self._held)
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
