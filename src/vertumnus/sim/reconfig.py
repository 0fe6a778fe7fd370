"""The reconfiguration executor for the simulator, and the ``vertumnus-adaptive`` pool.

The *executor* half of the planner/executor split (style.md): the pure
controller in :mod:`vertumnus.core.planner` says "split worker 7" or "merge
workers 2 and 3"; :class:`Executor` carries that out on a running
:class:`~vertumnus.sim.engine.Simulation` following design.md section 5:

1. **drain** — the participants leave the candidate set, their queued
   requests are re-placed on the other workers, in-flight prefills finish
   under the old geometry;
2. **switch** — ``switch_delay_s`` (default 0.5 s) during which the ranks
   activate the pre-created communication groups; the GPUs serve nothing;
3. **commit** — a new configuration epoch; the new workers join the pool and
   become schedulable; arrivals held meanwhile are placed.

**KV reconciliation is lazy.** Cached blocks stay resident; only their
metadata moves:

- *merge* of buddies A and B: the merged worker's prefix metadata is the
  union of A's and B's. A block both held is already complete on the merged
  ranks; a block only one held is **pending** — half of its KV (the other
  half of the ranks' share) must be copied on first reuse;
- *split* of P into children X and Y: P's retained prefixes (root→leaf paths
  in its cache) are dealt to the children, most recently used first, each to
  the child with the least demand assigned so far that still has room for
  it; every block becomes pending in its child, with the sibling's ranks as
  the source of the missing half. If the sibling is reconfigured again before
  the block is reused, no valid copy remains and the block is dropped (a miss).

The copy cost is modelled in the engine (``PoolConfig.reconcile_bandwidth_Bps``,
100 GB/s by default, plus 1 ms per copy).

:func:`build_adaptive` wires everything into one Simulation: the planner's
initial composition (from the first ``history_s`` seconds of the trace), the
controller ticking every window, the executor, cost-model placement.
"""

from __future__ import annotations

import functools
import math
import time  # only to measure the planner's own cost per decision
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from vertumnus.core import planner
from vertumnus.core.blockcache import BlockCache, CacheDelta
from vertumnus.core.costmodel import PrefillModel
from vertumnus.core.metrics import SloRule
from vertumnus.core.placement import PlacementParams
from vertumnus.core.policies.base import Policy
from vertumnus.core.policies.vertumnus import CostModelPolicy
from vertumnus.core.types import Composition, Request
from vertumnus.sim.engine import OWN_RANKS, PoolConfig, Simulation, SimWorker
from vertumnus.sim.traces import Trace

__all__ = [
    "AdaptiveController",
    "Executor",
    "ExecutorSettings",
    "Transition",
    "build_adaptive",
    "history_requests",
]


@dataclass(frozen=True)
class ExecutorSettings:
    """How the simulator carries out a split or merge."""

    switch_delay_s: float = 0.5
    """Seconds from the end of the drain to the commit (group switch, metadata update)."""

    def __post_init__(self) -> None:
        if self.switch_delay_s < 0:
            raise ValueError("switch delay must be >= 0 s")


@dataclass(frozen=True)
class Transition:
    """One split or merge as it happened."""

    kind: str
    """``split`` or ``merge``."""
    removed: tuple[int, ...]
    added: tuple[int, ...]
    started_s: float
    drained_s: float
    committed_s: float
    epoch: int
    composition: str
    """The pool's composition after the commit."""
    reason: str = ""

    @property
    def drain_s(self) -> float:
        return self.drained_s - self.started_s

    @property
    def total_s(self) -> float:
        return self.committed_s - self.started_s


def _paths(sim: Simulation, worker: SimWorker) -> list[tuple[int, ...]]:
    """The worker's cached prefixes as root→leaf key paths, least recently used first.

    Parents come from the global trie (every cached block is a node there).
    A block is a leaf of the worker's cache when no other cached block of
    that worker has it as parent.
    """
    keys = worker.cache.keys_lru_first()
    nodes = sim.trie.nodes
    has_child = set()
    for k in keys:
        parent = nodes[k].parent
        if parent is not None:
            has_child.add(parent.key)
    paths = []
    for k in keys:
        if k in has_child:
            continue
        path = []
        node = nodes.get(k)
        while node is not None:
            path.append(node.key)
            node = node.parent
        paths.append(tuple(reversed(path)))
    return paths


