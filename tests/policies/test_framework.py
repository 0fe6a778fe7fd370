"""The filters → scorers → picker framework, on hand-computed cases."""

from __future__ import annotations

import random

import pytest

from tests.policies.fakes import pool, req
from vertumnus.core.policies.framework import (
    MaxScorePicker,
    MinCostPicker,
    ScoringPolicy,
    Weighted,
    min_max,
    min_max_inverted,
)


class Const:
    """A scorer returning fixed scores (0 for workers it does not name)."""

    def __init__(self, scores: dict[int, float]) -> None:
        self.scores = scores

    def score(self, request, pool, workers):
        return {w.id: self.scores.get(w.id, 0.0) for w in workers}


def test_min_max_inverted_and_plain():
    assert min_max_inverted({0: 3.0, 1: 1.0, 2: 2.0}) == {0: 0.0, 1: 1.0, 2: 0.5}
    assert min_max({0: 3.0, 1: 1.0, 2: 2.0}) == {0: 1.0, 1: 0.0, 2: 0.5}
    # All equal: everyone scores 1, so an idle pool adds no bias.
    assert min_max_inverted({0: 5.0, 1: 5.0}) == {0: 1.0, 1: 1.0}
    assert min_max({}) == {}


def test_pickers_break_ties_only_among_the_tied():
    assert MaxScorePicker().pick({2: 1.0, 0: 1.0, 1: 0.5}) == 0
    assert MinCostPicker().pick({2: 1.0, 0: 1.0, 1: 0.5}) == 1
    seen = {MaxScorePicker(random.Random(s)).pick({0: 1.0, 1: 0.2, 2: 1.0}) for s in range(40)}
    assert seen == {0, 2}


def test_weighted_sum_uses_configured_weights():
    p = pool(3)
    a = Const({0: 1.0, 1: 0.0, 2: 0.5})
    b = Const({0: 0.0, 1: 1.0, 2: 0.5})
    # 3·a + 2·b: w0 = 3, w1 = 2, w2 = 2.5
    pol = ScoringPolicy("t", [Weighted(a, 3.0), Weighted(b, 2.0)], MaxScorePicker())
    assert pol.totals(req(0, (1,)), p) == {0: 3.0, 1: 2.0, 2: 2.5}
    assert pol.decide(req(0, (1,)), p).worker == 0
    # Same scorers, other weights: w1 = 3 wins over w2 = 2.5 and w0 = 2.
    pol = ScoringPolicy("t", [Weighted(a, 2.0), Weighted(b, 3.0)], MaxScorePicker())
    assert pol.decide(req(0, (1,)), p).worker == 1


def test_filters_run_before_scoring_and_empty_means_no_decision():
    p = pool(3)
    only_two = lambda r, pv, ws: [w for w in ws if w.id == 2]  # noqa: E731
    pol = ScoringPolicy("t", [Weighted(Const({0: 1.0}), 1.0)], MaxScorePicker(), filters=[only_two])
    assert pol.decide(req(0, (1,)), p).worker == 2
    p.workers[2].available = False
    assert pol.decide(req(0, (1,)), p) is None


def test_a_policy_needs_a_scorer():
    with pytest.raises(ValueError):
        ScoringPolicy("t", [], MaxScorePicker())
