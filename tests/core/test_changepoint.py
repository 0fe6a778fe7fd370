"""The change point of a window's arrivals (core/changepoint.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from vertumnus.core.changepoint import Change, last_change


def loglik(counts: list[tuple[int, int]], split: int | None) -> float:
    """Poisson log-likelihood (without the count-only terms) of short and long streams
    with one rate per segment: the whole window (split None) or before/after ``split``
    trailing hops."""
    segments = [counts] if split is None else [counts[:-split], counts[-split:]]
    total = 0.0
    for stream in (0, 1):
        for seg in segments:
            n, t = sum(c[stream] for c in seg), len(seg)
            if n:
                total += n * math.log(n / t) - n
    return total


def test_a_jump_in_the_rate_is_found_where_it_happened() -> None:
    counts = [(10, 0)] * 6 + [(60, 0)] * 2
    change = last_change(counts)
    assert change is not None and change.hops == 2
    assert change.statistic > 100


def test_a_change_of_the_mix_at_the_same_rate_is_found_too() -> None:
    counts = [(20, 0)] * 5 + [(10, 10)] * 3
    change = last_change(counts)
    assert change is not None and change.hops == 3 and change.statistic > 25


@pytest.mark.parametrize("seed", range(5))
def test_the_statistic_is_twice_the_log_likelihood_ratio_of_the_best_split(seed: int) -> None:
    rng = np.random.default_rng(seed)
    counts = [(int(a), int(b)) for a, b in zip(rng.poisson(12, 8), rng.poisson(2, 8), strict=True)]
    change = last_change(counts)
    assert change is not None
    ratios = {k: 2 * (loglik(counts, k) - loglik(counts, None)) for k in range(1, 8)}
    best = max(ratios, key=lambda k: ratios[k])
    assert change.hops == best
    assert change.statistic == pytest.approx(ratios[best], abs=1e-9)


def test_constant_poisson_arrivals_rarely_reach_the_default_threshold() -> None:
    """10,000 windows of 8 hops at constant rates (15 short and 1.5 long requests per
    hop): the threshold of 25 (PlannerSettings.whatif_change) is reached in well under
    one in a thousand."""
    rng = np.random.default_rng(0)
    short = rng.poisson(15.0, (10_000, 8))
    long = rng.poisson(1.5, (10_000, 8))
    stats = []
    for s, lg in zip(short, long, strict=True):
        change = last_change(list(zip(s.tolist(), lg.tolist(), strict=True)))
        assert change is not None
        stats.append(change.statistic)
    stats_a = np.array(stats)
    assert np.mean(stats_a >= 25.0) < 1e-3
    assert np.percentile(stats_a, 99) < 20.0


def test_nothing_to_split() -> None:
    assert last_change([]) is None
    assert last_change([(5, 1)]) is None
    assert last_change([(0, 0)] * 8) is None
    # Constant counts: every split explains nothing (G = 0); the first is reported.
    assert last_change([(4, 0)] * 8) == Change(1, 0.0)
