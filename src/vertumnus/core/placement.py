"""Request placement with the CP-aware cost model (design.md section 3).

For request i and candidate worker w of degree C_w:

    Ê_{i,w}   = E_{C_w}(R_{i,w}, P_{i,w})        (P = cached prefix at w)
    cost(i,w) = q_w + β·Ê_{i,w} + λ·(C_w / C_min − 1)·Ê_{i,w}

``q_w`` is the worker's outstanding predicted work (queued Ê plus the rest of
the running prefill) — a proxy for the wait. ``C_min`` is the smallest degree
among the candidates; the λ term charges the GPU time a larger worker
occupies beyond the smallest one. The cheapest candidate wins and the caller
**reserves** its Ê at once (:func:`reserve`) so that concurrent arrivals see it.

The **preferred degree** C_pref(i) is the degree of the worker minimising the
cost *without* q_w: what the request would pick if no queue existed. The
cache manager uses it to learn which degree a prefix should live at.

Everything here is a pure function of explicit state.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from vertumnus.core.costmodel import PrefillModel
from vertumnus.core.types import cached_tokens


@dataclass(frozen=True, slots=True)
class PlacementParams:
    beta: float = 1.0
    """Weight of the request's own predicted service time (β ≥ 1)."""
    lam: float = 0.1
    """Charge for GPUs occupied beyond the smallest candidate degree (λ ≥ 0)."""

    def __post_init__(self) -> None:
        if self.beta < 1.0:
            raise ValueError(f"beta must be >= 1, got {self.beta}")
        if self.lam < 0.0:
            raise ValueError(f"lambda must be >= 0, got {self.lam}")


@dataclass(slots=True)
class WorkerState:
    """What placement knows about one worker. Owned and updated by a shell."""

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
    cache_used_blocks: int = 0
    cache_capacity_blocks: int = 0

    @property
    def inflight(self) -> int:
        return self.queued + self.running


@dataclass(frozen=True, slots=True)
class Placement:
    worker: int
    estimate_s: float
    """Ê at the chosen worker: the amount to reserve."""
    cached_tokens: int
    cost: float
    preferred_degree: int


def candidates(workers: Sequence[WorkerState], length: int, model: PrefillModel) -> list[WorkerState]:
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
) -> Placement | None:
    """The minimum-cost worker for a request, or None if no worker can take it.

    ``matched_blocks[w]`` is the number of leading blocks of the request cached
    at worker ``w`` (absent means none).
    """
    cands = candidates(workers, length, model)
    if not cands:
        return None
    c_min = min(w.degree for w in cands)
    beta, lam = params.beta, params.lam
    best: Placement | None = None
    best_cost = float("inf")
    pref_degree = 0
    pref_cost = float("inf")
    for w in cands:
        p = cached_tokens(matched_blocks.get(w.id, 0), length, block_size)
        est = model.predict(w.degree, length - p, p)
        own = (beta + lam * (w.degree / c_min - 1.0)) * est
        cost = w.outstanding_s + own
        # Ties go to the lower worker id (candidates keep the caller's order),
        # which keeps runs deterministic.
        if cost < best_cost:
            best_cost = cost
            best = Placement(w.id, est, p, cost, 0)
        if own < pref_cost:
            pref_cost = own
            pref_degree = w.degree
    assert best is not None
    return Placement(best.worker, best.estimate_s, best.cached_tokens, best.cost, pref_degree)


def reserve(worker: WorkerState, estimate_s: float) -> None:
    """Book a placed request's predicted work at its worker immediately."""
    worker.outstanding_s += estimate_s
    worker.queued += 1
