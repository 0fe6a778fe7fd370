"""The composition planner: which mix of CP degrees the pool should run (design.md section 4).

This is the *planner* half of the planner/executor split (style.md,
LeaderWorkerSet): every function here is a pure function of its arguments —
no I/O, no clock, no module state. An executor (the simulator's
:mod:`vertumnus.sim.reconfig`, the operator's epoch transitions) carries out
what the planner returns and reports back with :func:`commit`.

Vocabulary:

- **domain**: an NVLink domain (a node), ``domain_size`` GPUs (8 by default).
  A worker never spans domains.
- **layout**: where each worker sits: ``(worker id, degree, domain, offset)``.
  Workers are buddy-aligned: a degree-C worker starts at an offset that is a
  multiple of C, so a degree-2C worker splits into two degree-C workers at
  offsets o and o+C, and two degree-C *buddies* (same domain, offsets o and
  o+C with o a multiple of 2C) merge into one degree-2C worker. These are the
  only topology-compatible operations; both preserve the GPU count.
- **lattice**: the compositions reachable this way for a GPU budget — every
  multiset of degrees that is a sum of per-domain buddy partitions.
- **capacity** κ_C: the largest demand a single degree-C worker sustains while
  meeting the TTFT SLO attainment target, measured by profiling
  (:mod:`vertumnus.sim.capacity`). We store it as a *rate*: seconds of
  predicted prefill work per second of wall time, so that a window of H
  seconds has capacity κ_C·H. A composition's capacity is K = Σ_w κ_{C_w}.
- **window** H_k: consecutive, non-overlapping observation windows. The
  window's **demand** D_k = Σ Ê of the requests that arrived in it, each at
  the worker it was placed on; its **utilization** is u_k = D_k / (H·K).

The controller (:func:`step`) compares u_k with two thresholds and watches
the long requests' share of the demand against the large-degree workers'
share of the capacity; a condition must persist for ``persist_windows``
windows before it acts (hysteresis), capacity wins when the two signals
disagree, and a merge is admitted only if the merged composition keeps
enough capacity for the observed demand. Among eligible operations it picks
the one with the smallest predicted drain time, then the least expected
KV-reconciliation traffic, then the lowest worker id (determinism).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from vertumnus.core.costmodel import PrefillModel
from vertumnus.core.placement import PlacementParams
from vertumnus.core.types import Composition

__all__ = [
    "CapacityProfile",
    "ControllerState",
    "HistoryRequest",
    "Layout",
    "Merge",
    "PlannerSettings",
    "Slot",
    "Split",
    "WindowObservation",
    "WorkerObservation",
    "commit",
    "domain_partitions",
    "eligible_merges",
    "eligible_splits",
    "enumerate_lattice",
    "initial_composition",
    "initial_state",
    "large_share",
    "layout_for",
    "neighbours",
    "step",
]


# ---------------------------------------------------------------------------
# Settings and profiles
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class PlannerSettings:
    """How the composition controller reads its windows. Defaults: docs/benchmarks/adaptive.md."""

    window_s: float = 30.0
    """H: length of one observation window, seconds."""
    upper: float = 0.9
    """Split when utilization u = D/(H·K) stays above this (0 < lower < upper)."""
    lower: float = 0.45
    """Merge when utilization stays below this."""
    merge_admit: float = 0.8
    """A merge is admitted only if utilization under the *merged* composition
    stays at or below this (≤ upper, so a merge never triggers a split back)."""
    persist_windows: int = 2
    """Consecutive windows a condition must hold before the controller acts."""
    follow_through: bool = True
    """Once a sustained change has been confirmed and acted on, a further step
    in the same direction needs one window, not ``persist_windows``, as long
    as every window since still asks for it: the persistence test guards
    against acting on noise, and this change has already passed it. One
    window that asks for anything else ends the follow-through."""
    long_threshold: int = 32768
    """A request longer than this many tokens counts as long."""
    mix_margin: float = 0.2
    """How far the long requests' share of the demand may drift from the
    largest-degree workers' share of the capacity before it counts as a
    substantial change of the long-request fraction (see :func:`step`)."""
    min_requests: int = 20
    """Windows with fewer requests give no long-fraction signal (too noisy)."""
    drain_tie_s: float = 0.25
    """Operations whose predicted drain times are within this many seconds of
    the shortest are ranked by KV-reconciliation traffic instead."""
    domain_size: int = 8
    """GPUs per NVLink domain (node); no worker spans two."""
    degrees: tuple[int, ...] = (4, 8)
    """Degrees the lattice may use; each must be in the prefill-time profile
    (the shell checks). Default CP4/CP8, the paper's 40-GPU lattice; the
    bundled profile also has CP1/CP2, which can be allowed here at the price
    of a larger lattice (286 compositions on 40 GPUs instead of 6)."""
    history_quantile: float = 0.9
    """Initial composition: the window demand of the history this quantile
    must fit under ``upper`` times the composition's capacity."""

    def __post_init__(self) -> None:
        if self.window_s <= 0:
            raise ValueError(f"window must be > 0 s, got {self.window_s}")
        if not 0 < self.lower < self.upper:
            raise ValueError(f"need 0 < lower < upper, got lower={self.lower} upper={self.upper}")
        if not self.merge_admit <= self.upper:
            raise ValueError(f"merge_admit ({self.merge_admit}) must be <= upper ({self.upper})")
        if self.persist_windows < 1:
            raise ValueError("persist_windows must be >= 1")
        if self.mix_margin <= 0:
            raise ValueError("mix_margin must be > 0")
        if not self.degrees or any(d < 1 or d > self.domain_size for d in self.degrees):
            raise ValueError(f"degrees {self.degrees} must lie in 1..{self.domain_size}")
        if not 0 < self.history_quantile <= 1:
            raise ValueError("history_quantile must be in (0, 1]")
        object.__setattr__(self, "degrees", tuple(sorted(set(self.degrees))))


