"""``bench/whatif_vs_sim.py``: the what-if replay next to the simulator on one stretch.

Without prefix reuse the replay is the simulator's queueing and placement, so the
two agree to the float; that is the base the bias is measured from
(docs/benchmarks/adaptive.md, "How noisy one run is")."""

from __future__ import annotations

import math

import pytest

from tests.conftest import bench_script
from vertumnus.core import whatif
from vertumnus.core.placement import PlacementParams
from vertumnus.core.types import Composition
from vertumnus.profiles import load_model
from vertumnus.sim.traces import load_trace


def test_without_reuse_the_replay_is_the_simulator():
    b = bench_script("whatif_vs_sim.py")
    trace = load_trace("synthetic:duration_s=120,mean_rate=30", seed=3)
    requests = b.without_reuse(list(trace.requests), 2.0)
    keys = [k for q in requests for k in q.block_keys]
    assert len(keys) == len(set(keys))
    assert [q.arrival_s for q in requests] == [2.0 * q.arrival_s for q in trace.requests]
    comps = [Composition.parse("10xCP4"), Composition.parse("6xCP4+2xCP8")]
    got = b.compare(requests, trace.block_size, comps, PlacementParams(), 20.0, first_idle=True)
    sim_s, replay_s, n, first_idle_s = got.sim_s, got.replay_s, got.requests, got.first_idle_s
    assert n == sum(q.arrival_s >= 20.0 for q in requests) > 100
    assert replay_s == pytest.approx(sim_s, rel=1e-9)
    # Which idle worker takes a request matters only through the caches.
    assert first_idle_s == pytest.approx(sim_s, rel=1e-9)
    assert sim_s[0] != sim_s[1]
    # Requests queue (TTFT above the mean isolated prefill): not just service times.
    model = load_model()
    scored = [q for q in requests if q.arrival_s >= 20.0]
    service = sum(model.predict(4, q.length, 0) for q in scored) / len(scored)
    assert sim_s[0] > 1.01 * service


def test_a_ttft_is_split_into_wait_and_prefill_in_both():
    b = bench_script("whatif_vs_sim.py")
    trace = load_trace("synthetic:duration_s=120,mean_rate=30", seed=3)
    comps = [Composition.parse("10xCP4"), Composition.parse("6xCP4+2xCP8")]
    params = PlacementParams()
    # Without reuse the two are the same request by request, and reuse nothing.
    alone = b.without_reuse(list(trace.requests), 2.0)
    got = b.compare(alone, trace.block_size, comps, params, 20.0)
    for i, part in enumerate(b.decompose(alone, got, trace.block_size, comps, params, 20.0, None)):
        sim, rep = part["simulator"], part["replay"]
        assert rep["wait_s"] == pytest.approx(sim["wait_s"], rel=1e-9, abs=1e-12)
        assert rep["prefill_s"] == pytest.approx(sim["prefill_s"], rel=1e-9)
        assert sim["reused_tokens"] == rep["reused_tokens"] == rep["reused_share"] == 0.0
        assert sim["wait_s"] + sim["prefill_s"] == pytest.approx(got.sim_s[i], rel=1e-9)
    # With reuse: the parts add up to each side's mean TTFT, and the replay reuses
    # some prefixes and misses others.
    requests = list(trace.requests)
    got = b.compare(requests, trace.block_size, comps, params, 20.0)
    parts = b.decompose(requests, got, trace.block_size, comps, params, 20.0, None)
    for i, part in enumerate(parts):
        sim, rep = part["simulator"], part["replay"]
        assert sim["wait_s"] + sim["prefill_s"] == pytest.approx(got.sim_s[i], rel=1e-9)
        assert rep["wait_s"] + rep["prefill_s"] == pytest.approx(got.replay_s[i], rel=1e-9)
        assert sim["reused_tokens"] > 0 and rep["reused_tokens"] > 0
        assert 0.0 < rep["reused_share"] <= 1.0
    # Window by window, as the controller replays them: both sides over the whole
    # windows' requests only (20-45, 45-70 and 70-95 s).
    windows = b.decompose(requests, got, trace.block_size, comps, params, 20.0, 25.0)
    inside = [q.id for q in requests if 20.0 <= q.arrival_s < 95.0]
    assert len(inside) < len(got.served[0])
    waits = [got.served[0][i][0] for i in inside]
    assert windows[0]["simulator"]["wait_s"] == pytest.approx(sum(waits) / len(waits))
    # Each window starts cold: less reuse than on the whole stretch.
    assert windows[0]["replay"]["reused_share"] < parts[0]["replay"]["reused_share"]


