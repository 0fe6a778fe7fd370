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
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

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

    @property
    def id(self) -> int:
        return self.state.id

    @property
    def degree(self) -> int:
        return self.state.degree


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
        matched = self.trie.matched_blocks(request.block_keys).get(worker.id, 0)
        p = cached_tokens(matched, request.length, self.pool.block_size)
        estimate = self.pool.model.predict(worker.degree, request.length - p, p)
        self.enqueue(worker, Job(request, estimate, decision.preferred_degree, self.now))
        self.policy.observe_placed(request, worker.id, self)
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
        worker.cache.touch(req.block_keys, matched)
        p = cached_tokens(matched, req.length, self.pool.block_size)
        service = self.pool.model.predict(worker.degree, req.length - p, p)
        worker.running = job
        worker.state.running = 1
        worker.finish_s = self.now + service
        worker.busy_s += service
        self.at(worker.finish_s, lambda: self._finish(worker, job, p))

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
        self._start_next(worker)

    def apply_cache_delta(self, worker: SimWorker, delta: CacheDelta) -> None:
        self.trie.apply(worker.id, delta.stored, delta.removed)
        worker.state.cache_used_blocks = len(worker.cache)

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
        span = self.now if self.now > 0 else 1.0
        return SimResult(
            completions=self.completions,
            busy_fraction={w.id: w.busy_s / span for w in self._by_id.values()},
            span_s=self.now,
            rejected=self.rejected,
            composition_timeline=[(0.0, str(self.pool.composition))],
        )