@dataclass(frozen=True)
class CapacityProfile:
    """κ_C per degree, as seconds of predicted work per second (see module docstring)."""

    kappa_per_s: Mapping[int, float]
    """Degree → sustainable demand rate of one worker of that degree."""
    target_attainment: float = 0.9
    """The SLO attainment the profile was measured against."""

    def kappa(self, degree: int) -> float:
        try:
            return self.kappa_per_s[degree]
        except KeyError:
            raise ValueError(
                f"capacity profile has no degree {degree} (it covers {sorted(self.kappa_per_s)})"
            ) from None

    def capacity_per_s(self, degrees: Iterable[int]) -> float:
        """K of a composition (or any multiset of degrees), per second."""
        return sum(self.kappa(d) for d in degrees)


# ---------------------------------------------------------------------------
# Topology: layouts and the lattice
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Slot:
    """One worker's place: ``degree`` GPUs at ``offset`` in NVLink domain ``domain``."""

    worker: int
    degree: int
    domain: int
    offset: int


@dataclass(frozen=True)
class Layout:
    """Workers and where they sit; ``slots`` sorted by (domain, offset)."""

    slots: tuple[Slot, ...]
    domain_size: int = 8

    @property
    def composition(self) -> Composition:
        return Composition(tuple(s.degree for s in self.slots))

    def slot(self, worker: int) -> Slot:
        for s in self.slots:
            if s.worker == worker:
                return s
        raise KeyError(f"worker {worker} is not in the layout")


def _is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def layout_for(composition: Composition, domain_size: int = 8, first_id: int = 0) -> Layout:
    """Place ``composition`` buddy-aligned on ``ceil(gpus / domain_size)`` domains.

    Largest degrees first, each in the first aligned free range (first fit),
    so equal-degree workers end up as buddies wherever possible. Worker ids
    are ``first_id, first_id + 1, ...`` in ascending-degree order, the order
    :class:`~vertumnus.sim.engine.Simulation` creates them in. Raises
    ValueError if a degree is not a power of two no larger than a domain or
    the workers do not pack.
    """
    for d in set(composition.degrees):
        if not _is_pow2(d) or d > domain_size:
            raise ValueError(
                f"degree {d} is not a power of two <= the NVLink domain size {domain_size}"
            )
    n_domains = math.ceil(composition.gpus / domain_size)
    used = [[False] * domain_size for _ in range(n_domains)]
    placed: list[tuple[int, int, int]] = []  # (degree, domain, offset)
    for d in sorted(composition.degrees, reverse=True):
        for dom in range(n_domains):
            off = next((o for o in range(0, domain_size, d) if not any(used[dom][o : o + d])), None)
            if off is not None:
                for g in range(off, off + d):
                    used[dom][g] = True
                placed.append((d, dom, off))
                break
        else:
            raise ValueError(f"composition {composition} does not pack into {n_domains} domains")
    # Ids in ascending degree order (stable by position) to match the simulator.
    placed.sort(key=lambda p: (p[0], p[1], p[2]))
    slots = [Slot(first_id + i, d, dom, off) for i, (d, dom, off) in enumerate(placed)]
    slots.sort(key=lambda s: (s.domain, s.offset))
    return Layout(tuple(slots), domain_size)