def test_windows_are_replayed_one_by_one_as_the_controller_replays_them():
    b = bench_script("whatif_vs_sim.py")
    trace = load_trace("synthetic:duration_s=120,mean_rate=30", seed=3)
    requests = list(trace.requests)
    comps = [Composition.parse("10xCP4"), Composition.parse("6xCP4+2xCP8")]
    params = PlacementParams()
    got = b.compare(requests, trace.block_size, comps, params, 20.0)
    assert set(got.cached) == {q.id for q in requests}
    gains = b.window_gains(requests, got.cached, trace.block_size, comps, params, 20.0, 25.0)
    # 20-45, 45-70, 70-95 s: the window 95-120 s would end past the last arrival.
    assert gains.shape == (3, 2, 2)
    assert (gains[:, 0] == 0.0).all()
    window = [
        (q.arrival_s, q.length, got.cached[q.id], q.block_keys)
        for q in requests
        if 45.0 <= q.arrival_s < 70.0
    ]
    table = whatif.RequestTable(window, trace.block_size, load_model(), (4, 8))
    e = [whatif.estimate(table, c, params) for c in comps]
    assert gains[1, 1, 0] == pytest.approx(1.0 - e[1].mean_s / e[0].mean_s, rel=1e-12)
    assert gains[1, 1, 1] == pytest.approx(1.0 - e[1].p90_s / e[0].p90_s, rel=1e-12)
    assert gains[1, 1, 0] != gains[1, 1, 1]


def test_bad_arguments_are_refused_by_name(capsys):
    b = bench_script("whatif_vs_sim.py")
    with pytest.raises(SystemExit):
        b.main(["--trace", "synthetic:duration_s=10", "--no-reuse", "0"])
    assert "--no-reuse" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        b.main(["--trace", "synthetic:duration_s=10", "--windows", "-5"])
    assert "--windows" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        b.main(["--family", "toolagent", "--load", "light", "--phases", "10s:rate=1"])
    assert "--phases reshapes --trace" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="--trace SPEC"):
        b.main([])
    with pytest.raises(SystemExit):
        b.main(["--family", "toolagent", "--load", "light", "--gpus", "256"])
    assert "--compositions must each be of --gpus 256 GPUs" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        b.main(["--family", "toolagent", "--load", "light", "--gpus", "0"])
    assert "--gpus" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        b.main(["--trace", "synthetic:duration_s=10", "--windows", "5", "--ancestors"])
    assert "--ancestors varies the held window replays" in capsys.readouterr().err


def test_a_family_cell_is_scaled_to_the_gpus_asked_for(monkeypatch):
    b = bench_script("whatif_vs_sim.py")
    asked = []

    def workload(family, load, draw=None, gpus=b.families.GPUS, spread="populations"):
        asked.append((family, load, draw, gpus, spread))
        raise SystemExit("stop here")

    monkeypatch.setattr(b.families, "workload", workload)
    with pytest.raises(SystemExit, match="stop here"):
        b.main(["--family", "toolagent", "--load", "light", "--draw", "1", "--gpus", "256",
                "--compositions", "62xCP4+1xCP8,64xCP4"])  # fmt: skip
    assert asked == [("toolagent", "light", 1, 256, "populations")]


