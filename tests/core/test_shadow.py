"""Shadow pools (vertumnus.core.shadow): a composition serving the pool's requests alongside it."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from vertumnus.core import planner
from vertumnus.core import shadow as shadow_mod
from vertumnus.core.changepoint import Change
from vertumnus.core.control import Controller, WhatIf
from vertumnus.core.costmodel import PrefillModel
from vertumnus.core.placement import PlacementParams
from vertumnus.core.plannersettings import PlannerSettings
from vertumnus.core.policies.vertumnus import CostModelPolicy
from vertumnus.core.shadow import (
    HOT_PATH,
    SHADOW_BLOCK_TOKENS,
    Comparison,
    Shadow,
    ShadowBank,
    monotone,
)
from vertumnus.core.types import Composition, Request
from vertumnus.core.whatif import Estimate
from vertumnus.profiles import load_model
from vertumnus.sim.engine import PoolConfig, Simulation
from vertumnus.sim.reconfig import AdaptiveOptions, build_adaptive
from vertumnus.sim.synthetic import SyntheticConfig, generate
from vertumnus.sim.traces import Trace

BLOCK = 512
CAPACITY = planner.CapacityProfile({4: 0.46, 8: 0.63})


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
    assert len(s.ttfts) == 0


@pytest.mark.parametrize(
    ("comp", "rate", "cache_blocks"),
    [
        ("16xCP1+8xCP2+4xCP4+2xCP8", 20.0, 60),  # small caches: evictions all along
        ("8xCP4+4xCP8", 40.0, 1000),  # queues: most placements wait
        ("4xCP2+2xCP8", 3.0, 1000),  # idle workers: the longest prefix wins
    ],
)
def test_a_shadow_places_as_a_scan_of_every_worker_would(
    model: PrefillModel, comp: str, rate: float, cache_blocks: int
) -> None:
    """The search looks at a few workers (Shadow's docstring); request by request, it
    picks the worker a scan of them all picks, refusals included, in Python and in
    its compiled twin: the same TTFTs, free times and caches, to the bit."""
    trace = generate(SyntheticConfig(duration_s=60.0, mean_rate=rate), seed=11)
    ordered = sorted(trace.requests, key=lambda q: q.arrival_s)
    # A few prompts too long for the smallest degrees, so some degrees must be skipped.
    ordered[5] = replace(ordered[5], length=model.max_tokens(2) + 1)
    ordered[9] = replace(ordered[9], length=model.max_tokens(8) + 1)
    c = Composition.parse(comp)
    ways = [(True, False), (False, False)] + [(False, True)] * (HOT_PATH == "c")
    shadows = [
        Shadow(c, model, PlacementParams(), cache_blocks, trace.block_size, 0.0, scan, compiled)
        for scan, compiled in ways
    ]
    assert [(s.scan, s.nbytes() is not None) for s in shadows] == ways
    for i, q in enumerate(ordered):
        for s in shadows:
            s.serve(q)
        if i % 97 == 0 or i == len(ordered) - 1:  # the caches now and then, and at the end
            states = [
                (s.free_times(), [s.cached(w) for w in range(len(s.degrees))]) for s in shadows
            ]
            assert all(st == states[0] for st in states[1:]), i
    assert len(shadows[0].ttfts) == len(ordered) - 1  # only the one too long for CP8 refused
    assert all(s.ttfts == shadows[0].ttfts and s.arrivals == shadows[0].arrivals for s in shadows)
    if cache_blocks == 60:  # caches that filled and evicted
        assert any(len(shadows[0].cached(w)) == 60 * d for w, d in enumerate(shadows[0].degrees))


@pytest.mark.parametrize("seed", [0, 1])
def test_the_compiled_shadow_keeps_its_caches_as_python_does_under_churn(
    model: PrefillModel, seed: int
) -> None:
    """Prefixes drawn from a small tree (many workers hold each, every cache evicts all
    along, its tables grow and shrink): the compiled twin's placements and caches are
    the Python search's, request by request."""
    if HOT_PATH != "c":
        pytest.skip("built without a C compiler: only the Python shadow exists")
    rng = np.random.default_rng(seed)
    c = Composition.parse("12xCP1+6xCP2+4xCP4+2xCP8")
    pair = [Shadow(c, model, PlacementParams(), 7, 256, 0.0, compiled=x) for x in (False, True)]
    t = 0.0
    for i in range(4000):
        t += float(rng.exponential(0.05))
        depth = int(rng.integers(1, 40))
        branch = rng.integers(0, 3, depth)  # a path in a tree of fan-out 3
        keys = tuple(int(hash(tuple(branch[: j + 1])) & (2**64 - 1)) for j in range(depth))
        length = depth * 256 - int(rng.integers(0, 256))
        for s in pair:
            s.serve(Request(i, t, length, keys))
        if i % 250 == 0:
            got = [(s.free_times(), [s.cached(w) for w in range(len(c.degrees))]) for s in pair]
            assert got[0] == got[1], i
    assert pair[0].ttfts == pair[1].ttfts
    assert len(pair[1].ttfts) == 4000


def test_the_compiled_shadow_is_built_and_in_use(model: PrefillModel) -> None:
    """Optional at install time, but this project's build (and CI) has a compiler: a
    silent fall-back to Python would cost the shadows 10x the time and memory."""
    assert HOT_PATH == "c"
    s = shadow(model, "2xCP4")
    assert s.nbytes() is not None
    with pytest.raises(IndexError, match="worker 2 out of range"):
        s.cached(2)
    core = s._core
    assert core is not None
    with pytest.raises(TypeError, match="keys must be a buffer of uint64"):
        core.serve(0.0, 100, b"1234567")
    with pytest.raises(ValueError, match="degrees must be ascending"):
        type(core)([8, 4], *[[0.0, 0.0]] * 3, [1, 1], [1, 1], 0.0, 0.0, 0.0, 1.0, 0.0, 16, 0.0)
    assert len(s.ttfts) == 0  # nothing half-served


def test_a_profile_whose_prefill_time_can_grow_with_reuse_is_scanned() -> None:
    odd = PrefillModel("odd", alpha=0.0, c=0.0, b=1e-3, d={4: 0.01}, a={4: 1e-5})
    assert not monotone(odd, 4)
    s = Shadow(Composition.parse("2xCP4"), odd, PlacementParams(), 100, BLOCK, 0.0)
    assert s.scan
    s.serve(Request(0, 0.0, 4 * BLOCK, (1, 2, 3, 4)))
    s.serve(Request(1, 0.0, 8 * BLOCK, tuple(range(11, 19))))  # the other one, longer
    s.serve(Request(2, 10.0, 4 * BLOCK, (1, 2, 3, 4)))
    # Reading the cached prefix costs more than computing it: not the worker free
    # soonest, which holds it, but the other one, cold.
    assert s.ttfts[2] == pytest.approx(odd.predict(4, 4 * BLOCK, 0))


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


def test_the_shadows_take_small_engine_blocks_a_shadow_block_at_a_time(
    model: PrefillModel,
) -> None:
    """An engine's 16-token blocks: the shadows keep one block per 512 tokens (every
    32nd chained key names the prefix up to it), with the cache as many tokens."""
    bank = ShadowBank(model, PlacementParams(), 3200, 16, 600.0, 0.0)
    assert bank.stride == SHADOW_BLOCK_TOKENS // 16 == 32
    bank.follow([Composition.parse("1xCP4")])
    (s,) = bank.shadows.values()
    assert s.block_size == 512
    fine = tuple(range(1, 101))  # 100 blocks of 16 tokens: 1,600 tokens, three whole shadow blocks
    bank.serve(Request(0, 0.0, 1600, fine))
    bank.serve(Request(1, 10.0, 1600 + 16, (*fine, 999)))
    bank.serve(Request(2, 20.0, 20 * 16 + 8, (*fine[:20], 555)))  # 320 tokens shared: under one
    assert len(s.cached(0)) == 3
    cold, warm, short = s.ttfts
    assert warm == pytest.approx(model.predict(4, 1616 - 3 * 512, 3 * 512))
    assert short == pytest.approx(model.predict(4, 20 * 16 + 8, 0))


def test_shadow_settings_are_validated() -> None:
    with pytest.raises(ValueError, match="shadow_min_s"):
        PlannerSettings(shadow_min_s=700.0, shadow_horizon_s=600.0)
    with pytest.raises(ValueError, match="shadow_margin"):
        PlannerSettings(shadow_margin=1.5)
    with pytest.raises(ValueError, match="shadow_max_gpus"):
        PlannerSettings(shadow_max_gpus=-1)
    with pytest.raises(ValueError, match="shadow_restart_s"):
        PlannerSettings(shadow_restart_s=-1.0)
    with pytest.raises(ValueError, match="shadow_restart_s"):
        PlannerSettings(shadow_restart_s=float("nan"))


def shadowed(model: PrefillModel, comp: str, ps: PlannerSettings) -> Controller:
    """A controller on ``comp`` whose shadows know the cache size (100 blocks per GPU)."""
    return Controller(
        planner.initial_state(planner.layout_for(Composition.parse(comp))),
        CAPACITY,
        ps,
        model,
        block_size=BLOCK,
        cache_blocks_per_gpu=100,
    )


def test_a_pool_larger_than_shadow_max_gpus_keeps_no_shadows(model: PrefillModel) -> None:
    """Shadows cost per request and per comparison, growing with the pool: above
    ``shadow_max_gpus`` the controller keeps none (the window replays alone)."""
    for cap, kept in ((40, True), (39, False)):
        c = shadowed(model, "6xCP4+2xCP8", PlannerSettings(shadow=True, shadow_max_gpus=cap))
        assert (c.shadows is not None) is kept  # 40 GPUs


def test_a_large_pool_s_shadows_count_reuse_in_coarser_blocks_to_fit_their_memory(
    model: PrefillModel,
) -> None:
    """Each shadow caches as many tokens as the pool: past ``shadow_memory_mib`` its
    blocks double until they fit (each counting that many more tokens)."""
    fits = shadow_mod.SHADOWS_PLANNED * shadow_mod.BLOCK_BYTES
    assert shadow_mod.block_tokens(1000 * 512, fits * 1000) == SHADOW_BLOCK_TOKENS
    assert shadow_mod.block_tokens(1001 * 512, fits * 1000) == 2 * SHADOW_BLOCK_TOKENS
    assert shadow_mod.block_tokens(4000 * 512, fits * 1000) == 4 * SHADOW_BLOCK_TOKENS
    for mib, stride in ((256, 1), (1, 4)):
        ps = PlannerSettings(shadow=True, shadow_memory_mib=mib)
        c = shadowed(model, "6xCP4+2xCP8", ps)  # 40 GPUs x 100 blocks: ~3.2 MB of shadows
        assert c.shadows is not None and c.shadows.stride == stride
        c.shadows.follow([Composition.parse("6xCP4+2xCP8")])
        (s,) = c.shadows.shadows.values()
        assert (s.block_size, len(s.cached(0))) == (BLOCK * stride, 0)
    with pytest.raises(ValueError, match="shadow_memory_mib must be >= 1, got 0"):
        PlannerSettings(shadow_memory_mib=0)


def test_a_shadow_drops_its_records_once_a_quarter_are_past_the_horizon(
    model: PrefillModel,
) -> None:
    """Dropping moves the records kept: at every comparison it would move a large
    pool's whole horizon each window. The comparison reads the horizon only."""
    b = bank(model, horizon_s=600.0, warmup_s=0.0)
    small, big = Composition.parse("4xCP4"), Composition.parse("2xCP8")
    b.follow([small, big])
    n = 6000
    arrivals = np.linspace(0.0, 600.0, n)
    for comp in (small, big):
        b.shadows[comp].arrivals.frombytes(arrivals.tobytes())
        b.shadows[comp].ttfts.frombytes(np.linspace(0.1, 1.0, n).tobytes())
    b.now_s = 700.0  # a sixth of the records out of the horizon: kept, not compared
    (c,) = b.compare(small)
    assert len(b.shadows[small].ttfts) == n and c.requests == np.sum(arrivals >= 100.0)
    b.now_s = 760.0  # over a quarter: dropped
    (c,) = b.compare(small)
    assert len(b.shadows[small].ttfts) == len(b.shadows[big].ttfts) == c.requests
    assert c.requests == np.sum(arrivals >= 160.0)


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


def _steady_stretches(*stretches: tuple[float, float, float, int]) -> Trace:
    """One trace of synthetic stretches, each (start s, seconds, requests/s, seed) at
    a steady rate, laid end to end and numbered in order."""
    traces = [
        (start, generate(SyntheticConfig(
            duration_s=seconds, mean_rate=rate, max_length=8192, peak_to_trough=1.0
        ), seed=seed))
        for start, seconds, rate, seed in stretches
    ]  # fmt: skip
    requests = [
        replace(q, arrival_s=start + q.arrival_s) for start, t in traces for q in t.requests
    ]
    return replace(traces[0][1], requests=[replace(q, id=i) for i, q in enumerate(requests)])


def test_after_a_change_of_arrivals_the_shadows_compare_only_what_came_since(
    model: PrefillModel,
) -> None:
    """Ten minutes at a light load, then five at five times the rate: once the what-if
    check finds the change and the new rate has lasted a minute
    (``shadow_restart_s``), the shadows' comparisons leave out the light minutes
    (another load's evidence), so they neither move the pool on them nor veto the
    check's moves with them."""

    trace = _steady_stretches((0.0, 600.0, 3.0, 4), (600.0, 300.0, 15.0, 5))
    ps = PlannerSettings(shadow=True, shadow_warmup_s=10.0, shadow_min_s=60.0)
    sim = build_adaptive(trace, model, AdaptiveOptions(control=ps, history_s=None))
    sim.run(trace.requests)
    compared = [
        (w["end_s"], w["shadow"]) for w in sim.attachments["controller"].windows if w.get("shadow")
    ]
    before = [spans for end, spans in compared if 500 < end <= 600]
    after = [(end, spans) for end, spans in compared if end > 670]
    assert before and after
    assert all(c["span_s"] > 400 for spans in before for c in spans)  # minutes of light load
    for end, spans in after:  # the change found within a hop or two of 600 s
        assert all(c["span_s"] <= end - 595.0 for c in spans), (end, spans)
    assert max(c["span_s"] for _, spans in after for c in spans) >= 200  # and compared since


def test_a_burst_does_not_restart_the_shadows_comparison(model: PrefillModel) -> None:
    """Ten minutes at a light load with 15 s at five times the rate in their middle:
    the check finds the burst as a change of arrivals, but a minute after it
    (``shadow_restart_s``) the rate is back where it was, so the shadows' comparison
    keeps the minutes before it. With ``shadow_restart_s`` 0 the burst restarts it."""

    trace = _steady_stretches((0.0, 400.0, 3.0, 4), (400.0, 15.0, 15.0, 5), (415.0, 385.0, 3.0, 6))

    def spans(restart_s: float) -> list[tuple[float, float]]:
        ps = PlannerSettings(
            shadow=True, shadow_warmup_s=10.0, shadow_min_s=60.0, shadow_restart_s=restart_s
        )
        sim = build_adaptive(trace, model, AdaptiveOptions(control=ps, history_s=None))
        sim.run(trace.requests)
        ctl = sim.attachments["controller"]
        assert any(w["whatif"]["change_statistic"] for w in ctl.windows if w.get("whatif"))
        return [
            (w["end_s"], max(c["span_s"] for c in w["shadow"]))
            for w in ctl.windows
            if w.get("shadow")
        ]

    kept = [(end, span) for end, span in spans(60.0) if end > 405]
    restarted = [(end, span) for end, span in spans(0.0) if end > 405]
    assert kept and restarted
    assert all(span > 350 for _, span in kept), kept  # the minutes before the burst
    assert all(span <= end - 395.0 for end, span in restarted), restarted


def _merging_to_4xcp4_3xcp8(
    model: PrefillModel, **settings: float
) -> tuple[Controller, planner.WindowObservation, tuple[planner.Op, ...]]:
    """A controller with shadows on 10xCP4, its window observation, and the three
    merges that lead to 4xCP4+3xCP8: step 3 of a five-step path, where the shadows
    follow steps 1, 2, 4 and 5."""
    ps = PlannerSettings(shadow=True, **settings)  # type: ignore[arg-type]
    c = shadowed(model, "10xCP4", ps)
    layout = c.state.layout
    obs = planner.WindowObservation(
        demand_s=1.0,
        requests=10,
        long_requests=0,
        workers=tuple(planner.WorkerObservation(s.worker) for s in layout.slots),
    )
    ops = tuple(st.op for st in planner.free_path(layout, (), "merge", ps, obs.workers, limit=3))
    assert c._after(layout, ops) == Composition.parse("4xCP4+3xCP8")
    c._compared_with = layout.composition  # the comparisons the tests set are against it
    return c, obs, ops


def _agreeing(proposed_mean_s: float) -> WhatIf:
    """The check's verdict on the merges of :func:`_merging_to_4xcp4_3xcp8`: it agrees,
    the target's mean ``proposed_mean_s`` against 1 s here (P90s twice the means)."""
    return WhatIf(
        current=Estimate(Composition.parse("10xCP4"), 1.0, 2.0, 100),
        candidates=(),
        proposed=Estimate(
            Composition.parse("4xCP4+3xCP8"), proposed_mean_s, 2 * proposed_mean_s, 100
        ),
        verdict="agree",
    )


def test_a_move_that_passes_a_composition_the_shadows_find_worse_is_held_back(
    model: PrefillModel,
) -> None:
    """A step on the way to the target that the shadows find worse than the current
    composition holds the move back, as the target itself does; one beyond the
    target, one they find better, or one compared too briefly does not."""
    c, obs, ops = _merging_to_4xcp4_3xcp8(model)
    for comp, gain, span_s, held in (
        ("6xCP4+2xCP8", -0.05, 300.0, True),  # on the way, worse
        ("8xCP4+1xCP8", -0.05, 300.0, True),  # the first step, worse
        ("4xCP4+3xCP8", -0.05, 300.0, True),  # the target itself, worse
        ("6xCP4+2xCP8", 0.05, 300.0, False),  # on the way, better
        ("2xCP4+4xCP8", -0.05, 300.0, False),  # beyond the target
        ("6xCP4+2xCP8", -0.05, 100.0, False),  # fewer seconds than shadow_min_s
    ):
        c._compared = (Comparison(Composition.parse(comp), 1000, span_s, gain, gain),)
        assert c._shadow_veto(c.state, obs, ops, None) is held, (comp, gain, span_s)


def test_after_a_move_the_shadows_compare_against_the_composition_the_pool_has(
    model: PrefillModel,
) -> None:
    """Between a move and the next window's look the shadows' last comparison is
    against the composition the pool left: it says nothing about a move from the
    one it has now, whose shadow they compare against afresh (a decisive window one
    hop after the shadows' own move undid it, the 256-GPU azure-code light cell)."""
    trace = generate(SyntheticConfig(duration_s=120.0, mean_rate=12.0, max_length=8192), seed=1)
    c, obs, ops = _merging_to_4xcp4_3xcp8(model, shadow_warmup_s=5.0, shadow_min_s=60.0)
    c._compared = (Comparison(Composition.parse("6xCP4+2xCP8"), 1000, 300.0, -0.05, -0.05),)
    assert c._shadow_veto(c.state, obs, ops, None) is True
    c._compared_with = Composition.parse("8xCP4+1xCP8")  # the pool's before a move
    assert c._shadow_veto(c.state, obs, ops, None) is False  # its shadows served nothing
    assert c.shadows is not None
    c.shadows.follow(Composition.parse(x) for x in ("10xCP4", "8xCP4+1xCP8", "6xCP4+2xCP8"))
    c.shadow_serve(trace.requests)
    afresh = c.shadows.compare(Composition.parse("10xCP4"))
    assert afresh and all(x.span_s >= 60.0 and x.weighed(0.5) < 0 for x in afresh)
    assert c._shadow_veto(c.state, obs, ops, None) is True
    c._anchor_s = c.shadows.now_s - 30.0  # a move the shadows did not decide, 30 s ago
    assert c._shadow_veto(c.state, obs, ops, None) is False


def test_a_decisive_estimate_is_held_to_the_shadows_on_its_own_window(
    model: PrefillModel,
) -> None:
    """The window's cold replay claims 20 % for the merges; the shadows, serving the
    same short requests warm, find its first steps slower on that window: held back,
    whatever their older comparisons say. Without a warm comparison of the window
    (no shadows served it) a decisive estimate goes through, as it did before."""
    trace = generate(SyntheticConfig(duration_s=120.0, mean_rate=12.0, max_length=8192), seed=1)
    c, obs, ops = _merging_to_4xcp4_3xcp8(model, shadow_warmup_s=5.0)
    current = Composition.parse("10xCP4")
    check = _agreeing(0.8)
    assert c.shadows is not None
    c.shadows.follow(
        Composition.parse(x) for x in ("10xCP4", "8xCP4+1xCP8", "6xCP4+2xCP8", "2xCP4+4xCP8")
    )
    assert c._shadow_veto(c.state, obs, ops, check) is False  # nothing served yet
    c.shadow_serve(trace.requests)
    window = c.shadows.compare(current, c.shadows.now_s - c.settings.window_s)
    assert window and all(x.weighed(0.5) < 0 for x in window if x.composition != current)
    c._compared = ()  # no older comparison: the window's decides
    assert c._shadow_veto(c.state, obs, ops, check) is True
    # A gain below whatif_decisive is held to the older comparisons (none here).
    assert c._shadow_veto(c.state, obs, ops, _agreeing(0.95)) is False


def test_a_decisive_estimate_is_held_to_the_shadows_over_minutes_too(
    model: PrefillModel,
) -> None:
    """A decisive gain on the whole window, no change of arrivals found, is a burst
    of a steady load: the shadows' comparison over minutes holds it back as it
    holds any other move, even where none of them served the window (the toolagent
    moderate cell on 256 GPUs split on its bursts' windows and stood split for
    minutes, docs/benchmarks/adaptive.md). After a change of arrivals: the next test."""
    c, obs, ops = _merging_to_4xcp4_3xcp8(model)
    check = _agreeing(0.8)
    assert c.shadows is not None and not c.shadows.compare(Composition.parse("10xCP4"), 0.0)
    for gain, held in ((-0.05, True), (0.05, False)):
        c._compared = (Comparison(Composition.parse("6xCP4+2xCP8"), 1000, 300.0, gain, gain),)
        assert c._shadow_veto(c.state, obs, ops, check) is held, gain


@pytest.mark.parametrize(
    ("last_hops", "held"),
    [
        ((5, 5), False),  # the long share moved: another mix, which they have not compared
        ((50, 0), True),  # the rate alone: the first seconds of a burst, as far as they know
    ],
)
def test_a_decisive_estimate_since_a_change_is_held_only_if_the_mix_did_not_move(
    model: PrefillModel, last_hops: tuple[int, int], held: bool
) -> None:
    """A decisive gain on the requests since a change of arrivals moves at once where
    the change moved the share of long requests; where it moved the rate alone it is
    held to the shadows' minutes as a burst's is (the 256-GPU azure-code light cell
    split at a burst's peak and stood split after it, docs/benchmarks/adaptive.md)."""
    c, obs, ops = _merging_to_4xcp4_3xcp8(model)
    hops = c.settings.hops_per_window
    ids = iter(range(10_000))
    for h in range(hops):
        short, long = (10, 0) if h < hops - 2 else last_hops
        for n, length in ((short, 1024), (long, 40_000)):
            for _ in range(n):
                r = Request(next(ids), h * c.settings.hop + 0.1, length, (next(ids),))
                c.windows.placed(r, 0.01)
        if h < hops - 1:
            c.windows.close_hop()
    assert len(c.windows.hop_counts()) == hops
    since = replace(_agreeing(0.8), change=Change(hops=2, statistic=100.0), since_s=5.0)
    c._compared = (Comparison(Composition.parse("6xCP4+2xCP8"), 1000, 300.0, -0.05, -0.05),)
    assert c._shadow_veto(c.state, obs, ops, since) is held


def test_a_move_between_windows_is_held_to_the_shadows_as_one_at_a_window(
    model: PrefillModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The looks between two windows' (every ``check_hops``-th) may move the pool
    too, on a decisive gain; the shadows' veto holds those back as it does a
    window's. Before, it ran at the windows' looks only, and a decisive estimate
    between them undid the shadows' move at once, three times in one run (the
    toolagent moderate cell on 256 GPUs, docs/benchmarks/adaptive.md)."""
    c, obs, ops = _merging_to_4xcp4_3xcp8(model)
    check = _agreeing(0.95)

    class Replays:  # the check's replays, whose verdict _check gives below
        def __enter__(self) -> Replays:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

    monkeypatch.setattr(c, "_replays", lambda before, reconfiguring: Replays())
    monkeypatch.setattr(c, "_check", lambda *args, **kwargs: (check, ops))
    running = {s.worker: 0.0 for s in c.state.layout.slots}
    while not c.windows.ready:
        c.windows.close_hop()
    for worse, held in ((-0.05, True), (0.05, False)):
        c._evaluations = 3  # a look between two windows'
        c._compared = (Comparison(Composition.parse("6xCP4+2xCP8"), 1000, 300.0, worse, worse),)
        tick = c.tick(running, reconfiguring=False)
        assert (tick.ops == ()) is held, worse
        assert tick.whatif is not None
        assert (tick.whatif.verdict == "shadow-veto") is held
