"""The simulator's executor of epoch transitions, its controller shell, and the ``vertumnus-adaptive`` pool.

The planner (:mod:`vertumnus.core.planner`) says "split worker 7"; the
transition state machine (:mod:`vertumnus.core.transition`) turns that into
actions; :class:`Executor` performs them on a running
:class:`~vertumnus.sim.engine.Simulation`, the way the router and the
operator perform them on a real pool:

1. :class:`~vertumnus.core.transition.Drain` — the participants leave the
   candidate set, their queued requests are placed again elsewhere, in-flight
   prefills finish under the old geometry;
2. :class:`~vertumnus.core.transition.Switch` — ``switch_delay_s`` (default
   0.5 s) during which the ranks activate their pre-created communication
   groups; the GPUs serve nothing;
3. :class:`~vertumnus.core.transition.Commit` — the old workers leave, the
   new ones join with the KV metadata the reconciliation plan gives them
   (:mod:`vertumnus.core.reconcile`: merged prefixes, prefixes dealt to the
   children of a split, pending blocks), and arrivals held meanwhile are
   placed. Pending blocks are copied when a placement first reuses them
   (the routing core's ``PendingCopy``), at the engine's modelled bandwidth.
   Then the pool's queues are placed again (``rebalance``), so the requests
   that queued at the old workers while the transition ran move to the new
   ones.

:class:`AdaptiveController` ticks the core's
:class:`~vertumnus.core.control.Controller` every hop and starts what it
decides; :func:`build_adaptive` wires everything into one Simulation.
"""

from __future__ import annotations

import functools
import gc  # only to tell the planner's own cost from the collector's
import time  # only to measure the planner's own cost per decision
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from vertumnus.core import planner, transition
from vertumnus.core.blockcache import BlockCache, CacheDelta
from vertumnus.core.control import Controller
from vertumnus.core.costmodel import PrefillModel
from vertumnus.core.decision import RouteDecision
from vertumnus.core.metrics import Completion, SloRule
from vertumnus.core.placement import PlacementParams
from vertumnus.core.reconcile import Prefix, ReconcilePlan, plan_merge, plan_split
from vertumnus.core.start import initial_composition
from vertumnus.core.types import Composition, Request
from vertumnus.sim.engine import PoolConfig, Simulation, SimWorker
from vertumnus.sim.traces import Trace

__all__ = [
    "AdaptiveController",
    "AdaptiveOptions",
    "Executor",
    "ExecutorSettings",
    "TransitionRecord",
    "build_adaptive",
    "transitions_report",
]


@dataclass(frozen=True)
class ExecutorSettings:
    """How the simulator carries out a split or merge."""

    switch_delay_s: float = 0.5
    """Seconds from the end of the drain to the commit (group switch, metadata update)."""
    rebalance: bool = True
    """At each commit, place the pool's queued requests again (oldest first), as the
    router does: without it they wait behind the workers they were queued at while
    the new ones idle (the behaviour before 2026-12-02, for comparison)."""

    def __post_init__(self) -> None:
        if self.switch_delay_s < 0:
            raise ValueError("switch delay must be >= 0 s")


@dataclass(frozen=True)
class TransitionRecord:
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
    moved: int = 0
    """Queued requests the commit placed on another worker (``rebalance``)."""

    @property
    def drain_s(self) -> float:
        return self.drained_s - self.started_s

    @property
    def total_s(self) -> float:
        return self.committed_s - self.started_s


def _fill(cache: BlockCache, prefixes: Sequence[Prefix]) -> CacheDelta:
    """Insert ``prefixes`` (least recent first, so recency survives) and collect what was stored."""
    total = CacheDelta()
    for p in prefixes:
        d = cache.insert(p)
        total.stored.extend(d.stored)
        total.removed.extend(d.removed)
    return total


