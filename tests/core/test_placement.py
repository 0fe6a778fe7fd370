"""Placement on hand-computed cases (design.md section 3)."""

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from vertumnus.core.costmodel import PrefillModel
from vertumnus.core.placement import PlacementParams, WorkerState, candidates, place

# E_C(R, P) = R ms / C: easy to compute by hand
LINEAR = PrefillModel(
    name="linear", alpha=0.0, c=1e-3, b=0.0, d={1: 0.0, 2: 0.0, 4: 0.0}, a={1: 0.0, 2: 0.0, 4: 0.0}
)
BS = 100


def test_cache_hit_on_busy_worker_beats_idle_miss():
    busy_hit = WorkerState(0, 1, outstanding_s=0.5)
    idle_miss = WorkerState(1, 1)
    p = place(
        1000, {0: 9}, [busy_hit, idle_miss], LINEAR, PlacementParams(beta=1.0, beta_busy=1.0), BS
    )
    # worker 0: 0.5 + 0.1 (100 uncached tokens) = 0.6 < worker 1: 0 + 1.0
    assert p.worker == 0
    assert p.cached_tokens == 900
    assert p.estimate_s == pytest.approx(0.1)
    assert p.cost == pytest.approx(0.6)


def test_idle_miss_beats_hit_behind_a_long_queue():
    busy_hit = WorkerState(0, 1, outstanding_s=1.0)
    idle_miss = WorkerState(1, 1)
    p = place(
        1000, {0: 9}, [busy_hit, idle_miss], LINEAR, PlacementParams(beta=1.0, beta_busy=1.0), BS
    )
    assert p.worker == 1  # 1.1 > 1.0
    assert p.cost == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("lam", "expected"),
    [(0.0, 1), (0.5, 1), (1.0, 0), (2.0, 0)],  # CP4 cost = 0.25 * (1 + 3 lam) vs CP1 cost = 1.0
)
def test_lambda_moves_requests_between_degrees(lam, expected):
    workers = [WorkerState(0, 1), WorkerState(1, 4)]
    p = place(1000, {}, workers, LINEAR, PlacementParams(beta=1.0, beta_busy=1.0, lam=lam), BS)
    assert p.worker == expected  # lam = 1 is a tie: the lower id wins


def test_c_min_is_the_smallest_candidate_degree():
    # with the CP1 worker unavailable, C_min = 4 and lambda charges nothing
    workers = [
        WorkerState(0, 1, available=False),
        WorkerState(1, 4),
        WorkerState(2, 4, outstanding_s=0.1),
    ]
    p = place(1000, {}, workers, LINEAR, PlacementParams(beta=1.0, beta_busy=1.0, lam=2.0), BS)
    assert p.worker == 1
    assert p.cost == pytest.approx(0.25)


def test_preferred_degree_ignores_queues():
    workers = [WorkerState(0, 1), WorkerState(1, 4, outstanding_s=10.0)]
    p = place(1000, {}, workers, LINEAR, PlacementParams(beta=1.0, beta_busy=1.0, lam=0.0), BS)
    assert p.worker == 0
    assert p.preferred_degree == 4


def test_candidates_exclude_unavailable_and_too_long_but_not_misses():
    model = PrefillModel(
        name="m",
        alpha=0,
        c=1e-3,
        b=0,
        d={1: 0.0, 4: 0.0},
        a={1: 0.0, 4: 0.0},
        max_tokens_per_gpu=1000,
    )
    workers = [
        WorkerState(0, 1),
        WorkerState(1, 4),
        WorkerState(2, 4, available=False),
        WorkerState(3, 2),
    ]
    # degree 2 is not in the profile; 3000 tokens do not fit one GPU
    assert [w.id for w in candidates(workers, 3000, model)] == [1]
    assert [w.id for w in candidates(workers, 500, model)] == [0, 1]
    assert place(5000, {}, workers, model, PlacementParams(beta=1.0, beta_busy=1.0), BS) is None


def test_fully_cached_prompt_still_computes_one_token():
    p = place(
        1000, {0: 10}, [WorkerState(0, 1)], LINEAR, PlacementParams(beta=1.0, beta_busy=1.0), BS
    )
    assert p.cached_tokens == 999
    assert p.estimate_s == pytest.approx(1e-3)


def test_beta_grows_with_the_share_of_queued_candidates():
    # hit at a busy worker (q = 1.0, 100 uncached tokens) vs an idle miss (1000 tokens)
    params = PlacementParams(beta=1.0, beta_busy=3.0)
    hit = WorkerState(0, 1, outstanding_s=1.0, queued=0)
    miss = WorkerState(1, 1)
    # nobody waits: beta = 1, hit costs 1.1 > miss 1.0
    assert place(1000, {0: 9}, [hit, miss], LINEAR, params, BS).worker == 1
    # one of two candidates has a queue: beta = 2, hit 1.0 + 0.2 < miss 2.0
    hit.queued = 1
    p = place(1000, {0: 9}, [hit, miss], LINEAR, params, BS)
    assert p.worker == 0 and p.cost == pytest.approx(1.2)
    # both wait: beta = 3
    miss.queued = 1
    assert place(1000, {0: 9}, [hit, miss], LINEAR, params, BS).cost == pytest.approx(1.3)


def test_params_validated():
    with pytest.raises(ValueError, match="beta"):
        PlacementParams(beta=0.5)
    with pytest.raises(ValueError, match="beta_busy"):
        PlacementParams(beta=3.0, beta_busy=2.0)
    with pytest.raises(ValueError, match="lambda"):
        PlacementParams(lam=-1)


@given(
    st.lists(
        st.tuples(st.sampled_from([1, 2, 4]), st.floats(0, 5), st.integers(0, 10)),
        min_size=1,
        max_size=8,
    ),
    st.integers(1, 1000),
    st.floats(0, 3),
)
@example([(1, 3.5472987393728004e-229, 0), (1, 0.0, 0)], 1, 0.0)  # a tie with a busy worker
def test_place_matches_naive_argmin(ws, length, lam):
    workers = [WorkerState(i, deg, outstanding_s=q) for i, (deg, q, _) in enumerate(ws)]
    matched = {i: m for i, (_, _, m) in enumerate(ws)}
    params = PlacementParams(beta=1.0, beta_busy=1.0, lam=lam)
    p = place(length, matched, workers, LINEAR, params, 10)
    c_min = min(w.degree for w in workers)

    def cost(w):
        cached = max(0, min(matched[w.id] * 10, length - 1))
        e = LINEAR.predict(w.degree, length - cached, cached)
        return w.outstanding_s + e + lam * (w.degree / c_min - 1) * e

    # Ties as placement breaks them: an idle worker before a busy one (here every
    # worker has the same free_at), then the lowest position; an outstanding
    # 1e-229 s is busy though it adds nothing to the cost.
    best = min(workers, key=lambda w: (cost(w), w.outstanding_s > 0.0, w.id))
    assert p.worker == best.id
    assert p.cost == pytest.approx(cost(best))