def _fill(cache: BlockCache, paths: Iterable[tuple[int, ...]]) -> CacheDelta:
    """Insert ``paths`` (least recent first, so recency survives) and collect what was stored."""
    total = CacheDelta()
    for p in paths:
        d = cache.insert(p)
        total.stored.extend(d.stored)
        total.removed.extend(d.removed)
    return total


class Executor:
    """Carries out planner operations on a Simulation, several at once if they are disjoint.

    Each operation drains only its own workers, switches and commits under
    its own configuration epoch; operations in flight together must not
    share a worker (the planner guarantees it; the executor checks).
    """

    def __init__(self, sim: Simulation, settings: ExecutorSettings | None = None) -> None:
        self.sim = sim
        self.settings = settings or ExecutorSettings()
        self._in_flight: dict[int, planner.Op] = {}
        """Worker id -> the operation it is taking part in."""
        self.transitions: list[Transition] = []
        self.max_in_flight = 0
        """The most operations that were ever in flight at once."""

    @property
    def busy(self) -> bool:
        """Some operation is in flight."""
        return bool(self._in_flight)

    @property
    def in_flight(self) -> int:
        """Operations in flight now."""
        return len({id(op) for op in self._in_flight.values()})

    def execute(
        self,
        op: planner.Split | planner.Merge,
        on_commit: Callable[[list[int]], None] | None = None,
    ) -> None:
        """Start ``op`` now; ``on_commit(new worker ids)`` runs at the commit."""
        members = [op.worker] if isinstance(op, planner.Split) else list(op.workers)
        for wid in members:
            if not self.sim.has_worker(wid):
                raise ValueError(f"worker {wid} is not in the pool")
            if wid in self._in_flight:
                raise RuntimeError(f"worker {wid} is already being reconfigured")
        if isinstance(op, planner.Merge):
            a, b = (self.sim.worker(w) for w in members)
            if a.degree != b.degree:
                raise ValueError(f"cannot merge degrees {a.degree} and {b.degree}")
        elif self.sim.worker(op.worker).degree % 2:
            raise ValueError(f"cannot split odd degree {self.sim.worker(op.worker).degree}")
        for wid in members:
            self._in_flight[wid] = op
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        started = self.sim.now

        def drained() -> None:
            t_drained = self.sim.now
            self.sim.at(
                t_drained + self.settings.switch_delay_s,
                lambda: self._commit(op, members, started, t_drained, on_commit),
            )

        self.sim.drain(members, drained)

    def _commit(
        self,
        op: planner.Split | planner.Merge,
        members: list[int],
        started: float,
        drained: float,
        on_commit: Callable[[list[int]], None] | None,
    ) -> None:
        sim = self.sim
        olds = [sim.worker(w) for w in members]
        if isinstance(op, planner.Split):
            added = self._split(olds[0])
        else:
            added = self._merge(olds[0], olds[1])
        sim.commit_epoch(members, added)
        for wid in members:
            del self._in_flight[wid]
        self.transitions.append(
            Transition(
                kind="split" if isinstance(op, planner.Split) else "merge",
                removed=tuple(members),
                added=tuple(added),
                started_s=started,
                drained_s=drained,
                committed_s=sim.now,
                epoch=sim.epoch,
                composition=str(sim.composition),
                reason=op.reason,
            )
        )
        if on_commit is not None:
            on_commit(added)

    def _split(self, parent: SimWorker) -> list[int]:
        sim = self.sim
        half = parent.degree // 2
        cap = sim.pool.cache_blocks_per_gpu * half
        paths = _paths(sim, parent)  # least recent first
        # Deal prefixes most recent first to the child with the least demand so
        # far that has room; a path's demand weight falls with its recency rank.
        assigned: list[list[tuple[int, ...]]] = [[], []]
        blocks: list[set[int]] = [set(), set()]
        demand = [0.0, 0.0]
        for rank, path in enumerate(reversed(paths)):
            order = sorted((0, 1), key=lambda c: (demand[c], c))
            for c in order:
                new = sum(1 for k in path if k not in blocks[c])
                if len(blocks[c]) + new <= cap:
                    assigned[c].append(path)
                    blocks[c].update(path)
                    demand[c] += 1.0 / (1 + rank)
                    break
        caches = [BlockCache(cap), BlockCache(cap)]
        deltas = [_fill(caches[c], reversed(assigned[c])) for c in (0, 1)]
        sim.remove_worker(parent.id)
        children = [sim.add_worker(half, caches[c]) for c in (0, 1)]
        for c in (0, 1):
            child, sibling = children[c], children[1 - c]
            sim.apply_cache_delta(child, deltas[c])
            # Every block's other half lives on the sibling's ranks.
            child.pending = {k: sibling.id for k in child.cache.keys_lru_first()}
        return [children[0].id, children[1].id]

    def _merge(self, a: SimWorker, b: SimWorker) -> list[int]:
        sim = self.sim
        degree = a.degree * 2
        cap = sim.pool.cache_blocks_per_gpu * degree
        pa, pb = _paths(sim, a), _paths(sim, b)
        in_a, in_b = set(a.cache.keys_lru_first()), set(b.cache.keys_lru_first())
        # Interleave the two recency orders so neither source's prefixes are
        # all older than the other's in the merged LRU.
        paths: list[tuple[int, ...]] = []
        for i in range(max(len(pa), len(pb))):
            if i < len(pa):
                paths.append(pa[i])
            if i < len(pb):
                paths.append(pb[i])
        cache = BlockCache(cap)
        delta = _fill(cache, paths)
        old_pending = {**a.pending, **b.pending}
        sources = {a.id, b.id}
        sim.remove_worker(a.id)
        sim.remove_worker(b.id)
        merged = sim.add_worker(degree, cache)
        sim.apply_cache_delta(merged, delta)
        pending: dict[int, int] = {}
        for k in cache.keys_lru_first():
            prior = old_pending.get(k)
            if prior is not None:
                # Still incomplete; if the missing half was on the buddy it is now our own.
                pending[k] = OWN_RANKS if prior in sources or prior == OWN_RANKS else prior
            elif not (k in in_a and k in in_b):
                # Held by one source only: its KV sits on half of the merged ranks.
                pending[k] = OWN_RANKS
        merged.pending = pending
        return [merged.id]