class Executor:
    """Carries out planner operations on a Simulation through the transition state
    machine, several at once if they are disjoint."""

    def __init__(
        self,
        sim: Simulation,
        settings: ExecutorSettings | None = None,
        *,
        pool: transition.PoolState | None = None,
        domain_size: int = 8,
    ) -> None:
        self.sim = sim
        if pool is None:
            # The simulation's initial workers are layout_for's: ids 0..n-1 by degree.
            pool = transition.initial_pool(planner.layout_for(sim.pool.composition, domain_size))
        self.pool = pool
        """The transition state machine's state (grouping, epoch, transitions in flight)."""
        self.settings = settings or ExecutorSettings()
        self.transitions: list[TransitionRecord] = []
        self.max_in_flight = 0
        """The most operations that were ever in flight at once."""
        self._started: dict[int, float] = {}
        self._drained_at: dict[int, float] = {}
        self._on_commit: dict[int, Callable[[transition.Commit], None] | None] = {}

    @property
    def busy(self) -> bool:
        """Some operation is in flight."""
        return bool(self.pool.transitions)

    @property
    def in_flight(self) -> int:
        """Operations in flight now."""
        return len(self.pool.transitions)

    def execute(
        self, op: planner.Op, on_commit: Callable[[transition.Commit], None] | None = None
    ) -> transition.Transition:
        """Start ``op`` now; ``on_commit(commit)`` runs once it has committed."""
        self.pool, t, actions = transition.begin(self.pool, op)
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        self._started[t.id] = self.sim.now
        self._on_commit[t.id] = on_commit
        self._perform(actions)
        return t

    def _perform(self, actions: Sequence[transition.Action]) -> None:
        for action in actions:
            if isinstance(action, transition.Drain):
                self.sim.drain(action.workers, functools.partial(self._drained, action))
            elif isinstance(action, transition.Switch):
                self.sim.at(
                    self.sim.now + self.settings.switch_delay_s,
                    functools.partial(self._switched, action),
                )
            else:
                self._commit(action)

    def _drained(self, action: transition.Drain) -> None:
        self._drained_at[action.transition] = self.sim.now
        for w in action.workers:
            self.pool, more = transition.drained(self.pool, action.transition, w)
            self._perform(more)

    def _switched(self, action: transition.Switch) -> None:
        self.pool, more = transition.switched(self.pool, action.transition)
        self._perform(more)

    def _commit(self, commit: transition.Commit) -> None:
        sim = self.sim
        olds = [sim.worker(s.worker) for s in commit.removed]
        plan = self._plan(commit, olds)
        caches = {}
        deltas = {}
        for s in commit.added:
            cache = BlockCache(sim.pool.cache_blocks_per_gpu * s.degree)
            deltas[s.worker] = _fill(cache, plan.prefixes[s.worker])
            caches[s.worker] = cache
        sim.remove_workers([w.id for w in olds])
        for s in commit.added:
            worker = sim.add_worker(s.worker, s.degree, caches[s.worker])
            sim.apply_cache_delta(worker, deltas[s.worker])
            sim.core.set_pending(s.worker, plan.pending[s.worker])
        added = commit.new_ids
        sim.commit_epoch([w.id for w in olds], added)
        moved = sim.rebalance() if self.settings.rebalance else 0
        tid = commit.transition
        started = self._started.pop(tid)
        self.transitions.append(
            TransitionRecord(
                kind=commit.kind,
                removed=tuple(w.id for w in olds),
                added=tuple(added),
                started_s=started,
                drained_s=self._drained_at.pop(tid, started),
                committed_s=sim.now,
                epoch=commit.epoch,
                composition=str(sim.composition),
                reason=commit.op.reason,
                moved=moved,
            )
        )
        callback = self._on_commit.pop(tid)
        if callback is not None:
            callback(commit)

    def _plan(self, commit: transition.Commit, olds: list[SimWorker]) -> ReconcilePlan:
        """The reconciliation plan of ``commit`` from the old workers' caches."""
        if commit.kind == "split":
            a, b = commit.added
            cap = self.sim.pool.cache_blocks_per_gpu * a.degree
            return plan_split(olds[0].cache.prefixes(), (a.worker, b.worker), cap)
        x, y = olds
        core = self.sim.core
        return plan_merge(
            x.cache.prefixes(),
            y.cache.prefixes(),
            (x.id, y.id),
            commit.added[0].worker,
            core.pending(x.id),
            core.pending(y.id),
        )


# ---------------------------------------------------------------------------
# The controller shell and the adaptive pool
# ---------------------------------------------------------------------------