def domain_partitions(domain_size: int, degrees: Sequence[int]) -> list[tuple[int, ...]]:
    """Every way to cut one domain into buddy-aligned workers of the given degrees.

    Recursively: a block of size s is either one worker (if s is an allowed
    degree) or two halves, each partitioned the same way. Returned as sorted
    degree tuples, without duplicates.
    """
    allowed = set(degrees)
    memo: dict[int, set[tuple[int, ...]]] = {}

    def parts(size: int) -> set[tuple[int, ...]]:
        if size in memo:
            return memo[size]
        out: set[tuple[int, ...]] = set()
        if size in allowed:
            out.add((size,))
        if size > 1 and size % 2 == 0:
            half = parts(size // 2)
            for a in half:
                for b in half:
                    out.add(tuple(sorted(a + b)))
        memo[size] = out
        return out

    return sorted(parts(domain_size))


def enumerate_lattice(gpus: int, degrees: Sequence[int], domain_size: int = 8) -> list[Composition]:
    """All compositions of ``gpus`` GPUs the split/merge operations can reach.

    ``gpus`` must be a whole number of domains. Each domain is cut
    independently (:func:`domain_partitions`); the pool's composition is the
    multiset union. Sorted by descending count of the largest degree, then the
    next (so more large-degree workers come first).
    """
    if gpus < 1 or gpus % domain_size:
        raise ValueError(f"{gpus} GPUs is not a whole number of {domain_size}-GPU domains")
    per_domain = domain_partitions(domain_size, degrees)
    if not per_domain:
        raise ValueError(f"degrees {tuple(degrees)} cannot tile a {domain_size}-GPU domain")
    combos: set[tuple[int, ...]] = {()}
    for _ in range(gpus // domain_size):
        combos = {tuple(sorted(c + p)) for c in combos for p in per_domain}
    return sorted((Composition(c) for c in combos), key=_large_first_key)


def _large_first_key(c: Composition) -> tuple[int, ...]:
    # Descending degrees, compared lexicographically with bigger first: negate.
    return tuple(-d for d in sorted(c.degrees, reverse=True))


def neighbours(
    composition: Composition, degrees: Sequence[int], domain_size: int = 8
) -> list[Composition]:
    """Compositions one split or merge away, at the multiset level.

    A split of a degree-2C worker is always topology-compatible; a merge of
    two degree-C workers is possible when the layout makes them buddies, which
    :func:`layout_for` guarantees whenever two same-degree workers share a
    domain. Used for the lattice's edges; the controller works on the layout.
    """
    allowed = set(degrees)
    out: set[Composition] = set()
    for d in sorted(set(composition.degrees)):
        if d % 2 == 0 and d // 2 in allowed:
            rest = list(composition.degrees)
            rest.remove(d)
            out.add(Composition(tuple(rest + [d // 2, d // 2])))
    layout = layout_for(composition, domain_size)
    for a, _ in _buddy_pairs(layout, allowed):
        rest = list(composition.degrees)
        rest.remove(a.degree)
        rest.remove(a.degree)
        out.add(Composition(tuple(rest + [2 * a.degree])))
    return sorted(out, key=_large_first_key)


def _buddy_pairs(layout: Layout, allowed: set[int]) -> list[tuple[Slot, Slot]]:
    by_pos = {(s.domain, s.offset): s for s in layout.slots}
    pairs = []
    for s in layout.slots:
        if (
            2 * s.degree in allowed
            and 2 * s.degree <= layout.domain_size
            and s.offset % (2 * s.degree) == 0
        ):
            other = by_pos.get((s.domain, s.offset + s.degree))
            if other is not None and other.degree == s.degree:
                pairs.append((s, other))
    return pairs


# ---------------------------------------------------------------------------
# Initial composition from history
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HistoryRequest:
    """One request of the historical workload, as the planner needs it."""

    arrival_s: float
    length: int
    cached_tokens: int = 0
    """Prefix tokens the shell expects to be reusable (0 = assume none)."""


def initial_composition(
    history: Sequence[HistoryRequest],
    candidates: Sequence[Composition],
    capacity: CapacityProfile,
    model: PrefillModel,
    settings: PlannerSettings,
    params: PlacementParams | None = None,
) -> Composition:
    """Pick the starting composition from a historical workload (design.md section 4).

    For each candidate X the history's window demand is computed as X would
    see it: every request at the degree of X it would prefer with no queue
    (placement cost without q_w, so the length distribution enters through
    Ê). X has *enough capacity* if the ``history_quantile`` window demand is at
    most ``upper · K_X · H``. Among those, the one with the most large-degree
    workers wins (order of :func:`enumerate_lattice`); if none has enough, the
    one with the largest capacity K.
    """
    if not candidates:
        raise ValueError("no candidate compositions")
    params = params or PlacementParams()
    h = settings.window_s
    if not history:
        return sorted(candidates, key=_large_first_key)[0]
    t0 = history[0].arrival_s
    n_windows = int((history[-1].arrival_s - t0) // h) + 1
    degree_set = sorted({d for c in candidates for d in c.degrees})
    est = {
        d: [model.predict(d, r.length - r.cached_tokens, r.cached_tokens) for r in history]
        for d in degree_set
    }
    windows = [int((r.arrival_s - t0) // h) for r in history]

    def fits(comp: Composition) -> tuple[bool, float]:
        degs = sorted(set(comp.degrees))
        c_min = degs[0]
        demand = [0.0] * n_windows
        for i, k in enumerate(windows):
            # Preferred degree: least (β + λ(C/C_min − 1))·Ê, ties to the smaller degree.
            best = min(
                degs,
                key=lambda d: ((params.beta + params.lam * (d / c_min - 1.0)) * est[d][i], d),
            )
            demand[k] += est[best][i]
        demand.sort()
        q = demand[min(n_windows - 1, math.ceil(settings.history_quantile * n_windows) - 1)]
        k_cap = capacity.capacity_per_s(comp.degrees)
        return q <= settings.upper * k_cap * h, k_cap

    ordered = sorted(candidates, key=_large_first_key)
    results = [(c, *fits(c)) for c in ordered]
    for comp, ok, _ in results:
        if ok:
            return comp
    return max(results, key=lambda r: r[2])[0]


# ---------------------------------------------------------------------------
# The per-window controller
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WorkerObservation:
    """What the shell reports about one worker at the end of a window."""

    worker: int
    running_remaining_s: float = 0.0
    """Seconds left of the prefill it is running (the drain time if it is drained now)."""
    reuse_weight: float = 0.0
    """Cached blocks reused here recently (access-weighted): the KV traffic a
    reconfiguration of this worker would make pending."""


@dataclass(frozen=True)
class WindowObservation:
    """One observation window, as measured by the shell."""

    demand_s: float
    """D_k: Σ Ê of the requests that arrived in the window, at their chosen workers."""
    requests: int
    long_requests: int
    long_demand_s: float = 0.0
    """Σ Ê of the window's long requests (the part of D_k they bring)."""
    workers: tuple[WorkerObservation, ...] = ()
    reconfiguring: bool = False
    """A transition is in progress: the controller observes but does not act."""

    @property
    def long_fraction(self) -> float:
        """Long requests per request (reported; the controller uses :attr:`long_share`)."""
        return self.long_requests / self.requests if self.requests else 0.0

    @property
    def long_share(self) -> float:
        """The long requests' share of the window's demand."""
        return self.long_demand_s / self.demand_s if self.demand_s > 0 else 0.0


@dataclass(frozen=True)
class Split:
    """Replace the degree-2C ``worker`` by two degree-C workers in the same place."""

    worker: int
    reason: str = ""


@dataclass(frozen=True)
class Merge:
    """Replace the buddy workers ``workers`` (same degree C) by one degree-2C worker."""

    workers: tuple[int, int]
    reason: str = ""


Decision = Split | Merge | None


@dataclass(frozen=True)
class ControllerState:
    """Everything the controller remembers between windows."""

    layout: Layout
    epoch: int = 0
    split_streak: int = 0
    """Consecutive windows that asked for a split."""
    merge_streak: int = 0
    """Consecutive windows that asked for a merge."""
    momentum: str | None = None
    """``"split"`` or ``"merge"`` while following through a confirmed change."""
    pending: Split | Merge | None = None
    """The decision handed to the executor and not yet committed."""
    history: tuple[str, ...] = field(default=(), compare=False)
    """Why each past decision was taken (for reports)."""


def initial_state(layout: Layout) -> ControllerState:
    return ControllerState(layout=layout)


def large_share(degrees: Iterable[int], capacity: CapacityProfile, large: int) -> float:
    """The share of a composition's capacity K held by workers of degree ``large`` or more."""
    degs = list(degrees)
    total = capacity.capacity_per_s(degs)
    return capacity.capacity_per_s(d for d in degs if d >= large) / total if total > 0 else 0.0


def eligible_splits(layout: Layout, settings: PlannerSettings) -> list[Split]:
    """Every split the lattice allows: a worker whose half-degree is allowed."""
    allowed = set(settings.degrees)
    return [Split(s.worker) for s in layout.slots if s.degree % 2 == 0 and s.degree // 2 in allowed]


def eligible_merges(layout: Layout, settings: PlannerSettings) -> list[Merge]:
    """Every merge the topology allows: buddy pairs whose double degree is allowed."""
    return [Merge((a.worker, b.worker)) for a, b in _buddy_pairs(layout, set(settings.degrees))]


def _rank(
    ops: Sequence[Split | Merge], obs: WindowObservation, settings: PlannerSettings
) -> Split | Merge | None:
    """Smallest predicted drain, then least reconciliation traffic, then lowest id."""
    if not ops:
        return None
    by_worker = {w.worker: w for w in obs.workers}

    def members(op: Split | Merge) -> tuple[int, ...]:
        return (op.worker,) if isinstance(op, Split) else op.workers

    def drain(op: Split | Merge) -> float:
        # Queued requests are re-placed elsewhere; only the running prefill is waited for.
        return max(
            (by_worker[w].running_remaining_s if w in by_worker else 0.0) for w in members(op)
        )

    def traffic(op: Split | Merge) -> float:
        return sum(by_worker[w].reuse_weight if w in by_worker else 0.0 for w in members(op))

    shortest = min(drain(op) for op in ops)
    near = [op for op in ops if drain(op) <= shortest + settings.drain_tie_s]
    return min(near, key=lambda op: (traffic(op), drain(op), min(members(op))))


def step(
    state: ControllerState,
    obs: WindowObservation,
    capacity: CapacityProfile,
    settings: PlannerSettings,
) -> tuple[ControllerState, Split | Merge | None]:
    """One window: the new state and the decision (None, a Split or a Merge).

    Signals, in order of precedence:

    1. **capacity**: u > ``upper`` asks for a split; u < ``lower`` for a merge;
    2. **long-request fraction** (only when u is between the thresholds, i.e.
       the demand is stable): the long requests' share of the demand, s_long,
       against the share of the capacity held by the largest-degree workers,
       c_large. s_long > c_large + ``mix_margin`` (long requests became more
       common than the composition caters for) asks for a merge;
       s_long < c_large − ``mix_margin`` asks for a split.

    Why shares rather than "the fraction rose since last time": the paper
    gives no formula; a reference taken from the composition itself gives
    the controller a fixed point (it stops once the mix matches the load),
    where a reference reset at every change drifts or stops after one step.
    Measuring the long part in Ê (not in requests) puts both sides in the
    same unit, the one capacity and demand are measured in.

    A request must repeat for ``persist_windows`` consecutive windows; any
    other window resets the streak (``follow_through``: after acting, one more
    window suffices for the next step the same way). A merge is admitted only if D/(H·K') ≤
    ``merge_admit`` for the merged capacity K' — otherwise the window counts
    as asking for nothing (capacity wins). While a transition is in
    progress (``obs.reconfiguring`` or an uncommitted decision) the
    controller only keeps its streaks at zero.
    """
    if obs.reconfiguring or state.pending is not None:
        return replace(state, split_streak=0, merge_streak=0), None

    h = settings.window_s
    degrees = [s.degree for s in state.layout.slots]
    k_cap = capacity.capacity_per_s(degrees)
    u = obs.demand_s / (h * k_cap) if k_cap > 0 else math.inf

    want: str | None = None
    reason = ""
    if u > settings.upper:
        want, reason = "split", f"utilization {u:.2f} > {settings.upper}"
    elif u < settings.lower:
        want, reason = "merge", f"utilization {u:.2f} < {settings.lower}"
    elif obs.requests >= settings.min_requests:
        s_long = obs.long_share
        c_large = large_share(degrees, capacity, max(settings.degrees))
        if s_long > c_large + settings.mix_margin:
            want, reason = "merge", f"long share {s_long:.2f} > large-degree share {c_large:.2f}"
        elif s_long < c_large - settings.mix_margin:
            want, reason = "split", f"long share {s_long:.2f} < large-degree share {c_large:.2f}"

    op: Split | Merge | None = None
    if want == "merge":
        # A merge of two degree-d workers changes K by κ_2d − 2κ_d (O(1) per candidate).
        degree_of = {s.worker: s.degree for s in state.layout.slots}
        admitted = []
        for m in eligible_merges(state.layout, settings):
            d = degree_of[m.workers[0]]
            k_after = k_cap - 2 * capacity.kappa(d) + capacity.kappa(2 * d)
            if obs.demand_s <= settings.merge_admit * h * k_after:
                admitted.append(m)
        if not admitted:
            want = None  # capacity wins: the merged pool could not carry this demand
        else:
            op = _rank(admitted, obs, settings)
    elif want == "split":
        op = _rank(eligible_splits(state.layout, settings), obs, settings)
        if op is None:
            want = None  # nothing left to split

    split_streak = state.split_streak + 1 if want == "split" else 0
    merge_streak = state.merge_streak + 1 if want == "merge" else 0
    momentum = state.momentum if want == state.momentum else None
    new = replace(state, split_streak=split_streak, merge_streak=merge_streak, momentum=momentum)
    needed = 1 if momentum is not None and settings.follow_through else settings.persist_windows
    if op is not None and max(split_streak, merge_streak) >= needed:
        op = replace(op, reason=reason)
        new = replace(
            new,
            split_streak=0,
            merge_streak=0,
            pending=op,
            momentum=want,
            history=state.history + (reason,),
        )
        return new, op
    return new, None


def commit(state: ControllerState, new_workers: Sequence[int]) -> ControllerState:
    """The executor carried out ``state.pending``; ``new_workers`` are the ids it created.

    A split creates two workers (the first takes the lower offset), a merge
    one. Returns the state under the next epoch with the layout updated.
    """
    op = state.pending
    if op is None:
        raise ValueError("no reconfiguration is pending")
    slots = list(state.layout.slots)
    if isinstance(op, Split):
        if len(new_workers) != 2:
            raise ValueError(f"a split creates two workers, got {list(new_workers)}")
        old = state.layout.slot(op.worker)
        half = old.degree // 2
        slots.remove(old)
        slots += [
            Slot(new_workers[0], half, old.domain, old.offset),
            Slot(new_workers[1], half, old.domain, old.offset + half),
        ]
    else:
        if len(new_workers) != 1:
            raise ValueError(f"a merge creates one worker, got {list(new_workers)}")
        a, b = (state.layout.slot(w) for w in op.workers)
        lo = a if a.offset < b.offset else b
        slots.remove(a)
        slots.remove(b)
        slots.append(Slot(new_workers[0], 2 * a.degree, lo.domain, lo.offset))
    slots.sort(key=lambda s: (s.domain, s.offset))
    return replace(
        state,
        layout=Layout(tuple(slots), state.layout.domain_size),
        epoch=state.epoch + 1,
        pending=None,
        split_streak=0,
        merge_streak=0,
    )