# ---------------------------------------------------------------------------
# The controller shell and the adaptive pool
# ---------------------------------------------------------------------------


class AdaptiveController:
    """Feeds the pure controller one observation per window and runs its decisions.

    After every commit it calls :func:`~vertumnus.core.planner.advance` and
    starts what that returns (the next operations of a multi-step transition).

    Windows are ``[k·H, (k+1)·H)``; a request counts in the window it arrived
    in, with the Ê of its first placement (re-placement after a drain does not
    count it twice). Ticks stop after ``horizon_s`` so the run can end.

    **Sliding windows** (``settings.hop_s`` < ``window_s``): the controller
    ticks every hop h (first at H), keeps per-hop buckets ``[j·h, (j+1)·h)``
    and hands the planner the window of the last H/h buckets, ``[t−H, t)``,
    with the newest bucket as the observation's ``fresh_*`` part. Recent
    reuse weights decay by 0.5^(h/H) per tick (halving per H, as before).
    """

    def __init__(
        self,
        sim: Simulation,
        state: planner.ControllerState,
        capacity: planner.CapacityProfile,
        settings: planner.PlannerSettings,
        executor: Executor,
        horizon_s: float,
    ) -> None:
        self.sim = sim
        self.state = state
        self.capacity = capacity
        self.settings = settings
        self.executor = executor
        self.horizon_s = horizon_s
        self.windows: list[dict[str, Any]] = []
        """Per window: end time, demand, utilization, long fraction, decision."""
        self.decision_cost_s: list[float] = []
        self.advance_cost_s: list[float] = []
        """Planner time per :func:`~vertumnus.core.planner.advance` call (after each commit)."""
        self._seen: set[int] = set()
        self._demand = 0.0
        self._requests = 0
        self._long = 0
        self._long_demand = 0.0
        self._buckets: deque[tuple[float, int, int, float]] = deque(maxlen=settings.hops_per_window)
        """The last H/h hops' (demand, requests, long requests, long demand), newest last."""
        sim.placement_listeners.append(self._placed)
        sim.at(settings.hop, self._tick)

    def _placed(self, request: Request, worker: SimWorker, estimate: float) -> None:
        if request.id in self._seen:
            return
        self._seen.add(request.id)
        self._demand += estimate
        self._requests += 1
        if request.length > self.settings.long_threshold:
            self._long += 1
            self._long_demand += estimate

    def observation(self) -> planner.WindowObservation:
        """The window ending now (the buckets closed so far plus the open hop) and the
        workers' state; with one hop per window, the open window itself."""
        now = self.sim.now
        workers = tuple(
            planner.WorkerObservation(
                worker=w.id,
                running_remaining_s=max(0.0, w.finish_s - now) if w.running is not None else 0.0,
                reuse_weight=w.reused_blocks,
            )
            for w in self.sim.sim_workers()
        )
        if self.settings.hops_per_window == 1:
            return planner.WindowObservation(
                demand_s=self._demand,
                requests=self._requests,
                long_requests=self._long,
                long_demand_s=self._long_demand,
                workers=workers,
                reconfiguring=self.executor.busy,
            )
        newest = (self._demand, self._requests, self._long, self._long_demand)
        older = list(self._buckets)[-(self.settings.hops_per_window - 1) :]
        parts = [*older, newest]
        return planner.WindowObservation(
            demand_s=math.fsum(b[0] for b in parts),
            requests=sum(b[1] for b in parts),
            long_requests=sum(b[2] for b in parts),
            long_demand_s=math.fsum(b[3] for b in parts),
            workers=workers,
            reconfiguring=self.executor.busy,
            fresh_demand_s=newest[0],
            fresh_long_requests=newest[2],
            fresh_long_demand_s=newest[3],
        )

    def _tick(self) -> None:
        if len(self._buckets) < self.settings.hops_per_window - 1:
            self._close_hop()  # the first window is not complete yet: nothing to evaluate
            return
        obs = self.observation()
        t0 = time.perf_counter()
        self.state, ops = planner.step(self.state, obs, self.capacity, self.settings)
        self.decision_cost_s.append(time.perf_counter() - t0)
        k_cap = self.capacity.capacity_per_s(s.degree for s in self.state.layout.slots)
        self.windows.append(
            {
                "end_s": self.sim.now,
                "demand_s": obs.demand_s,
                "utilization": obs.demand_s / (self.settings.window_s * k_cap),
                "requests": obs.requests,
                "long_fraction": obs.long_fraction,
                "long_share": obs.long_share,
                "decision": None if not ops else type(ops[0]).__name__.lower(),
                "operations": len(ops),
                "target": None if self.state.target is None else str(self.state.target),
            }
        )
        self._close_hop(ops)

    def _close_hop(self, ops: Sequence[planner.Op] = ()) -> None:
        """Close the open hop's bucket, decay reuse weights, start ``ops``, schedule the
        next tick (in the order the one-hop controller always used)."""
        self._buckets.append((self._demand, self._requests, self._long, self._long_demand))
        self._demand, self._requests, self._long, self._long_demand = 0.0, 0, 0, 0.0
        hop = self.settings.hop
        decay = 0.5 ** (hop / self.settings.window_s)  # "recent" access: halve per window
        for w in self.sim.sim_workers():
            w.reused_blocks *= decay
        self._start(ops)
        if self.sim.now + hop <= self.horizon_s:
            self.sim.at(self.sim.now + hop, self._tick)

    def _start(self, ops: Sequence[planner.Op]) -> None:
        for op in ops:
            self.executor.execute(op, functools.partial(self._committed, op))

    def _committed(self, op: planner.Op, added: list[int]) -> None:
        """One operation committed: record it, then ask for the next ones of its transition."""
        self.state = planner.commit(self.state, added, op)
        t0 = time.perf_counter()
        self.state, more = planner.advance(
            self.state, self.observation().workers, self.capacity, self.settings
        )
        self.advance_cost_s.append(time.perf_counter() - t0)
        self._start(more)


