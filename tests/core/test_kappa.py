"""κ that follows the workload: the scale fit, its prior and forgetting, the sample book,
and the controller that reads the learned κ."""

from __future__ import annotations

import random

import pytest

from vertumnus.core import planner
from vertumnus.core.control import Controller
from vertumnus.core.kappa import CapacityLearner, LearnerSettings, ReplicaBook, SampleBook, _Curve
from vertumnus.core.types import Composition, Request
from vertumnus.profiles import load_capacity, load_model

SHIPPED = load_capacity("qwen3-30b-a3b/h200")


def feed_curve(learner: CapacityLearner, degree: int, m_true: float, n: int = 200) -> None:
    """Samples that lie exactly on the shipped curve stretched by ``m_true``, at loads up
    to past its knee (below the knee the curve is flat and samples say little)."""
    k = learner.prior.kappa(degree)
    curve = _Curve([(d / k, a) for d, a in learner.prior.levels[degree]])
    for i in range(n):
        r = 0.1 + 2.8 * (i % 50) / 49
        learner.add(degree, r * k, curve(r / m_true), requests=10)


def test_without_samples_the_learned_profile_is_the_shipped_one():
    learner = CapacityLearner(SHIPPED)
    assert learner.profile().kappa_per_s == SHIPPED.kappa_per_s
    assert learner.correction(4) == 1.0


@pytest.mark.parametrize("m_true", [0.7, 1.0, 1.4])
def test_the_fit_recovers_the_scale_of_the_curve(m_true):
    learner = CapacityLearner(SHIPPED)
    feed_curve(learner, 4, m_true)
    assert learner.correction(4) == pytest.approx(m_true, rel=0.03)
    # Other degrees keep the shipped value: they had no samples.
    assert learner.profile().kappa(8) == SHIPPED.kappa(8)
    assert learner.profile().kappa(4) == pytest.approx(m_true * SHIPPED.kappa(4), rel=0.03)
    # Fewer samples: the prior (the shipped κ) holds the estimate back, not past the truth.
    few = CapacityLearner(SHIPPED)
    feed_curve(few, 4, m_true, n=100)
    assert min(1.0, m_true) - 0.03 <= few.correction(4) <= max(1.0, m_true) + 0.03


def test_flat_low_load_samples_say_little_and_the_prior_holds():
    learner = CapacityLearner(SHIPPED)
    for _ in range(100):
        learner.add(4, 0.05 * SHIPPED.kappa(4), 1.0, requests=10)
    assert learner.correction(4) == pytest.approx(1.0, rel=0.05)


def test_old_samples_fade_so_the_estimate_follows_a_change():
    learner = CapacityLearner(SHIPPED, LearnerSettings(half_life=50))
    feed_curve(learner, 8, 0.7)
    assert learner.correction(8) < 0.75
    feed_curve(learner, 8, 1.4, n=400)
    assert learner.correction(8) == pytest.approx(1.4, rel=0.05)


def test_a_learner_given_what_another_learned_fits_the_same_and_goes_on_alike():
    first = CapacityLearner(SHIPPED, LearnerSettings(half_life=50))
    feed_curve(first, 8, 0.7)
    feed_curve(first, 4, 1.3, n=60)
    learned = first.learned()
    assert learned.samples == first.samples == 260
    second = CapacityLearner(SHIPPED, LearnerSettings(half_life=50), learned=learned)
    assert second.profile().kappa_per_s == first.profile().kappa_per_s
    assert second.learned() == learned
    # New samples move both the same way, bit for bit.
    feed_curve(first, 8, 1.4, n=100)
    feed_curve(second, 8, 1.4, n=100)
    assert second.profile().kappa_per_s == first.profile().kappa_per_s


