"""The composition planner: which mix of CP degrees the pool should run (design.md section 4).

This is the *planner* half of the planner/executor split (style.md,
LeaderWorkerSet): every function here is a pure function of its arguments —
no I/O, no clock, no module state. An executor (the simulator's
:mod:`vertumnus.sim.reconfig`, the operator's epoch transitions) carries out
what the planner returns and reports back with :func:`commit`.

Vocabulary (the topology — domains, layouts, buddies, the lattice — lives in
:mod:`vertumnus.core.lattice`; its names are re-exported here):

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
  (``python -m vertumnus.sim.capacity``; read with
  :func:`vertumnus.profiles.load_capacity`). We store it as a *rate*: seconds of
  predicted prefill work per second of wall time, so that a window of H
  seconds has capacity κ_C·H. A composition's capacity is K = Σ_w κ_{C_w}.
- **window** H_k: observation windows of length H, evaluated every
  ``hop_s`` seconds (consecutive, non-overlapping windows by default,
  ``hop_s`` = H; with a shorter hop each evaluation reads the last H
  seconds, so consecutive windows overlap — sliding windows, as
  Kubernetes' HPA samples more often than its stabilization window). The
  window's **demand** D_k = Σ Ê of the requests that arrived in it, each at
  the worker it was placed on; its **utilization** is u_k = D_k / (H·K).
  The planner stays pure: the shell builds each window from per-hop buckets
  and also reports the part that is new since the previous evaluation (the
  newest hop, :class:`WindowObservation` ``fresh_*``), so that anything
  summed over a streak of overlapping windows counts each request once.

The controller (:func:`step`) compares u_k with two thresholds and watches
the long requests' share of the demand against the large-degree workers'
share of the capacity; a condition must persist for ``persist_windows``
windows before it acts (hysteresis) — and, where it reads the long share,
until the windows hold enough long requests to read it (``mix_evidence``;
docs/benchmarks/adaptive.md, "Thin windows") — capacity wins when the two signals
disagree *where capacity is a requirement* — overload (u above the upper
threshold splits whatever the mix) and merge admission (a merge is admitted
only if the merged composition keeps enough capacity for the observed
demand) — while a low utilization, which only makes merging worthwhile,
yields to a long share that asks for a split (``mix_below_lower``;
docs/benchmarks/adaptive.md, "Low utilization and the long share"). Among eligible operations it picks
the one with the smallest predicted drain time, then the least expected
KV-reconciliation traffic, then the lowest worker id (determinism).

**Multi-step transitions** (``PlannerSettings.multi_step``, on by default).
Once a change is confirmed, the controller does not stop after one operation
and wait for the next window: it picks a **target** — the lattice point the
same rules reach when the confirming windows' demand and long share are held
fixed (:func:`plan_target`; every step must be asked for by *every*
confirming window, so the target is only as far as all of them agree) — and
returns the operations toward it that can start now: ops on disjoint
workers, at most ``max_concurrent_ops`` in flight, and never so many that
the workers left serving would run above ``transition_admit`` utilization
of the confirming demand (one op alone is always allowed, as in the
one-step controller). After each commit the executor calls
:func:`advance`, which hands out the next operations toward the same
target, so a phase change costs seconds (drain + switch per op, chained)
instead of one window per step.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from vertumnus.core.costmodel import PrefillModel
from vertumnus.core.lattice import (
    Layout,
    Slot,
    buddy_pairs,
    domain_partitions,
    enumerate_lattice,
    large_first_key,
    layout_for,
    merge_slots,
    neighbours,
    split_slot,
)
from vertumnus.core.placement import PlacementParams
from vertumnus.core.plannersettings import PlannerSettings
from vertumnus.core.types import Composition

__all__ = [
    "CapacityProfile",
    "ControllerState",
    "HistoryRequest",
    "Layout",
    "Merge",
    "Op",
    "PathStep",
    "PlannerSettings",
    "Slot",
    "Split",
    "WindowObservation",
    "WorkerObservation",
    "advance",
    "commit",
    "distinct_time",
    "domain_partitions",
    "eligible_merges",
    "eligible_splits",
    "enumerate_lattice",
    "free_path",
    "initial_composition",
    "initial_state",
    "large_share",
    "layout_for",
    "min_long_requests",
    "neighbours",
    "plan_target",
    "pooled_share",
    "startable",
    "step",
    "walk",
]


# ---------------------------------------------------------------------------
# Capacity profiles
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class CapacityProfile:
    """κ_C per degree, as seconds of predicted work per second (see module docstring)."""

    kappa_per_s: Mapping[int, float]
    """Degree → sustainable demand rate of one worker of that degree."""
    target_attainment: float = 0.9
    """The SLO attainment the profile was measured against."""
    levels: Mapping[int, tuple[tuple[float, float], ...]] = field(default_factory=dict)
    """Degree → the measured (demand per s, attainment) points κ was read from
    (the capacity file's ``levels``; empty if it has none). The online
    correction of κ (:mod:`vertumnus.core.kappa`) fits their scale."""

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
        return sorted(candidates, key=large_first_key)[0]
    t0 = history[0].arrival_s
    n_windows = int((history[-1].arrival_s - t0) // h) + 1
    degree_set = sorted({d for c in candidates for d in c.degrees})
    est = {
        d: [model.predict(d, r.length - r.cached_tokens, r.cached_tokens) for r in history]
        for d in degree_set
    }
    windows = [int((r.arrival_s - t0) // h) for r in history]
    quantiles: dict[tuple[int, ...], float] = {}

    def quantile(degs: tuple[int, ...]) -> float:
        """The history's window demand at ``history_quantile`` on workers of ``degs``
        (it depends on the degrees present, not on their counts)."""
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
        return demand[min(n_windows - 1, math.ceil(settings.history_quantile * n_windows) - 1)]

    def fits(comp: Composition) -> tuple[bool, float]:
        degs = tuple(sorted(set(comp.degrees)))
        if degs not in quantiles:
            quantiles[degs] = quantile(degs)
        k_cap = capacity.capacity_per_s(comp.degrees)
        return quantiles[degs] <= settings.upper * k_cap * h, k_cap

    ordered = sorted(candidates, key=large_first_key)
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
    fresh_demand_s: float | None = None
    """Sliding windows (``hop_s`` < ``window_s``): the part of ``demand_s`` that
    arrived in the newest hop, i.e. not in the previous evaluation's window.
    None: the whole window is new (disjoint windows)."""
    fresh_long_requests: int | None = None
    """The long requests of the newest hop (None: ``long_requests``)."""
    fresh_long_demand_s: float | None = None
    """The long demand of the newest hop (None: ``long_demand_s``)."""

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


Op = Split | Merge


def _members(op: Op) -> tuple[int, ...]:
    return (op.worker,) if isinstance(op, Split) else op.workers


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
    pending: tuple[Op, ...] = ()
    """Operations handed to the executor and not yet committed (disjoint workers)."""
    confirming: tuple[WindowObservation, ...] = ()
    """The windows of the current streak (demand only, no worker detail), newest
    last: ``persist_windows`` of them, or (``mix_evidence``, a change that reads
    the long share) the shortest run of the streak's last windows that holds
    ``persist_windows`` windows and enough long requests — the whole streak
    until it does, at most :data:`EVIDENCE_WINDOWS_MAX` windows."""
    target: Composition | None = None
    """Where the transition in progress is heading (multi-step), else None."""
    plan: tuple[WindowObservation, ...] = ()
    """The windows that confirmed the transition in progress: :func:`advance`
    walks on with their demand."""
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
    return [Merge((a.worker, b.worker)) for a, b in buddy_pairs(layout, set(settings.degrees))]


#: A candidate operation of :func:`walk`: its rank key (traffic, drain,
#: lowest member; :func:`_candidate`) followed by its members (one worker: a
#: split; two buddies, lower offset first: a merge).
_Cand = tuple[float, float, int, tuple[int, ...]]


def _candidate(members: tuple[int, ...], by_worker: Mapping[int, WorkerObservation]) -> _Cand:
    """An operation on ``members`` with the key the controller ranks it by.

    Among eligible operations the one with the smallest predicted drain wins —
    queued requests are re-placed elsewhere, so only the running prefill is
    waited for — except that operations within ``drain_tie_s`` of the shortest
    drain are ranked by the least KV-reconciliation traffic, then the drain,
    then the lowest worker id (determinism). :func:`walk` applies the drain
    cut; the key is (traffic, drain, lowest member). Workers without an
    observation (not yet created) count as idle and cold.
    """
    # A plain loop: this runs for every worker of every walk (a few thousand times
    # per window on a 1,024-GPU pool), where generator expressions cost double.
    drain, traffic = -math.inf, 0.0
    for w in members:
        o = by_worker.get(w)
        if o is None:
            drain = max(drain, 0.0)
        else:
            drain = max(drain, o.running_remaining_s)
            traffic += o.reuse_weight
    return traffic, drain, min(members), members


def _signal(
    k_cap: float,
    k_large: float,
    load: WindowObservation,
    settings: PlannerSettings,
) -> tuple[str | None, str]:
    """What one window asks of a composition with capacity ``k_cap`` (``k_large`` of it
    in largest-degree workers): ``"split"``, ``"merge"`` or None, and why. See :func:`step`."""
    u = load.demand_s / (settings.window_s * k_cap) if k_cap > 0 else math.inf
    if u > settings.upper:
        return "split", f"utilization {u:.2f} > {settings.upper}"
    mix: str | None = None
    why = ""
    if load.requests >= settings.min_requests:
        s_long = load.long_share
        c_large = k_large / k_cap if k_cap > 0 else 0.0
        if s_long > c_large + settings.mix_margin:
            mix, why = "merge", f"long share {s_long:.2f} > large-degree share {c_large:.2f}"
        elif s_long < c_large - settings.mix_margin:
            mix, why = "split", f"long share {s_long:.2f} < large-degree share {c_large:.2f}"
    if u < settings.lower:
        if mix == "split" and settings.mix_below_lower:
            return "split", f"{why} (utilization {u:.2f} < {settings.lower})"
        return "merge", f"utilization {u:.2f} < {settings.lower}"
    return mix, why


def _reads_mix(k_cap: float, load: WindowObservation, settings: PlannerSettings) -> bool:
    """Whether what ``load`` asks of a composition with capacity ``k_cap`` depends on its
    long share: every request except a split for u > ``upper`` and (with ``mix_below_lower``
    off) a low-utilization merge, which capacity alone decides. See :func:`_signal`."""
    u = load.demand_s / (settings.window_s * k_cap) if k_cap > 0 else math.inf
    if u > settings.upper:
        return False
    return settings.mix_below_lower or u >= settings.lower


def min_long_requests(settings: PlannerSettings) -> int:
    """Long requests the long share must be read from (``mix_evidence``).

    The long share s = L/D is carried by the few long requests: with n of
    them (a Poisson count, the short demand many small terms), the delta
    method gives a standard error of about s(1 − s)/√n ≤ 1/(4√n). Asking it
    to be at most ``mix_margin``/2 — half the distance the controller counts
    as a substantial change of the mix — gives n ≥ 1/(4·``mix_margin``²).
    """
    return max(1, math.ceil(1.0 / (4.0 * settings.mix_margin**2) - 1e-9))


EVIDENCE_WINDOWS_MAX = 64
"""The most windows a streak that waits for long requests keeps (``mix_evidence``): 21
minutes of 20 s windows. A mix whose long requests are rarer than
:func:`min_long_requests` in that many windows is not read (the rules do not act on
it; the what-if check still can). Without the bound, a streak in a window without long
requests kept every window it lasted: a pool that served only short requests grew its
controller state by 4,320 windows a day, and with it the CPPool status the operator
writes (etcd refuses an object over 1.5 MB)."""


def _fresh(w: WindowObservation) -> tuple[float, int, float]:
    """Demand, long requests and long demand of the part of ``w`` that was not in the
    previous evaluation's window (all of it for disjoint windows)."""
    return (
        w.demand_s if w.fresh_demand_s is None else w.fresh_demand_s,
        w.long_requests if w.fresh_long_requests is None else w.fresh_long_requests,
        w.long_demand_s if w.fresh_long_demand_s is None else w.fresh_long_demand_s,
    )


def distinct_time(loads: Sequence[WindowObservation]) -> tuple[list[float], int, list[float]]:
    """Demand terms, long-request count and long-demand terms over the distinct time
    that consecutive windows ``loads`` cover: the first window whole, then only the
    newest hop of each later one, so overlapping windows count each request once."""
    if not loads:
        return [], 0, []
    parts = [(loads[0].demand_s, loads[0].long_requests, loads[0].long_demand_s)]
    parts += [_fresh(w) for w in loads[1:]]
    return [p[0] for p in parts], sum(p[1] for p in parts), [p[2] for p in parts]


def pooled_share(loads: Sequence[WindowObservation]) -> tuple[WindowObservation, ...]:
    """``loads`` with each window's long share replaced by the pooled share of all of them
    (Σ long demand / Σ demand over the distinct time they cover, :func:`distinct_time`);
    demand and request counts stay per window."""
    demand, _, long_demand = distinct_time(loads)
    total = math.fsum(demand)
    share = math.fsum(long_demand) / total if total > 0 else 0.0
    return tuple(replace(w, long_demand_s=share * w.demand_s) for w in loads)


def _capacities(
    degrees: Iterable[int], capacity: CapacityProfile, settings: PlannerSettings
) -> tuple[float, float]:
    """K and its largest-degree part, per second, of a multiset of degrees."""
    counts: dict[int, int] = {}
    for d in degrees:
        counts[d] = counts.get(d, 0) + 1
    return _capacities_of(counts, capacity, settings)


def _capacities_of(
    counts: Mapping[int, int], capacity: CapacityProfile, settings: PlannerSettings
) -> tuple[float, float]:
    """:func:`_capacities` from degree counts.

    A function of the multiset alone (``math.fsum`` is exactly rounded, so
    neither the workers' order nor the path that led to the composition
    changes the last bit): a walk that reaches a composition step by step and
    one that starts there see the same K, so a transition's target and the
    legs :func:`advance` plans toward it agree even where a threshold falls
    exactly on the boundary.
    """
    large = max(settings.degrees)
    parts = [(d, n * capacity.kappa(d)) for d, n in counts.items() if n]
    return math.fsum(k for _, k in parts), math.fsum(k for d, k in parts if d >= large)


def _merge_admitted(
    k_cap: float,
    k_large: float,
    degree: int,
    loads: Sequence[WindowObservation],
    capacity: CapacityProfile,
    settings: PlannerSettings,
) -> bool:
    """A merge of two degree-``degree`` workers (of a composition with capacity ``k_cap``,
    ``k_large`` of it in largest-degree workers) is admitted for every load.

    Capacity: D/(H·K') ≤ ``merge_admit`` for the merged capacity K'. With
    ``mix_below_lower``, a load whose merge request comes from low utilization
    (u < ``lower``; an efficiency preference) also needs the merged
    composition to stay at or below the long share's balance point:
    s_long ≥ c_large', the merged large-degree capacity share (the
    long-share analogue of ``merge_admit`` ≤ ``upper``). Merges the long
    share asks for (u between the thresholds) are admitted on capacity
    alone, as before.

    Why c_large' and not the split threshold c_large' − ``mix_margin``: a
    merge admitted right at the split threshold lands where the next window's
    noise asks for the split back (docs/benchmarks/adaptive.md, "Low
    utilization and the long share": the long share ≈ 0.30 sat at
    4xCP4+3xCP8's threshold 0.31 and the light Mooncake run moved between it
    and 6xCP4+2xCP8 33 times in an hour). Landing at or below the balance
    point means the long share must then fall a full ``mix_margin`` — the
    controller's own measure of a substantial change of the mix — before a
    split back is asked for: hysteresis of one margin, with no new
    parameter. Low utilization may move the pool toward large degrees only
    as far as the long share supports, never past it. (Half a margin,
    s_long ≥ c_large' − ``mix_margin``/2, was tried: the same mean TTFT,
    19 reconfigurations against this rule's 5 on the light Mooncake run.)
    """
    k_after = k_cap - 2 * capacity.kappa(degree) + capacity.kappa(2 * degree)
    h = settings.window_s
    if not all(w.demand_s <= settings.merge_admit * h * k_after for w in loads):
        return False
    if not settings.mix_below_lower or k_after <= 0:
        return True
    large = max(settings.degrees)
    c_after = (k_large + (capacity.kappa(2 * degree) if 2 * degree >= large else 0.0)) / k_after
    for w in loads:
        if (
            w.demand_s / (h * k_cap) < settings.lower  # as _signal computes u
            and w.requests >= settings.min_requests
            and w.long_share < c_after  # balance point, not the split threshold
        ):
            return False
    return True


def _apply(slots: Sequence[Slot], op: Op, new_ids: Sequence[int]) -> list[Slot]:
    """``slots`` after ``op``, the new workers taking ``new_ids`` (split: lower offset first)."""
    by_id = {s.worker: s for s in slots}
    out = [s for s in slots if s.worker not in _members(op)]
    if isinstance(op, Split):
        out += split_slot(by_id[op.worker], new_ids)
    else:
        out.append(merge_slots(by_id[op.workers[0]], by_id[op.workers[1]], new_ids[0]))
    out.sort(key=lambda s: (s.domain, s.offset))
    return out


class _Ranked:
    """Candidate operations of one bucket of :func:`walk`, in ranking order.

    The first enumeration is sorted twice, by the rank key and by drain;
    removal is lazy (``alive``) and entries removed at the front are skipped
    for good; the few candidates a walk creates later (on workers it creates)
    are kept aside in ``extra`` and scanned. Keys are unique (the lowest
    member id is), so the order is total and the members never compared.
    """

    __slots__ = ("alive", "by_drain", "by_key", "d_head", "extra", "k_head")

    def __init__(self, items: list[_Cand]) -> None:
        self.by_key = sorted(items)
        self.by_drain = sorted((c[1], c[2]) for c in items)
        self.alive = {c[2]: c for c in items}  # lowest member -> candidate
        self.extra: list[_Cand] = []
        self.k_head = 0
        self.d_head = 0

    def add(self, cand: _Cand) -> None:
        self.extra.append(cand)
        self.alive[cand[2]] = cand

    def shortest(self) -> float:
        """The shortest drain among the live candidates (there is one)."""
        alive, items = self.alive, self.by_drain
        while self.d_head < len(items) and items[self.d_head][1] not in alive:
            self.d_head += 1
        best = items[self.d_head][0] if self.d_head < len(items) else math.inf
        for c in self.extra:
            if c[1] < best and c[2] in alive:
                best = c[1]
        return best

    def best(self, cut: float) -> _Cand | None:
        """The best-ranked live candidate whose drain is at most ``cut``."""
        alive, items = self.alive, self.by_key
        while self.k_head < len(items) and items[self.k_head][2] not in alive:
            self.k_head += 1
        found = None
        for i in range(self.k_head, len(items)):
            c = items[i]
            if c[1] <= cut and c[2] in alive:
                found = c
                break
        for c in self.extra:
            if c[1] <= cut and c[2] in alive and (found is None or c[:3] < found[:3]):
                found = c
        return found


def _rank_of(c: _Cand) -> tuple[float, float, int]:
    return c[0], c[1], c[2]


def walk(
    layout: Layout,
    pending: Sequence[Op],
    loads: Sequence[WindowObservation],
    direction: str,
    capacity: CapacityProfile,
    settings: PlannerSettings,
    workers: Sequence[WorkerObservation],
    *,
    target: Composition | None = None,
    limit: int | None = None,
) -> tuple[list[Op], Composition]:
    """Follow the controller's rules from ``layout`` with ``loads`` held fixed.

    ``pending`` operations are applied first (their new workers get
    provisional, negative ids below every real one: they exist only for this
    lookahead). Each step takes one operation in ``direction`` while *every*
    load still asks for that direction at the composition reached so far
    (for a merge: among the merges admitted for every load), ranked as in
    :func:`_candidate`, operations on workers that exist now before those on
    workers still to be created. Stops where the rules stop asking, at
    ``target``, or after ``limit`` operations. Returns the operations in
    order and the composition they lead to.

    Incremental (:class:`_Walk`): the candidate operations of ``direction``
    are enumerated and keyed once; a step removes the ones its operation
    consumes and adds the few its new workers make possible (their halves,
    their new buddy), so a walk of n steps over W workers costs
    O(W + n·candidates) cheap comparisons instead of n full re-enumerations
    and re-sorts of the layout (``tests/planner/test_walk.py`` checks it
    against the full re-enumeration).
    """
    return _Walk(layout, pending, direction, settings, workers).run(
        loads, capacity, target=target, limit=limit
    )


class _Walk:
    """The state of one :func:`walk`: the layout as the walk changes it, and the
    candidate operations of its direction in ranked buckets."""

    def __init__(
        self,
        layout: Layout,
        pending: Sequence[Op],
        direction: str,
        settings: PlannerSettings,
        workers: Sequence[WorkerObservation],
    ) -> None:
        self.settings = settings
        self.splitting = direction == "split"
        self.direction = direction
        self.allowed = set(settings.degrees)
        self.domain_size = layout.domain_size
        self.by_worker = {w.worker: w for w in workers}
        self._next_id = min([0, *(s.worker for s in layout.slots)]) - 1
        slots: Sequence[Slot] = layout.slots
        for op in pending:
            slots = _apply(slots, op, self._fresh(2 if isinstance(op, Split) else 1))
        busy = {w for op in pending for w in _members(op)}
        self.real = {s.worker for s in layout.slots} - busy
        self.by_id = {s.worker: s for s in slots}
        self.at = {(s.domain, s.offset): s for s in slots}
        self.counts: dict[int, int] = {}
        for s in slots:
            self.counts[s.degree] = self.counts.get(s.degree, 0) + 1
        self.gpus = sum(s.degree for s in slots)
        self._enumerate(slots)

    def _fresh(self, n: int) -> list[int]:
        ids = [self._next_id - i for i in range(n)]
        self._next_id -= n
        return ids

    def candidate_of(self, s: Slot) -> tuple[int, ...] | None:
        """Members of the operation of the walk's direction that ``s`` takes part in, if any."""
        d = s.degree
        if self.splitting:
            return (s.worker,) if d % 2 == 0 and d // 2 in self.allowed else None
        if 2 * d not in self.allowed or 2 * d > self.domain_size:
            return None
        if s.offset % (2 * d) == 0:  # lower buddy: the pair is (s, next)
            other = self.at.get((s.domain, s.offset + d))
            if other is not None and other.degree == d:
                return s.worker, other.worker
        else:  # upper buddy: the pair is (previous, s)
            other = self.at.get((s.domain, s.offset - d))
            if other is not None and other.degree == d and other.offset % (2 * d) == 0:
                return other.worker, s.worker
        return None

    def _enumerate(self, slots: Sequence[Slot]) -> None:
        """The candidate operations, in buckets by (all members exist now, degree of
        the members), each ranked once (:class:`_Ranked`)."""
        first: dict[tuple[bool, int], list[_Cand]] = {}
        for s in slots:
            if not self.splitting and s.offset % (2 * s.degree):
                continue  # an upper buddy: its pair is enumerated with the lower one
            ms = self.candidate_of(s)
            if ms is not None:
                first.setdefault((all(w in self.real for w in ms), s.degree), []).append(
                    _candidate(ms, self.by_worker)
                )
        self.buckets = {b: _Ranked(items) for b, items in first.items()}
        self.where: dict[int, _Ranked] = {}  # member worker -> the bucket of its candidate
        for bucket in self.buckets.values():
            for c in bucket.by_key:
                for w in c[3]:
                    self.where[w] = bucket

    def run(
        self,
        loads: Sequence[WindowObservation],
        capacity: CapacityProfile,
        *,
        target: Composition | None,
        limit: int | None,
    ) -> tuple[list[Op], Composition]:
        goal = Counter(target.degrees) if target is not None else None
        ops: list[Op] = []
        for _ in range(self.gpus):
            if limit is not None and len(ops) >= limit:
                break
            if goal is not None and self.counts == goal:
                break
            chosen = self._choose(loads, capacity)
            if chosen is None:
                break
            ops.append(self._take(chosen))
        return ops, Composition(tuple(d for d, n in self.counts.items() for _ in range(n)))

    def _choose(
        self, loads: Sequence[WindowObservation], capacity: CapacityProfile
    ) -> _Cand | None:
        """The next operation, if every load still asks for the walk's direction here."""
        k_cap, k_large = _capacities_of(self.counts, capacity, self.settings)
        if any(_signal(k_cap, k_large, w, self.settings)[0] != self.direction for w in loads):
            return None
        live = [(b, c) for b, c in self.buckets.items() if c.alive]
        if not self.splitting:
            ok = {
                d: _merge_admitted(k_cap, k_large, d, loads, capacity, self.settings)
                for d in {b[1] for b, _ in live}
            }
            live = [(b, c) for b, c in live if ok[b[1]]]
        pool = [c for b, c in live if b[0]] or [c for _, c in live]
        if not pool:
            return None
        cut = min(c.shortest() for c in pool) + self.settings.drain_tie_s
        return min((c for c in (r.best(cut) for r in pool) if c is not None), key=_rank_of)

    def _take(self, chosen: _Cand) -> Op:
        """Carry out ``chosen`` on the walk's layout and update the candidates."""
        members = chosen[3]
        op: Op = Split(members[0]) if self.splitting else Merge((members[0], members[1]))
        gone = [self.by_id.pop(w) for w in members]
        for g in gone:
            self.where.pop(g.worker).alive.pop(chosen[2], None)
            del self.at[(g.domain, g.offset)]
        counts = self.counts
        d = gone[0].degree
        counts[d] -= len(gone)
        if not counts[d]:
            del counts[d]
        if isinstance(op, Split):
            made = list(split_slot(gone[0], self._fresh(2)))
        else:
            made = [merge_slots(gone[0], gone[1], self._fresh(1)[0])]
        for m in made:
            self.by_id[m.worker] = m
            self.at[(m.domain, m.offset)] = m
            counts[m.degree] = counts.get(m.degree, 0) + 1
        for m in made:
            ms = self.candidate_of(m)
            if ms is not None:
                b = (False, m.degree)  # on a worker still to be created
                if b not in self.buckets:
                    self.buckets[b] = _Ranked([])
                self.buckets[b].add(_candidate(ms, self.by_worker))
                for w in ms:
                    self.where[w] = self.buckets[b]
        return op


class _FreeWalk(_Walk):
    """A :class:`_Walk` that takes the best-ranked operation of its direction whatever
    the windows ask (the what-if check's paths, :func:`free_path`)."""

    def _choose(
        self, loads: Sequence[WindowObservation], capacity: CapacityProfile
    ) -> _Cand | None:
        live = [(b, c) for b, c in self.buckets.items() if c.alive]
        pool = [c for b, c in live if b[0]] or [c for _, c in live]
        if not pool:
            return None
        cut = min(c.shortest() for c in pool) + self.settings.drain_tie_s
        found = [c for c in (r.best(cut) for r in pool) if c is not None]
        return min(found, key=_rank_of) if found else None


@dataclass(frozen=True, slots=True)
class PathStep:
    """One operation of a :func:`free_path` and where it leaves the pool."""

    op: Op
    drain_s: float
    """The longest running prefill among its members (0 for workers still to be created)."""
    made: tuple[int, ...]
    """The degrees of the workers it creates."""
    counts: tuple[tuple[int, int], ...]
    """(degree, workers) after it, by degree: a step keeps these few numbers and
    builds its :attr:`composition` (a sorted tuple of every worker) only when asked."""
    made_ids: tuple[int, ...] = ()
    """The provisional ids of the workers it creates (negative; later steps' operations
    name them), in the order of :attr:`made`."""

    @property
    def composition(self) -> Composition:
        """The composition after it."""
        return Composition(tuple(d for d, n in self.counts for _ in range(n)))


def free_path(
    layout: Layout,
    pending: Sequence[Op],
    direction: str,
    settings: PlannerSettings,
    workers: Sequence[WorkerObservation],
    *,
    target: Composition | None = None,
    limit: int | None = None,
) -> list[PathStep]:
    """The operations of ``direction`` in the order the controller ranks them
    (:func:`_candidate`), ignoring what the windows ask: the paths the what-if
    check evaluates (:mod:`vertumnus.core.whatif`). Stops at ``target``, after
    ``limit`` operations, or when no operation is left."""
    w = _FreeWalk(layout, pending, direction, settings, workers)
    goal = Counter(target.degrees) if target is not None else None
    running = {o.worker: o.running_remaining_s for o in workers}
    steps: list[PathStep] = []
    for _ in range(w.gpus):
        if (limit is not None and len(steps) >= limit) or (goal is not None and w.counts == goal):
            break
        chosen = w._choose((), CapacityProfile({}))
        if chosen is None:
            break
        degree = w.by_id[chosen[3][0]].degree
        fresh = w._next_id
        op = w._take(chosen)
        made = (degree // 2, degree // 2) if isinstance(op, Split) else (2 * degree,)
        drain = max(running.get(m, 0.0) for m in chosen[3])
        made_ids = tuple(range(fresh, w._next_id, -1))  # as _fresh gave them
        steps.append(PathStep(op, drain, made, tuple(sorted(w.counts.items())), made_ids))
    return steps


def plan_target(
    layout: Layout,
    loads: Sequence[WindowObservation],
    direction: str,
    capacity: CapacityProfile,
    settings: PlannerSettings,
) -> Composition:
    """The lattice point the rules lead to from ``layout`` when ``loads`` stay as they are.

    One step at a time in ``direction`` (``"split"`` or ``"merge"``), each
    asked for by every load (capacity first, then the long share; merges only
    if admitted for every load), until the rules stop asking or no operation
    remains. This is the target of a multi-step transition.
    """
    return walk(layout, (), loads, direction, capacity, settings, ())[1]


def _startable(
    ops: Sequence[Op],
    layout: Layout,
    pending: Sequence[Op],
    loads: Sequence[WindowObservation],
    capacity: CapacityProfile,
    settings: PlannerSettings,
) -> tuple[Op, ...]:
    """The leading operations of ``ops`` that may start now, next to ``pending``.

    Only operations on workers that exist and are not already taking part;
    at most ``max_concurrent_ops`` in flight; and an operation joins others
    in flight only if the workers left serving keep the largest of ``loads``
    at or below ``transition_admit`` utilization (capacity precedence during
    the transition).
    """
    degree_of = {s.worker: s.degree for s in layout.slots}
    out = {w for op in pending for w in _members(op)}
    k_total = capacity.capacity_per_s(degree_of.values())
    d_max = max((w.demand_s for w in loads), default=0.0)
    chosen: list[Op] = []
    for op in ops:
        ms = _members(op)
        if any(w not in degree_of or w in out for w in ms):
            continue  # acts on a worker still to be created or already in flight
        if len(pending) + len(chosen) >= settings.max_concurrent_ops:
            break
        if pending or chosen:
            k_avail = k_total - capacity.capacity_per_s(degree_of[w] for w in out | set(ms))
            if k_avail <= 0 or d_max > settings.transition_admit * settings.window_s * k_avail:
                break
        chosen.append(op)
        out.update(ms)
    return tuple(chosen)


def startable(
    ops: Sequence[Op],
    layout: Layout,
    pending: Sequence[Op],
    capacity: CapacityProfile,
    settings: PlannerSettings,
) -> tuple[Op, ...]:
    """The leading operations of ``ops`` that may start now next to ``pending``: on
    workers that exist and are free, at most ``max_concurrent_ops`` in flight (a
    move the what-if check chose has its capacity cost estimated already)."""
    return _startable(ops, layout, pending, (), capacity, settings)


def step(
    state: ControllerState,
    obs: WindowObservation,
    capacity: CapacityProfile,
    settings: PlannerSettings,
) -> tuple[ControllerState, tuple[Op, ...]]:
    """One window: the new state and the operations to start now (empty: none).

    Signals, in order of precedence:

    1. **capacity**: u > ``upper`` asks for a split, whatever the mix;
    2. **long-request fraction**: the long requests' share of the demand,
       s_long, against the share of the capacity held by the largest-degree
       workers, c_large. s_long > c_large + ``mix_margin`` (long requests
       became more common than the composition caters for) asks for a merge;
       s_long < c_large − ``mix_margin`` asks for a split;
    3. **low utilization**: u < ``lower`` asks for a merge, unless the long
       share asks for a split (``mix_below_lower``; a low-utilization merge
       is an efficiency preference, not a capacity requirement, and with it
       off u < ``lower`` asks for a merge whatever the mix).

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
    as asking for nothing (capacity wins). A merge asked for by low
    utilization is, with ``mix_below_lower``, also admitted only if the
    merged composition's large-degree capacity share does not exceed the
    long share (s_long ≥ c_large', :func:`_merge_admitted`), so the
    low-utilization merges stop at the long share's balance point, a full
    ``mix_margin`` clear of a split back, instead of flapping around it.
    With ``mix_evidence``, a change that reads the long share is confirmed
    only once the streak's windows hold ⌈1/(4·``mix_margin``²)⌉ long requests
    (:func:`min_long_requests`; thin windows make the streak longer), and
    its target is planned with the streak's pooled long share
    (:func:`pooled_share`); a split for u > ``upper`` is not held back.
    While a transition is in
    progress (``obs.reconfiguring`` or uncommitted operations) the
    controller only keeps its streaks at zero.

    Once a change is confirmed: with ``multi_step`` off, the best-ranked
    operation (one); with it on, the target is where the rules lead with the
    streak's windows held fixed (:func:`plan_target`), and the result is every
    operation toward it that may start now (:func:`_startable`); the
    executor reports each commit with :func:`commit` and asks for the next
    ones with :func:`advance`.
    """
    if obs.reconfiguring or state.pending:
        return replace(state, split_streak=0, merge_streak=0, confirming=()), ()
    if state.target is not None or state.plan:
        # A transition nobody advanced (an executor without :func:`advance`): over.
        state = replace(state, target=None, plan=())
    k_cap, k_large = _capacities((s.degree for s in state.layout.slots), capacity, settings)
    want, reason = _wanted(state.layout, obs, k_cap, k_large, capacity, settings)
    new, confirmed, gated = _confirm(state, obs, want, k_cap, settings)
    if not confirmed or want is None:
        return new, ()
    ops, target, loads, why = _decide(
        state, new.confirming, obs, want, reason, gated, capacity, settings
    )
    if not ops:
        return new, ()  # not every confirming window admits the first step yet
    ops = tuple(replace(op, reason=why) for op in ops)
    new = replace(
        new,
        split_streak=0,
        merge_streak=0,
        confirming=(),
        pending=ops,
        momentum=want,
        target=target if settings.multi_step else None,
        plan=loads if settings.multi_step else (),
        history=state.history + (why,),
    )
    return new, ops


def _wanted(
    layout: Layout,
    obs: WindowObservation,
    k_cap: float,
    k_large: float,
    capacity: CapacityProfile,
    settings: PlannerSettings,
) -> tuple[str | None, str]:
    """What this window asks for (``"split"``, ``"merge"`` or None) and why, once the
    topology and merge admission have had their say."""
    want, reason = _signal(k_cap, k_large, obs, settings)
    if want == "merge":
        allowed = set(settings.degrees)
        if not any(
            _merge_admitted(k_cap, k_large, a.degree, (obs,), capacity, settings)
            for a, _ in buddy_pairs(layout, allowed)
        ):
            want = None  # capacity wins: the merged pool could not carry this demand
    elif want == "split" and not eligible_splits(layout, settings):
        want = None  # nothing left to split
    return want, reason


def _confirm(
    state: ControllerState,
    obs: WindowObservation,
    want: str | None,
    k_cap: float,
    settings: PlannerSettings,
) -> tuple[ControllerState, bool, bool]:
    """Hysteresis: the state with this window added to the streaks, whether the change
    ``want`` is confirmed now, and whether it reads the long share (``mix_evidence``)."""
    load = WindowObservation(
        obs.demand_s,
        obs.requests,
        obs.long_requests,
        obs.long_demand_s,
        fresh_demand_s=obs.fresh_demand_s,
        fresh_long_requests=obs.fresh_long_requests,
        fresh_long_demand_s=obs.fresh_long_demand_s,
    )
    split_streak = state.split_streak + 1 if want == "split" else 0
    merge_streak = state.merge_streak + 1 if want == "merge" else 0
    streak = max(split_streak, merge_streak)
    confirming = (
        (state.confirming + (load,))[-min(streak, settings.persist_windows) :] if streak else ()
    )
    gated = settings.mix_evidence and want is not None and _reads_mix(k_cap, obs, settings)
    evidence = True
    if gated:
        # Keep the shortest suffix of the streak that holds persist_windows windows
        # and enough long requests; the change is confirmed only once it does.
        n_min = min_long_requests(settings)
        window = (state.confirming + (load,))[-min(streak, EVIDENCE_WINDOWS_MAX) :]
        # Long requests are counted over the distinct time the windows cover
        # (sliding windows overlap: each request once, :func:`distinct_time`).
        while len(window) > settings.persist_windows and distinct_time(window[1:])[1] >= n_min:
            window = window[1:]
        confirming = window
        evidence = distinct_time(window)[1] >= n_min
    momentum = state.momentum if want == state.momentum else None
    new = replace(
        state,
        split_streak=split_streak,
        merge_streak=merge_streak,
        momentum=momentum,
        confirming=confirming,
    )
    needed = 1 if momentum is not None and settings.follow_through else settings.persist_windows
    return new, want is not None and streak >= needed and evidence, gated


def _decide(
    state: ControllerState,
    confirming: tuple[WindowObservation, ...],
    obs: WindowObservation,
    want: str,
    reason: str,
    gated: bool,
    capacity: CapacityProfile,
    settings: PlannerSettings,
) -> tuple[tuple[Op, ...], Composition, tuple[WindowObservation, ...], str]:
    """A confirmed change: the operations to start now, the target, the loads the
    transition is planned with, and why."""
    if settings.multi_step:
        loads = pooled_share(confirming) if gated else confirming
        path, target = walk(
            state.layout, (), loads, want, capacity, settings, obs.workers, limit=settings.max_walk
        )
        return (
            _startable(path, state.layout, (), loads, capacity, settings),
            target,
            loads,
            (f"{reason}; target {target}"),
        )
    loads = pooled_share(confirming) if gated else confirming[-1:]
    path, target = walk(state.layout, (), loads, want, capacity, settings, obs.workers, limit=1)
    return tuple(path), target, loads, reason


def advance(
    state: ControllerState,
    workers: Sequence[WorkerObservation],
    capacity: CapacityProfile,
    settings: PlannerSettings,
) -> tuple[ControllerState, tuple[Op, ...]]:
    """After a commit: the next operations of the transition in progress (empty: none now).

    Walks on from the current layout (operations still in flight applied)
    with the confirming windows' demand, as far as the rules ask (at most
    ``max_walk`` operations ahead; ``state.target`` is updated to where this
    leg ends), and returns what may start now next to what is in flight
    (:func:`_startable`). When nothing is in flight and nothing is left to
    do, the transition is over (``target`` and ``plan`` cleared).
    ``workers`` rank the candidates as in :func:`step`.
    """
    if not state.plan or state.momentum is None:
        return state, ()
    path, target = walk(
        state.layout,
        state.pending,
        state.plan,
        state.momentum,
        capacity,
        settings,
        workers,
        limit=settings.max_walk,
    )
    state = replace(state, target=target)
    ops = _startable(path, state.layout, state.pending, state.plan, capacity, settings)
    if not ops:
        if not state.pending:
            return replace(state, target=None, plan=()), ()
        return state, ()
    reason = (
        state.pending[0].reason if state.pending else (state.history[-1] if state.history else "")
    )
    ops = tuple(replace(op, reason=reason) for op in ops)
    return replace(state, pending=state.pending + ops), ops


def commit(
    state: ControllerState, new_workers: Sequence[int], op: Op | None = None
) -> ControllerState:
    """The executor carried out ``op`` (default: the only pending one); ``new_workers`` are
    the ids it created.

    A split creates two workers (the first takes the lower offset), a merge
    one. Returns the state under the next epoch with the layout updated;
    other pending operations stay pending.
    """
    if op is None:
        if len(state.pending) != 1:
            raise ValueError(
                "no reconfiguration is pending"
                if not state.pending
                else "several operations are pending: say which one committed"
            )
        op = state.pending[0]
    if op not in state.pending:
        raise ValueError(f"{op} is not pending")
    if isinstance(op, Split) and len(new_workers) != 2:
        raise ValueError(f"a split creates two workers, got {list(new_workers)}")
    if isinstance(op, Merge) and len(new_workers) != 1:
        raise ValueError(f"a merge creates one worker, got {list(new_workers)}")
    slots = _apply(state.layout.slots, op, new_workers)
    rest = list(state.pending)
    rest.remove(op)
    return replace(
        state,
        layout=Layout(tuple(slots), state.layout.domain_size),
        epoch=state.epoch + 1,
        pending=tuple(rest),
        split_streak=0,
        merge_streak=0,
        confirming=(),
    )
