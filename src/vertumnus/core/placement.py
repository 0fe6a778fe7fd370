"""Request placement with the CP-aware cost model (design.md section 3).

For request i and candidate worker w of degree C_w:

    Ê_{i,w}   = E_{C_w}(R_{i,w}, P_{i,w})        (P = cached prefix at w)
    cost(i,w) = q_w + β·Ê_{i,w} + λ·(C_w / C_min − 1)·Ê_{i,w}

``q_w`` is the worker's outstanding predicted work (queued Ê plus the rest of
the running prefill) — a proxy for the wait. ``C_min`` is the smallest degree
among the candidates; the λ term charges the GPU time a larger worker
occupies beyond the smallest one. The cheapest candidate wins and the routing
core (:mod:`vertumnus.core.routing`) **reserves** its Ê at once, so that
concurrent arrivals see it.

β is load-dependent: β_i = β + (β_busy − β)·(share of candidates with
requests waiting), so a cache hit weighs more once recomputation would delay
queued requests (see :class:`PlacementParams`).

The **preferred degree** C_pref(i) is the degree of the worker minimising the
cost *without* q_w: what the request would pick if no queue existed. The
cache manager uses it to learn which degree a prefix should live at.

Everything here is a pure function of explicit state.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from vertumnus.core.costmodel import PrefillModel
from vertumnus.core.decision import RouteDecision


@dataclass(frozen=True, slots=True)
class PlacementParams:
    beta: float = 1.0
    """Weight of the request's own predicted service time (β ≥ 1) when no
    candidate worker has requests waiting."""
    lam: float = 0.1
    """Charge for GPUs occupied beyond the smallest candidate degree (λ ≥ 0)."""
    beta_busy: float = 10.0
    """β when every candidate has requests waiting (≥ ``beta``); in between,
    β grows linearly with the fraction of candidates that have a queue.

    Why: a cache miss makes the pool recompute a prefix. While queues are
    empty that only costs the request itself, and β = 1 (earliest finish)
    is right. Once requests wait, the recomputed work delays every one of
    them, so a hit should be worth more than the queueing it costs this
    request. Set ``beta_busy = beta`` for a fixed β. Chosen on the synthetic
    workload (docs/benchmarks.md, "Choosing β"): 1 → 10 matches β = 1 at light
    load and beats every fixed β near saturation."""

    def __post_init__(self) -> None:
        if self.beta < 1.0:
            raise ValueError(f"beta must be >= 1, got {self.beta}")
        if self.beta_busy < self.beta:
            raise ValueError(f"beta_busy must be >= beta, got {self.beta_busy} < {self.beta}")
        if self.lam < 0.0:
            raise ValueError(f"lambda must be >= 0, got {self.lam}")


@dataclass(slots=True)
class WorkerState:
    """What placement knows about one worker. Kept up to date by the routing core."""

    id: int
    degree: int
    available: bool = True
    """False while draining, parked or not yet serving: not a candidate."""
    outstanding_s: float = 0.0
    """q_w: predicted seconds of work queued or still running here."""
    queued: int = 0
    """Requests waiting (placed, not started)."""
    running: int = 0
    """Requests being prefilled (0 or 1 for a prefill worker)."""
    free_at: float = 0.0
    """When the worker's last prefill ends: the running one's expected end while it
    runs, else when it became idle (the routing core sets it as a prefill starts, on
    the shell's clock; 0 before its first). Breaks ties, see :func:`place_fields_py`."""
    cache_used_blocks: int = 0
    cache_capacity_blocks: int = 0

    @property
    def inflight(self) -> int:
        return self.queued + self.running


def candidates(
    workers: Sequence[WorkerState], length: int, model: PrefillModel
) -> list[WorkerState]:
    """Workers that may take a request of ``length`` tokens.

    Unavailable workers and workers whose memory cannot hold the request are
    excluded; a cache miss never excludes a worker.
    """
    return [
        w
        for w in workers
        if w.available and model.supports(w.degree) and length <= model.max_tokens(w.degree)
    ]


def place(
    length: int,
    matched_blocks: Mapping[int, int],
    workers: Sequence[WorkerState],
    model: PrefillModel,
    params: PlacementParams,
    block_size: int,
) -> RouteDecision | None:
    """The minimum-cost worker for a request, or None if no worker can take it.

    ``matched_blocks[w]`` is the number of leading blocks of the request cached
    at worker ``w`` (absent means none). The policy's hot path calls
    :data:`place_fields` and builds the decision itself (one dict lookup for
    q_w instead of this scan).
    """
    fields = place_fields(length, matched_blocks, workers, model, params, block_size)
    if fields is None:
        return None
    worker, estimate_s, cached, cost, preferred = fields
    queue_s = next(w.outstanding_s for w in workers if w.id == worker)
    return RouteDecision(worker, estimate_s, cached, preferred, cost, queue_s)


def _tie_key(w: WorkerState, position: int) -> tuple[bool, float, int]:
    """Order among candidates of equal cost: idle before busy, longest idle first,
    then the caller's order."""
    busy = w.outstanding_s > 0.0
    return (busy, 0.0 if busy else w.free_at, position)


def place_fields_py(
    length: int,
    matched_blocks: Mapping[int, int],
    workers: Sequence[WorkerState],
    model: PrefillModel,
    params: PlacementParams,
    block_size: int,
) -> tuple[int, float, int, float, int] | None:
    """:func:`place` as a plain tuple (worker, Ê, cached tokens, cost, preferred
    degree) (pure Python; :data:`place_fields` is the one to call).

    For the policy's hot path, which builds its own result: a frozen
    dataclass costs ~1 µs to construct.
    """
    # Hot path: this runs once per arriving request over every worker. It
    # returns exactly what the straightforward loop over candidates() does
    # (same floats, same tie-breaks, _tie_key; tests/policies/test_hot_path.py
    # holds that reference). Measured on
    # CPython 3.11 with 64 workers (bench/placement_speed.py), the cost is
    # the number of passes over the workers, so there are three (degrees,
    # keys, costs) plus C-level min()/index(); list comprehensions that read
    # a slot attribute (specialised bytecode) beat map(attrgetter) here.
    d_coeffs = model.d
    per_gpu_limit = model.max_tokens_per_gpu
    degs = [w.degree for w in workers if w.available]
    avail = workers if len(degs) == len(workers) else [w for w in workers if w.available]
    deg_set = set(degs)
    if not deg_set:
        return None
    c_min = min(deg_set)
    # Candidate filter (== model.supports(deg) and length <= model.max_tokens(deg)).
    # Usually every degree is supported and the request fits the smallest
    # one (hence every one): one subset test instead of a check per degree.
    if deg_set <= d_coeffs.keys() and length <= min(
        per_gpu_limit * c_min, per_gpu_limit * max(deg_set)
    ):
        cands = avail
    else:
        deg_set = {deg for deg in deg_set if deg in d_coeffs and length <= per_gpu_limit * deg}
        if not deg_set:
            return None
        cands = [w for w in avail if w.degree in deg_set]
        c_min = min(deg_set)
    # own() per candidate depends only on (degree, matched blocks); a pool has
    # few distinct pairs (most workers hold nothing or the same hot prefix),
    # so each is predicted once. A pair's key is blocks·stride + degree
    # (0 < degree < stride, so divmod decodes it): integers rather than
    # (degree, blocks) tuples hash faster and, unlike tuples, are not tracked
    # by the cyclic GC, whose collections 64 tuples per call would trigger.
    stride = max(deg_set) + 1
    if matched_blocks:
        get = matched_blocks.get
        keys = [get(w.id, 0) * stride + w.degree for w in cands]
    else:
        keys = [w.degree for w in cands]
    beta, lam = params.beta, params.lam
    if params.beta_busy != beta:
        # β_i = β + (β_busy − β) · (share of candidates with requests waiting)
        beta += (params.beta_busy - beta) * sum(1 for w in cands if w.queued) / len(cands)
    predict = model.predict
    max_cached = length - 1
    own_of: dict[int, float] = {}
    for key in set(keys):
        m, deg = divmod(key, stride)
        # == cached_tokens(m, length, block_size), without the min/max calls
        p = 0 if m <= 0 else (t if (t := m * block_size) <= max_cached else max_cached)
        own_of[key] = (beta + lam * (deg / c_min - 1.0)) * predict(deg, length - p, p)
    costs = [w.outstanding_s + own_of[key] for w, key in zip(cands, keys, strict=True)]  # q_w + own
    least_cost = min(costs)
    best = costs.index(least_cost)
    if costs.count(least_cost) > 1:
        # Ties (idle workers of one degree holding the same prefix, typically): an
        # idle worker before a busy one, the longest idle first, then the lowest
        # position. Spreading work over idle workers this way is what the what-if
        # replay (whatif.py: the least free time) assumes, so the composition
        # controller's estimate and the router grow the same caches; breaking
        # ties by position instead biased its estimate by up to 6 %
        # (docs/benchmarks/adaptive.md, "which idle worker").
        best = min(
            (i for i, cost in enumerate(costs) if cost == least_cost),
            key=lambda i: _tie_key(cands[i], i),
        )
    # C_pref: the degree of the first candidate with the least own(). own_of
    # holds exactly the keys present, so the least value is found among ~10
    # entries instead of 64; only when several keys share it must the
    # candidates be scanned in order for the first one.
    owns = list(own_of.values())
    least = min(owns)
    if owns.count(least) == 1:
        pref_key = list(own_of)[owns.index(least)]
    else:
        pref_key = next(key for key in keys if own_of[key] == least)
    # Ê and P at the winner, recomputed with the same call (hence the same
    # float) rather than stored for every pair.
    m, deg = divmod(keys[best], stride)
    p = 0 if m <= 0 else (t if (t := m * block_size) <= max_cached else max_cached)
    est = predict(deg, length - p, p)
    return cands[best].id, est, p, costs[best], pref_key % stride


# The placement hot path, ``place_fields``: the compiled twin of
# place_fields_py (_placement.c, the same results to the last bit) where the
# build produced it, else the Python function. HOT_PATH names the one in use.
HOT_PATH: str
try:
    from vertumnus.core._placement import place_fields
except ImportError:  # built without a C compiler
    place_fields = place_fields_py
    HOT_PATH = "python"
else:
    HOT_PATH = "c"