def test_learned_bins_that_cannot_be_are_refused():
    from vertumnus.core.kappa import LearnedBins

    with pytest.raises(ValueError, match="bin 60 is not in 0..59"):
        LearnedBins({4: ((60, 1.0, 1.0, 1.0, 0.5),)})
    with pytest.raises(ValueError, match="CP8, bin 3: sums must be finite"):
        LearnedBins({8: ((3, 1.0, 2.0, 1.0, 0.5),)})
    with pytest.raises(ValueError, match="CP8, bin 3: sums must be finite"):
        LearnedBins({8: ((3, float("nan"), 0.0, 0.0, 0.0),)})
    with pytest.raises(ValueError, match="samples must be >= 0"):
        LearnedBins({}, samples=-1)


def test_a_profile_without_levels_uses_the_default_curve():
    learner = CapacityLearner(planner.CapacityProfile({4: 0.5}))
    # The default curve meets the 0.9 target at d = κ; samples there at 0.9: m ≈ 1.
    for _ in range(50):
        learner.add(4, 0.5, 0.9, requests=10)
    assert learner.correction(4) == pytest.approx(1.0, rel=0.03)
    # A pool that misses the target already at half of κ: κ̂ well below.
    for _ in range(200):
        learner.add(4, 0.25, 0.5, requests=10)
    assert learner.correction(4) < 0.6


def test_bad_samples_are_refused_by_name():
    learner = CapacityLearner(SHIPPED)
    with pytest.raises(ValueError, match="attainment in"):
        learner.add(4, 0.3, 1.5)
    with pytest.raises(ValueError, match="demand >= 0"):
        learner.add(4, float("nan"), 0.5)
    learner.add(3, 0.3, 0.5)  # a degree the profile lacks: ignored, not an error
    assert learner.samples == 0


def test_a_sample_is_a_degrees_hop_once_all_its_requests_finished():
    book = SampleBook()
    book.placed(1, degree=4, estimate_s=1.0, tokens=100, tau_s=2.0)
    book.placed(2, degree=4, estimate_s=3.0, tokens=300, tau_s=2.0)
    book.placed(3, degree=8, estimate_s=2.0, tokens=50, tau_s=2.0)
    book.completed(1, 1.0)  # met
    book.completed(3, 5.0)  # missed
    done = book.close_hop({4: 2, 8: 1})
    assert [(s.degree, s.demand_s, s.attainment) for s in done] == [(8, 2.0, 0.0)]
    book.completed(2, 3.0)  # missed: 100 of 400 tokens met
    book.completed(99, 1.0)  # untracked: ignored
    (s,) = book.close_hop({4: 2, 8: 1})
    assert (s.degree, s.demand_s, s.requests, s.attainment) == (4, 2.0, 2, 0.25)


def test_a_transition_and_unfinished_requests_give_no_samples():
    book = SampleBook(max_age=2)
    book.placed(1, 4, 1.0, 10, 2.0)
    book.reshaped()  # a transition committed during the hop
    book.completed(1, 1.0)
    assert book.close_hop({4: 2}) == []
    book.placed(2, 4, 1.0, 10, 2.0)
    assert book.close_hop({4: 2}) == []  # waits for request 2
    book.reshaped()  # a transition committed before it finished
    book.completed(2, 1.0)
    assert book.close_hop({4: 2}) == []
    book.placed(3, 4, 1.0, 10, 2.0)  # never finishes: dropped after max_age hops
    for _ in range(3):
        assert book.close_hop({4: 2}) == []
    book.completed(3, 1.0)
    assert book.close_hop({4: 2}) == []
    assert book._pending == {}


