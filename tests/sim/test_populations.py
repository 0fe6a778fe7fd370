"""Populations (:mod:`vertumnus.sim.populations`): a larger pool's rate from more users,
each at the trace's pace."""

from __future__ import annotations

import pytest

from vertumnus.sim.populations import population, populations
from vertumnus.sim.synthetic import SyntheticConfig, generate


@pytest.fixture(scope="module")
def source():
    return generate(SyntheticConfig(duration_s=60.0, mean_rate=2.0), seed=3)


def test_a_population_is_the_trace_rotated_with_keys_of_its_own(source):
    assert population(source, 0, 4) is source
    other = population(source, 1, 4)
    assert len(other) == len(source)
    assert sorted(r.length for r in other) == sorted(r.length for r in source)
    mine = {k for r in source for k in r.block_keys}
    theirs = {k for r in other for k in r.block_keys}
    assert not mine & theirs
    # Reuse inside the population survives the salt: a key per key, and each
    # request's prefix is its own prefix under the salt.
    assert len(theirs) == len(mine)
    period = source.duration_s * len(source) / (len(source) - 1)
    arrivals = [r.arrival_s for r in other]
    t0 = source.requests[0].arrival_s
    assert arrivals == sorted(arrivals) and t0 <= arrivals[0] and arrivals[-1] < t0 + period
    assert [r.id for r in other] == list(range(len(other)))
    # Rotated by a quarter of the period: the request that came first now comes
    # three quarters of a period in.
    first = source.requests[0]
    moved = [
        r for r in other if r.length == first.length and r.output_length == first.output_length
    ]
    assert any(r.arrival_s == pytest.approx(t0 + 0.75 * period) for r in moved)
    assert population(source, 1, 4).requests == other.requests  # deterministic


def test_populations_multiply_the_rate_and_keep_every_request(source):
    four = populations(source, 4)
    assert populations(source, 1) is source
    assert len(four) == 4 * len(source)
    assert [r.id for r in four] == list(range(len(four)))
    assert four.duration_s <= source.duration_s * len(source) / (len(source) - 1)
    assert sum(r.length for r in four) == 4 * sum(r.length for r in source)
    assert len({k for r in four for k in r.block_keys}) == 4 * len(
        {k for r in source for k in r.block_keys}
    )


@pytest.mark.parametrize("n", [0, -1, 1.5])
def test_a_bad_population_count_is_refused_by_name(source, n):
    with pytest.raises(ValueError, match="populations must be a whole number"):
        populations(source, n)
    with pytest.raises(ValueError, match="population 4 of 4"):
        population(source, 4, 4)