def test_the_first_idle_replay_breaks_ties_as_placement_did():
    # r0 (long) runs at worker 0, r1 (carrying prefix Q) at worker 1, which is
    # idle first. r2 comes when both are idle: the first-idle replay gives it to
    # worker 0 (the first of equal costs), the shipped replay to worker 1 (the
    # longest idle, as placement now does too).
    # r3 reuses Q while r2 runs: it finds Q's holder idle only in the first case.
    b = bench_script("whatif_vs_sim.py")
    model = load_model()
    q = tuple(range(1, 21))  # 20 blocks of 512
    e0 = model.predict(4, 30000, 0)
    rows = [
        (0.0, 30000, 0, (100,)),
        (0.0, 10240, 0, q),
        (e0 + 1.0, 8000, 0, (200,)),
        (e0 + 1.01, 10752, 10240, (*q, 99)),
    ]
    table = whatif.RequestTable(rows, 512, model, (4,))
    fixed = PlacementParams(beta=1.0, lam=0.0, beta_busy=1.0)
    pool = Composition.parse("2xCP4")
    e1, e2 = model.predict(4, 10240, 0), model.predict(4, 8000, 0)
    hit = model.predict(4, 512, 10240)
    first_idle = whatif.estimate(table, pool, fixed, variant=b.first_idle_replay)
    assert first_idle.mean_s == pytest.approx((e0 + e1 + e2 + hit) / 4)
    assert whatif.estimate(table, pool, fixed).mean_s > (e0 + e1 + e2 + hit) / 4 + 1e-3


def test_cached_before_asks_for_windows(capsys):
    b = bench_script("whatif_vs_sim.py")
    with pytest.raises(SystemExit):
        b.main(["--trace", "synthetic:duration_s=60,mean_rate=5", "--cached-before", "anywhere"])
    assert (
        "--cached-before changes the window replays; give --windows too" in capsys.readouterr().err
    )


def test_held_windows_start_where_the_first_pool_held_each_prefix():
    """``--cached-before held``: each window's replays start from the first
    composition's simulated placements, carried along the controller's path to the
    others; a composition no one-way path reaches is not estimated."""
    from vertumnus.core import planner, probes

    b = bench_script("whatif_vs_sim.py")
    trace = load_trace("synthetic:duration_s=120,mean_rate=30", seed=3)
    requests = list(trace.requests)
    comps = [Composition.parse(c) for c in ("6xCP4+2xCP8", "10xCP4", "2xCP4+4xCP8")]
    params = PlacementParams()
    got = b.compare(requests, trace.block_size, comps, params, 20.0)
    assert set(got.workers) == {q.id for q in requests}
    cold = b.window_gains(requests, got.cached, trace.block_size, comps, params, 20.0, 25.0)
    held = b.window_gains(
        requests, got.cached, trace.block_size, comps, params, 20.0, 25.0, placed_on=got.workers
    )
    assert held.shape == cold.shape and not (held == cold).all()
    # The second window by hand: the split's replay from the first pool's holders.
    inside = [q for q in sorted(requests, key=lambda q: q.arrival_s) if 45.0 <= q.arrival_s < 70.0]
    rows = [(q.arrival_s, q.length, got.cached[q.id], q.block_keys) for q in inside]
    table = whatif.RequestTable(
        rows, trace.block_size, load_model(), (4, 8), [got.workers[q.id] for q in inside]
    )
    assert (table.held_before() >= 0).any()  # prefixes cached before the window
    layout = planner.layout_for(comps[0])
    idle = [planner.WorkerObservation(s.worker, 0.0, 0.0) for s in layout.slots]
    split = planner.free_path(
        layout, (), "split", planner.PlannerSettings(degrees=(4, 8)), idle, target=comps[1]
    )
    heirs = probes.Heirs(layout)
    at = whatif.holder_rows(table.held_before(), heirs.workers)
    e = [
        whatif.estimate(table, c, params, held=whatif.holders_on(at, heirs.after(p)))
        for c, p in ((comps[0], []), (comps[1], split))
    ]
    assert held[1, 1, 0] == pytest.approx(1.0 - e[1].mean_s / e[0].mean_s, rel=1e-12)
    # A merge path reaches 2xCP4+4xCP8 as well.
    assert not math.isnan(held[1, 2, 0])
    # From 10xCP4, 4xCP2+6xCP4+1xCP8 needs a split and a merge: no one-way path.
    ten, mixed = Composition.parse("10xCP4"), Composition.parse("4xCP2+6xCP4+1xCP8")
    paths = b.held_paths([ten, comps[0], mixed], [2, 4, 8])[1]
    assert paths[1] is not None and paths[1][-1].composition == comps[0]
    assert paths[2] is None