def history_requests(trace: Trace, history_s: float | None) -> list[planner.HistoryRequest]:
    """The planner's view of the first ``history_s`` seconds of ``trace`` (all of it if None).

    Cached tokens are estimated as an ideal global cache would see them
    (blocks seen earlier in the history), i.e. the reuse placement can at
    best achieve.
    """
    t_end = math.inf if history_s is None else trace.start_s + history_s
    seen: set[int] = set()
    out = []
    bs = trace.block_size
    for r in trace.requests:
        if r.arrival_s >= t_end:
            break
        n = 0
        for k in r.block_keys:
            if k not in seen:
                break
            n += 1
        seen.update(r.block_keys)
        cached = max(0, min(n * bs, r.length - 1))
        out.append(planner.HistoryRequest(r.arrival_s, r.length, cached))
    return out


@dataclass
class AdaptiveOptions:
    """Everything :func:`build_adaptive` takes besides the trace and the model."""

    gpus: int = 40
    """GPU budget: the lattice the planner chooses the initial composition from."""
    control: planner.PlannerSettings = field(default_factory=planner.PlannerSettings)
    """The composition controller's settings (window, thresholds, lattice degrees)."""
    executor: ExecutorSettings = field(default_factory=ExecutorSettings)
    """Switch delay."""
    placement: PlacementParams = field(default_factory=PlacementParams)
    """β and λ of cost-model placement."""
    capacity: planner.CapacityProfile | None = None
    """None: the profile's bundled capacity file."""
    history_s: float | None = 600.0
    """Seconds at the start of the trace used as history for the initial composition."""
    initial: Composition | None = None
    """Skip the history and start here (tests, experiments)."""
    cache_blocks_per_gpu: int = 1000
    """Prefix-cache capacity per GPU, in blocks (as :class:`PoolConfig`)."""
    t_ext_s: float = 0.05
    """T_ext added to every TTFT (as :class:`PoolConfig`)."""
    slo: SloRule = field(default_factory=SloRule)
    """The TTFT SLO rule for attainment (as :class:`PoolConfig`)."""