class AdaptiveController:
    """Ticks the core's :class:`~vertumnus.core.control.Controller` every hop and
    starts what it decides; after every commit it starts the next operations of a
    multi-step transition. Ticks stop after ``horizon_s`` so the run can end."""

    def __init__(
        self, sim: Simulation, controller: Controller, executor: Executor, horizon_s: float
    ) -> None:
        self.sim = sim
        self.controller = controller
        self.executor = executor
        self.horizon_s = horizon_s
        self.windows: list[dict[str, Any]] = []
        """Per window: end time, demand, utilization, long fraction, decision."""
        self.decision_cost_s: list[float] = []
        """CPU seconds per evaluated window (the process's, every thread's): a wall clock
        would also count the time other processes held the core (a benchmark runs two
        simulations on two cores)."""
        self.decision_met_gc: list[bool] = []
        """Per evaluated window: a full collection of Python's cyclic garbage collector
        ran during it. Such a collection walks the whole simulation (trace, index,
        completions) and costs the tick that triggers it up to ~0.3 s of CPU at 40 GPUs,
        which a controller outside the simulator does not carry."""
        self.advance_cost_s: list[float] = []
        """CPU seconds per commit (the next operations of a transition)."""
        sim.placement_listeners.append(self._placed)
        sim.start_listeners.append(self._started)
        sim.completion_listeners.append(self._completed)
        sim.at(controller.settings.hop, self._tick)

    @property
    def state(self) -> planner.ControllerState:
        return self.controller.state

    def own_decision_cost_s(self) -> list[float]:
        """``decision_cost_s`` without the ticks a full collection ran in
        (``decision_met_gc``): the controller's own cost, which the benchmarks report."""
        return [c for c, g in zip(self.decision_cost_s, self.decision_met_gc, strict=True) if not g]

    def _placed(self, request: Request, decision: RouteDecision, first: bool) -> None:
        if first:
            self.controller.placed(
                request, decision.worker, decision.estimate_s, decision.cached_tokens
            )

    def _completed(self, completion: Completion) -> None:
        self.controller.completed(completion.request_id, completion.ttft_s)

    def _started(self, worker: int, request: Request, reused_blocks: int) -> None:
        self.controller.windows.reused(worker, reused_blocks)

    def _tick(self) -> None:
        full_gcs = gc.get_stats()[-1]["collections"]
        t0 = time.process_time()
        tick = self.controller.tick(self.sim.running_remaining(), self.executor.busy)
        if tick is not None:
            self.decision_cost_s.append(time.process_time() - t0)
            self.decision_met_gc.append(gc.get_stats()[-1]["collections"] != full_gcs)
            obs = tick.observation
            self.windows.append(
                {
                    "end_s": self.sim.now,
                    "demand_s": obs.demand_s,
                    "utilization": tick.utilization,
                    "requests": obs.requests,
                    "long_fraction": obs.long_fraction,
                    "long_share": obs.long_share,
                    "decision": None if not tick.ops else type(tick.ops[0]).__name__.lower(),
                    "operations": len(tick.ops),
                    "target": tick.target,
                    "whatif": None if tick.whatif is None else tick.whatif.to_dict(),
                    # The shadows' comparisons, where there are shadows
                    # (PlannerSettings.shadow): without, the record is as before.
                    **({"shadow": [c.to_dict() for c in tick.shadow]} if tick.shadow else {}),
                    "kappa": None
                    if tick.kappa is None
                    else {str(d): k for d, k in tick.kappa.items()},
                }
            )
            self._start(tick.ops)
        hop = self.controller.settings.hop
        if self.sim.now + hop <= self.horizon_s:
            self.sim.at(self.sim.now + hop, self._tick)

    def _start(self, ops: Sequence[planner.Op]) -> None:
        for op in ops:
            self.executor.execute(op, self._committed)

    def _committed(self, commit: transition.Commit) -> None:
        # The simulator carries out the planner's operations only (no engine fails here).
        assert not isinstance(commit.op, transition.Replace)
        t0 = time.process_time()
        more = self.controller.committed(
            commit.op,
            commit.new_ids,
            [s.worker for s in commit.removed],
            self.sim.running_remaining(),
        )
        self.advance_cost_s.append(time.process_time() - t0)
        self._start(more)


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

    def pool(self, composition: Composition, model: PrefillModel, block_size: int) -> PoolConfig:
        """The simulated pool these options describe, starting at ``composition``."""
        return PoolConfig(
            composition=composition,
            model=model,
            block_size=block_size,
            cache_blocks_per_gpu=self.cache_blocks_per_gpu,
            t_ext_s=self.t_ext_s,
            slo=self.slo,
        )


def build_adaptive(
    trace: Trace,
    model: PrefillModel,
    options: AdaptiveOptions | None = None,
    make_sim: Callable[[PoolConfig], Simulation] | None = None,
) -> Simulation:
    """A Simulation of the ``vertumnus-adaptive`` pool over ``trace``, ready to ``run``.

    The run's :class:`~vertumnus.sim.engine.SimResult` carries
    ``reconfigurations`` and ``composition_timeline``; the controller and the
    executor hang off the returned simulation as ``sim.attachments["controller"]``
    and ``sim.attachments["executor"]`` (windows, transitions, decision costs).

    ``make_sim`` builds the Simulation for the initial pool (default: cost-model
    placement with ``options.placement``, no cache manager); the workers' ids
    must be those of ``layout_for(initial)``, i.e. 0..n−1 in ascending degree.
    """
    from vertumnus.core.policies.vertumnus import CostModelPolicy
    from vertumnus.profiles import load_capacity

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
        initial = initial_composition(
            trace.requests,
            trace.block_size,
            opts.history_s,
            lattice,
            capacity,
            model,
            ps,
            opts.placement,
        )
    pool = opts.pool(initial, model, trace.block_size)
    sim = (
        make_sim(pool)
        if make_sim is not None
        else Simulation(pool, CostModelPolicy(opts.placement))
    )
    layout = planner.layout_for(initial, ps.domain_size)
    executor = Executor(sim, opts.executor, pool=transition.initial_pool(layout))
    horizon = trace.requests[-1].arrival_s if trace.requests else 0.0
    controller = Controller(
        planner.initial_state(layout),
        capacity,
        ps,
        model,
        opts.placement,
        trace.block_size,
        opts.slo,
        cache_blocks_per_gpu=opts.cache_blocks_per_gpu,
    )
    sim.attachments["controller"] = AdaptiveController(sim, controller, executor, horizon)
    sim.attachments["executor"] = executor
    return sim


def transitions_report(transitions: Sequence[TransitionRecord]) -> list[dict[str, Any]]:
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
            "moved": t.moved,
        }
        for t in transitions
    ]