def test_held_windows_are_decomposed_as_they_are_replayed():
    """``--decompose`` with ``--cached-before held``: the parts of the windows replayed
    from the first pool's cache add up to those replays' TTFTs, reuse more than the
    cold windows, and a composition no one-way path reaches has none."""
    b = bench_script("whatif_vs_sim.py")
    trace = load_trace("synthetic:duration_s=120,mean_rate=30", seed=3)
    requests = list(trace.requests)
    comps = [Composition.parse(c) for c in ("10xCP4", "6xCP4+2xCP8", "4xCP2+6xCP4+1xCP8")]
    params = PlacementParams()
    got = b.compare(requests, trace.block_size, comps, params, 20.0)
    cold = b.decompose(requests, got, trace.block_size, comps, params, 20.0, 25.0)
    held = b.decompose(requests, got, trace.block_size, comps, params, 20.0, 25.0, got.workers)
    assert held[2] is None and cold[2] is not None
    for warm, first in zip(held[:2], cold[:2], strict=True):
        assert warm is not None and first is not None
        assert warm["simulator"] == first["simulator"]  # the same requests
        assert warm["replay"]["reused_tokens"] > first["replay"]["reused_tokens"]
    # The first composition's parts are those of its held window replays, request by request.
    heirs = b.held_paths(comps, [2, 4, 8])[0]
    ttfts = []
    for inside in b.windows(requests, 20.0, 25.0):
        rows = b.replay_rows(inside, got.cached, -math.inf, math.inf)
        on = [got.workers[q.id] for q in inside]
        table = whatif.RequestTable(rows, trace.block_size, load_model(), (2, 4, 8), on)
        at = whatif.holder_rows(table.held_before(), heirs.workers)
        e = whatif.estimate(table, comps[0], params, held=whatif.holders_on(at, heirs.after([])))
        ttfts += [e.mean_s] * e.requests
    first = held[0]
    assert first is not None
    mean = first["replay"]["wait_s"] + first["replay"]["prefill_s"]
    assert mean == pytest.approx(sum(ttfts) / len(ttfts), rel=1e-9)


def test_the_ancestors_variant_reuses_a_shorter_prefix_where_the_whole_one_is_not_held():
    """``--ancestors``: without shorter prefixes to reuse and with fewer holders than
    the shipped bound, the variant is the shipped replay to the float; a request whose
    prefix is held only by a busy worker reuses, at an idle one, the shorter prefix
    that one holds."""
    b = bench_script("whatif_vs_sim.py")
    model, params, bs = load_model(), PlacementParams(), 16
    # Two CP4s. r0 and r1 start two conversations (a, b) on both workers; r2 extends
    # a's (reuses a2, whose ancestor a1 r1 does not carry); r3, arriving while
    # r2 runs, reuses a2 + a3 (held at r2's worker only, busy) and has a1 (reused by
    # r4 later, so a prefix id) held by both.
    a1, a2, a3, b1 = 11, 12, 13, 21
    rows = [
        (0.0, 4 * bs, 0, (a1, a2, 99)),
        (0.0, 4 * bs, 0, (a1, b1, 98)),
        (1.0, 40 * bs, 2 * bs, (a1, a2, a3) + tuple(range(200, 237))),
        (1.001, 40 * bs, 3 * bs, (a1, a2, a3) + tuple(range(300, 337))),
        (5.0, 2 * bs, bs, (a1, 97)),
    ]
    levels = b.ancestor_levels(rows, bs)
    table = whatif.RequestTable(rows, bs, model, (4,))
    ids = {k: int(table.reused[i]) for i, k in ((2, a2), (3, a3), (4, a1))}
    assert levels[3] == [(ids[a1], bs), (ids[a2], 2 * bs)]
    assert levels[2] == [(ids[a1], bs)] and levels[0] == levels[4] == []
    two = Composition.parse("2xCP4")
    lengths = [r[1] for r in rows]
    shipped = whatif.estimate(table, two, params, variant=whatif.replay_py)
    none = b.ancestors_replay
    alone = whatif.estimate(
        table, two, params,
        variant=lambda *a, **k: none(*a, levels=[[] for _ in rows], lengths=lengths, **k),
    )  # fmt: skip
    assert alone == shipped
    with_them = whatif.estimate(
        table, two, params,
        variant=lambda *a, **k: none(*a, levels=levels, lengths=lengths, **k),
    )  # fmt: skip
    # r3 no longer recomputes its whole prompt beside the busy worker: faster.
    assert with_them.mean_s < shipped.mean_s