def build_adaptive(
    trace: Trace,
    model: PrefillModel,
    options: AdaptiveOptions | None = None,
    policy: Policy | None = None,
) -> Simulation:
    """A Simulation of the ``vertumnus-adaptive`` pool over ``trace``, ready to ``run``.

    The run's :class:`~vertumnus.sim.engine.SimResult` carries
    ``reconfigurations`` and ``composition_timeline``; the controller and the
    executor hang off the returned simulation as ``sim.attachments["controller"]`` and
    ``sim.attachments["executor"]`` (windows, transitions, decision costs).

    ``policy`` defaults to cost-model placement with ``options.placement``.
    **Cache-manager hook**: to run the adaptive pool with the global
    prefix-cache manager, pass
    ``policy=CacheManagedPolicy(CacheManager(settings), options.placement)``
    (:mod:`vertumnus.sim.cachesim`) and call ``attach_cache_manager(sim)`` on
    the result; the manager hears about workers leaving and joining through
    ``sim.membership_listeners``.
    """
    from vertumnus.sim.capacity import load_capacity

    opts = options or AdaptiveOptions()
    ps = opts.control
    for d in ps.degrees:
        if not model.supports(d):
            raise ValueError(f"planner degree {d} is not in profile {model.name!r}")
    capacity = opts.capacity or load_capacity(model.name)
    if opts.initial is not None:
        initial = opts.initial
    else:
        lattice = planner.enumerate_lattice(opts.gpus, ps.degrees, ps.domain_size)
        initial = planner.initial_composition(
            history_requests(trace, opts.history_s), lattice, capacity, model, ps, opts.placement
        )
    pool = PoolConfig(
        composition=initial,
        model=model,
        block_size=trace.block_size,
        cache_blocks_per_gpu=opts.cache_blocks_per_gpu,
        t_ext_s=opts.t_ext_s,
        slo=opts.slo,
    )
    sim = Simulation(pool, policy or CostModelPolicy(opts.placement))
    layout = planner.layout_for(initial, ps.domain_size)
    executor = Executor(sim, opts.executor)
    horizon = trace.requests[-1].arrival_s if trace.requests else 0.0
    controller = AdaptiveController(
        sim, planner.initial_state(layout), capacity, ps, executor, horizon
    )
    sim.attachments["controller"] = controller
    sim.attachments["executor"] = executor
    return sim


def transitions_report(transitions: Sequence[Transition]) -> list[dict[str, Any]]:
    """Transitions as JSON-ready dicts (for benchmark reports)."""
    return [
        {
            "kind": t.kind,
            "started_s": t.started_s,
            "drain_s": t.drain_s,
            "total_s": t.total_s,
            "epoch": t.epoch,
            "composition": t.composition,
            "reason": t.reason,
        }
        for t in transitions
    ]
