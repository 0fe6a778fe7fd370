"""The plugin shape placement policies are built from: filters → scorers → weighted sum → picker.

This is the shape of the llm-d inference scheduler (Gateway API Inference
Extension EPP, ``pkg/epp/scheduling/framework``): a **filter** drops workers
that must not take the request, every **scorer** rates each remaining worker
in [0, 1] (higher is better), the scores are summed with **weights that live
in configuration** (the policy's constructor), never inside a scorer, and a
**picker** turns the weighted totals into one worker.

A policy is then a small declaration::

    ScoringPolicy(
        name="my-policy",
        scorers=[Weighted(PrefixScorer(index), 3.0), Weighted(QueueScorer(), 2.0)],
        picker=MaxScorePicker(random.Random(seed)),
    )

Policies whose published rule is not a weighted sum (SGLang's two-mode
switch, Dynamo's cost argmin) still use the shared pieces here — candidate
filtering, the pickers, min-max normalisation — so each stays one short
module. Everything is pure: no I/O, no clocks, no module state; randomness
only through a ``random.Random`` handed in by the caller.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from vertumnus.core.decision import RouteDecision
from vertumnus.core.placement import WorkerState
from vertumnus.core.policies.base import Policy, PoolView, decision_at, eligible
from vertumnus.core.types import Request


class Filter(Protocol):
    """Drops workers that must not take ``request`` (may return all, never adds)."""

    def __call__(
        self, request: Request, pool: PoolView, workers: list[WorkerState]
    ) -> list[WorkerState]: ...


class Scorer(Protocol):
    """Rates each worker for ``request`` in [0, 1]; higher is better.

    Must return a value for every worker it is given (a worker it knows
    nothing about scores 0).
    """

    def score(
        self, request: Request, pool: PoolView, workers: Sequence[WorkerState]
    ) -> dict[int, float]: ...


class Picker(Protocol):
    """Turns per-worker totals into the chosen worker id."""

    def pick(self, totals: Mapping[int, float]) -> int: ...


@dataclass(frozen=True, slots=True)
class Weighted:
    """A scorer with its weight: the weight is configuration, not part of the scorer."""

    scorer: Scorer
    weight: float


class MaxScorePicker:
    """Highest total wins; ties are broken uniformly at random (seeded).

    llm-d's ``max-score-picker`` shuffles the candidates before taking the
    maximum, i.e. a uniform random tie-break. With ``rng=None`` ties go to the
    lowest worker id instead (deterministic, for tests).
    """

    __slots__ = ("rng",)

    def __init__(self, rng: random.Random | None = None) -> None:
        self.rng = rng

    def pick(self, totals: Mapping[int, float]) -> int:
        return _break_tie(totals, max(totals.values()), self.rng)


class MinCostPicker:
    """Lowest cost wins (costs passed as totals); ties at random (seeded) or to the lowest id."""

    __slots__ = ("rng",)

    def __init__(self, rng: random.Random | None = None) -> None:
        self.rng = rng

    def pick(self, totals: Mapping[int, float]) -> int:
        return _break_tie(totals, min(totals.values()), self.rng)


def _break_tie(totals: Mapping[int, float], best: float, rng: random.Random | None) -> int:
    """A worker whose total equals ``best``: at random (seeded) or the lowest id."""
    # Exact ties only: totals are sums of the same float expressions.
    tied = sorted(w for w, v in totals.items() if v == best)
    if len(tied) == 1 or rng is None:
        return tied[0]
    return tied[rng.randrange(len(tied))]


def min_max_inverted(values: Mapping[int, float]) -> dict[int, float]:
    """(max − v) / (max − min) per worker: the smallest value scores 1, the largest 0.

    All equal → every worker scores 1 (llm-d's queue scorer does the same, so
    an idle pool does not bias the weighted sum).
    """
    return _min_max(values, invert=True)


def min_max(values: Mapping[int, float]) -> dict[int, float]:
    """(v − min) / (max − min): the largest value scores 1; all equal → 1."""
    return _min_max(values, invert=False)


def _min_max(values: Mapping[int, float], invert: bool) -> dict[int, float]:
    if not values:
        return {}
    lo = min(values.values())
    hi = max(values.values())
    if hi == lo:
        return dict.fromkeys(values, 1.0)
    span = hi - lo
    if invert:
        return {w: (hi - v) / span for w, v in values.items()}
    return {w: (v - lo) / span for w, v in values.items()}


class ScoringPolicy(Policy):
    """filters → weighted scorers → picker, over the workers that can hold the request.

    Subclasses (or callers) supply the plugins; state a peer keeps from its
    own decisions is updated by overriding :meth:`observe_placed` /
    :meth:`observe_completed` and forwarding to the plugins that need it.
    """

    def __init__(
        self,
        name: str,
        scorers: Sequence[Weighted],
        picker: Picker,
        filters: Sequence[Filter] = (),
    ) -> None:
        if not scorers:
            raise ValueError(f"policy {name!r} needs at least one scorer")
        self.name = name
        self.filters = tuple(filters)
        self.scorers = tuple(scorers)
        self.picker = picker

    def totals(self, request: Request, pool: PoolView) -> dict[int, float]:
        """Weighted score per candidate worker (empty when none may take it)."""
        cands = eligible(request, pool)
        for f in self.filters:
            if not cands:
                break
            cands = f(request, pool, cands)
        if not cands:
            return {}
        totals = dict.fromkeys((w.id for w in cands), 0.0)
        for ws in self.scorers:
            if ws.weight == 0.0:
                continue
            scores = ws.scorer.score(request, pool, cands)
            for wid in totals:
                totals[wid] += ws.weight * scores.get(wid, 0.0)
        return totals

    def decide(self, request: Request, pool: PoolView) -> RouteDecision | None:
        totals = self.totals(request, pool)
        return decision_at(request, self.picker.pick(totals), pool) if totals else None