def test_the_replicas_sums_make_the_same_samples_as_the_requests():
    """Two router replicas report sums per (hop, degree); the operator's book adds
    them up into the samples one book seeing every request makes."""
    rng = random.Random(3)
    reqs = [
        (i, rng.choice((4, 8)), rng.random(), rng.randint(10, 99), rng.random() * 3)
        for i in range(60)
    ]
    whole = SampleBook()
    summed = SampleBook()
    replicas = [ReplicaBook(), ReplicaBook()]
    got_whole, got_summed = [], []
    for hop in range(4):
        batch = reqs[hop * 15 : (hop + 1) * 15]
        for rid, degree, est, tokens, _ in batch:
            whole.placed(rid, degree, est, tokens, 2.0)
            replicas[rid % 2].placed(rid, degree, est, tokens, 2.0)
        # Half of this hop's requests finish now, the rest one hop later.
        finishing = batch[: len(batch) // 2] + (reqs[(hop - 1) * 15 + 7 : hop * 15] if hop else [])
        for rid, _, _, _, ttft in finishing:
            whole.completed(rid, ttft)
            replicas[rid % 2].completed(rid, ttft)
        parts = [p for r in replicas for p in r.take(100 + hop)]
        for p in parts:
            h = summed.hop - (100 + hop - p.hop)
            if p.requests:
                summed.add_placed(h, p.degree, p.demand_s, p.requests)
            if p.done:
                summed.add_done(h, p.degree, p.done, p.tokens, p.met_tokens)
        got_whole += whole.close_hop({4: 3, 8: 2})
        got_summed += summed.close_hop({4: 3, 8: 2})
    assert got_whole and len(got_whole) == len(got_summed)
    for a, b in zip(got_whole, got_summed, strict=True):
        assert (a.degree, a.requests) == (b.degree, b.requests)
        assert a.demand_s == pytest.approx(b.demand_s) and a.attainment == pytest.approx(
            b.attainment
        )


def test_the_controller_reads_the_learned_kappa():
    model = load_model()
    ps = planner.PlannerSettings(window_s=10.0, learn_capacity=True, whatif=False, check_hops=1)
    layout = planner.layout_for(Composition.parse("2xCP4"), 8)
    ctl = Controller(planner.initial_state(layout), SHIPPED, ps, model)
    learned = []
    rid = 0
    # Every window both CP4s get 0.8 κ of demand and every request misses its τ.
    for _ in range(12):
        for w in (0, 1):
            for _ in range(8):
                rid += 1
                ctl.placed(Request(rid, 0.0, 4000, ()), w, 0.8 * SHIPPED.kappa(4) * 10 / 8)
                ctl.completed(rid, 100.0)
        tick = ctl.tick({0: 0.0, 1: 0.0}, reconfiguring=False)
        assert tick is not None and tick.kappa is not None
        learned.append(tick.kappa[4])
    assert learned[-1] < 0.7 * SHIPPED.kappa(4)
    assert learned == sorted(learned, reverse=True)
    # The utilization the rules read is against the learned κ.
    assert tick.utilization == pytest.approx(0.8 * SHIPPED.kappa(4) / learned[-1], rel=0.01)
    # A controller restarted with the memory reads the learned κ from its first window.
    memory = ctl.memory()
    assert memory.kappa is not None and memory.kappa.samples == ctl.learner.samples
    again = Controller(ctl.state, SHIPPED, ps, model, memory=memory)
    assert again.capacity.kappa_per_s == ctl.capacity.kappa_per_s
    assert again.capacity.kappa(4) == learned[-1]
    assert again.memory() == memory
    # Without the setting the shipped κ stays.
    fixed = Controller(
        planner.initial_state(layout), SHIPPED, planner.PlannerSettings(check_hops=1), model
    )
    fixed.placed(Request(1, 0.0, 4000, ()), 0, 1.0)
    fixed.completed(1, 100.0)
    tick = fixed.tick({0: 0.0, 1: 0.0}, reconfiguring=False)
    assert tick is not None and tick.kappa == dict(SHIPPED.kappa_per_s)


def test_with_sliding_windows_a_sample_spans_a_window_of_hops():
    book = SampleBook(hops_per_sample=3)
    for hop in range(3):
        book.placed(hop, degree=4, estimate_s=1.0, tokens=10, tau_s=2.0)
        book.completed(hop, 1.0)
        done = book.close_hop({4: 2})
        assert done == ([] if hop < 2 else done)
    (s,) = done
    assert (s.requests, s.demand_s, s.attainment) == (3, 1.5, 1.0)
