"""Shadow pools (vertumnus.core.shadow): a composition serving the pool's requests alongside it."""

from __future__ import annotations

import math

import numpy as np
import pytest

from vertumnus.core.costmodel import PrefillModel
from vertumnus.core.placement import PlacementParams
from vertumnus.core.plannersettings import PlannerSettings
from vertumnus.core.policies.vertumnus import CostModelPolicy
from vertumnus.core.shadow import Shadow, ShadowBank
from vertumnus.core.types import Composition, Request
from vertumnus.profiles import load_model
from vertumnus.sim.engine import PoolConfig, Simulation
from vertumnus.sim.reconfig import AdaptiveOptions, build_adaptive
from vertumnus.sim.synthetic import SyntheticConfig, generate

BLOCK = 512


@pytest.fixture(scope="module")
def model() -> PrefillModel:
    return load_model()


def shadow(model: PrefillModel, comp: str, started_s: float = 0.0) -> Shadow:
    return Shadow(Composition.parse(comp), model, PlacementParams(), 1000, BLOCK, started_s)


def test_a_shadow_serves_as_the_simulated_pool_of_its_composition(model: PrefillModel) -> None:
    trace = generate(SyntheticConfig(duration_s=240.0, mean_rate=6.0), seed=3)
    comp = "2xCP4+4xCP8"
    run = Simulation(
        PoolConfig(Composition.parse(comp), model, block_size=trace.block_size), CostModelPolicy()
    ).run(trace.requests)
    sim = {c.request_id: c.ttft_s - 0.05 for c in run.completions}  # T_ext out
    s = Shadow(Composition.parse(comp), model, PlacementParams(), 1000, trace.block_size, 0.0)
    ordered = sorted(trace.requests, key=lambda q: q.arrival_s)
    for q in ordered:
        s.serve(q)
    assert len(s.ttfts) == len(ordered)
    mine = np.array(s.ttfts)
    theirs = np.array([sim[q.id] for q in ordered])
    # The same placement, caches and queues: request by request, the same TTFTs.
    assert np.mean(np.isclose(mine, theirs, rtol=1e-6)) > 0.95
    assert mine.mean() == pytest.approx(theirs.mean(), rel=0.01)


def test_a_shadow_keeps_its_cache_from_request_to_request(model: PrefillModel) -> None:
    s = shadow(model, "1xCP8")
    prefix = tuple(range(1, 17))
    s.serve(Request(0, 0.0, 16 * BLOCK, prefix))
    s.serve(Request(1, 100.0, 16 * BLOCK + 100, (*prefix, 99)))
    s.serve(Request(2, 200.0, 16 * BLOCK + 100, tuple(range(1000, 1017))))
    cold, warm, other = s.ttfts
    assert cold == pytest.approx(model.predict(8, 16 * BLOCK, 0))
    assert warm == pytest.approx(model.predict(8, 100, 16 * BLOCK))  # its prefix was cached
    assert other == pytest.approx(model.predict(8, 16 * BLOCK + 100, 0))


def test_a_shadow_queues_and_places_by_cost(model: PrefillModel) -> None:
    s = shadow(model, "2xCP4")
    for i in range(3):
        s.serve(Request(i, 0.0, 20_000, (10 * i + 1,)))
    first, second, third = s.ttfts
    assert first == pytest.approx(second)  # two idle workers
    assert third == pytest.approx(2 * first)  # behind one of them


def test_a_request_no_worker_can_hold_is_refused_not_recorded(model: PrefillModel) -> None:
    s = shadow(model, "2xCP4")
    too_long = model.max_tokens(4) + 1
    s.serve(Request(0, 0.0, too_long, (1,)))
    assert s.ttfts == []


def bank(model: PrefillModel, horizon_s: float = 100.0, warmup_s: float = 10.0) -> ShadowBank:
    return ShadowBank(model, PlacementParams(), 1000, BLOCK, horizon_s, warmup_s)


def stream(n: int, start_s: float, gap_s: float, first: int = 0) -> list[Request]:
    """``n`` requests of 30,000 tokens, no prefix in common, ids from ``first``."""
    return [
        Request(first + i, start_s + i * gap_s, 30_000, (7_000_000 + first + i,)) for i in range(n)
    ]


def test_the_bank_compares_on_the_same_requests_pooled(model: PrefillModel) -> None:
    b = bank(model, horizon_s=1000.0, warmup_s=0.0)
    small, big = Composition.parse("4xCP4"), Composition.parse("2xCP8")
    b.follow([small, big])
    for q in stream(200, 0.0, 0.5):
        b.serve(q)
    (c,) = b.compare(small)
    mine, theirs = np.array(b.shadows[small].ttfts), np.array(b.shadows[big].ttfts)
    assert c.composition == big and c.requests == 200
    assert c.mean_gain == pytest.approx(1 - theirs.mean() / mine.mean())
    assert c.p90_gain == pytest.approx(1 - np.percentile(theirs, 90) / np.percentile(mine, 90))
    (back,) = b.compare(big)
    assert math.copysign(1, back.mean_gain) == -math.copysign(1, c.mean_gain)


def test_a_new_shadow_is_compared_only_once_warm_and_within_the_horizon(
    model: PrefillModel,
) -> None:
    b = bank(model, horizon_s=100.0, warmup_s=10.0)
    a, late = Composition.parse("4xCP4"), Composition.parse("2xCP8")
    b.follow([a])
    for q in stream(100, 0.0, 1.0):
        b.serve(q)
    b.follow([a, late])  # starts at 99 s, cold
    for q in stream(100, 100.0, 1.0, first=100):
        b.serve(q)
    (c,) = b.compare(a)
    # From 109 s (its warm-up over) to 199 s; the horizon would allow from 99 s.
    assert c.requests == 91
    assert c.span_s == pytest.approx(90.0)
    (since,) = b.compare(a, since_s=150.0)
    assert since.requests == 50
    assert b.shadows[a].arrivals[0] >= 99.0  # older records are dropped
    b.follow([late])
    assert list(b.shadows) == [late]
    assert b.compare(a) == []


def test_shadow_settings_are_validated() -> None:
    with pytest.raises(ValueError, match="shadow_min_s"):
        PlannerSettings(shadow_min_s=700.0, shadow_horizon_s=600.0)
    with pytest.raises(ValueError, match="shadow_margin"):
        PlannerSettings(shadow_margin=1.5)


def test_the_shadows_move_a_pool_started_on_the_wrong_shape(model: PrefillModel) -> None:
    """Short conversation requests at a steady load, started on 5xCP8: the shadows see
    that smaller workers serve them faster and move the pool there, with the
    window estimate (and the rules) switched off."""
    trace = generate(SyntheticConfig(duration_s=900.0, mean_rate=12.0, max_length=8192), seed=1)
    ps = PlannerSettings(
        whatif=False,
        shadow=True,
        shadow_min_s=120.0,
        shadow_horizon_s=240.0,
        lower=1e-9,
        upper=10.0,
    )
    options = AdaptiveOptions(control=ps, initial=Composition.parse("5xCP8"), history_s=None)
    sim = build_adaptive(trace, model, options)
    sim.run(trace.requests)
    ctl = sim.attachments["controller"]
    moves = [h for h in ctl.state.history if h.startswith("shadow:")]
    assert moves, ctl.state.history
    assert ctl.state.layout.composition != Composition.parse("5xCP8")
    assert any(w.get("shadow") for w in ctl.windows)
