"""The vertumnus-adaptive pool end to end, and the capacity profile it reads."""

from __future__ import annotations

import numpy as np
import pytest

from vertumnus.core import planner
from vertumnus.core.costmodel import PrefillModel
from vertumnus.core.start import history_requests
from vertumnus.core.types import Composition, Request
from vertumnus.profiles import capacity_from_dict, load_capacity
from vertumnus.sim import capacity
from vertumnus.sim.capacity import profile_degree
from vertumnus.sim.reconfig import AdaptiveOptions, build_adaptive
from vertumnus.sim.traces import Trace

from .helpers import two_phase_trace


def test_bundled_capacity_profile_covers_the_profile_degrees(model: PrefillModel) -> None:
    cap = load_capacity(model.name)
    assert set(cap.kappa_per_s) == set(model.degrees)
    assert all(k > 0 for k in cap.kappa_per_s.values())
    assert 0 < cap.target_attainment <= 1


def test_capacity_profile_rejects_malformed_data() -> None:
    with pytest.raises(ValueError, match="malformed"):
        capacity_from_dict({"kappa_per_s": {"four": 1}})


def test_profiling_measures_rising_demand_until_the_slo_breaks(model: PrefillModel) -> None:
    reqs = two_phase_trace().requests[:400]
    out = profile_degree(model, 8, reqs, 512, window_s=10.0, loads=(0.2, 0.6, 1.2))
    demand = [lv["demand_per_s"] for lv in out["levels"]]
    attainment = [lv["attainment"] for lv in out["levels"]]
    assert demand == sorted(demand)
    assert attainment[0] >= attainment[-1]
    passing = [lv["demand_per_s"] for lv in out["levels"] if lv["attainment"] >= 0.9]
    assert out["kappa_per_s"] == (max(passing) if passing else 0.0)


def test_history_uses_the_first_seconds_and_an_ideal_cache() -> None:
    keys = (1, 2, 3)
    trace = Trace(
        "h",
        (
            Request(0, 0.0, 1536, keys),
            Request(1, 5.0, 2048, keys + (4,)),
            Request(2, 50.0, 100, (9,)),
        ),
        512,
    )
    hist = history_requests(trace.requests, trace.block_size, 10.0)
    assert [(h.arrival_s, h.length, h.cached_tokens) for h in hist] == [
        (0.0, 1536, 0),
        (5.0, 2048, 1536),
    ]
    assert len(history_requests(trace.requests, trace.block_size)) == 3


def test_adaptive_pool_reconfigures_and_loses_nothing(model: PrefillModel) -> None:
    trace = two_phase_trace()
    opts = AdaptiveOptions(
        gpus=16,
        control=planner.PlannerSettings(window_s=5.0, persist_windows=2),
        initial=Composition.parse("2xCP8"),
    )
    sim = build_adaptive(trace, model, opts)
    result = sim.run(trace.requests)
    ids = sorted(c.request_id for c in result.completions)
    assert ids == list(range(len(trace)))
    assert result.rejected == []
    assert result.reconfigurations >= 1
    assert result.composition_timeline[0] == (0.0, "2xCP8")
    assert len(result.composition_timeline) == result.reconfigurations + 1
    for _, comp in result.composition_timeline:
        assert Composition.parse(comp).gpus == 16
    # The busy first phase splits (more lanes) before anything merges.
    executor = sim.attachments["executor"]
    assert executor.transitions[0].kind == "split"
    assert executor.transitions[0].started_s < 60.0
    controller = sim.attachments["controller"]
    assert controller.state.layout.composition == sim.composition
    # One decision time per evaluated window (its figures: bench/planner_speed.py).
    assert len(controller.decision_cost_s) == len(controller.windows) > 0
    assert len(controller.decision_met_gc) == len(controller.decision_cost_s)
    own = controller.own_decision_cost_s()
    assert len(own) == controller.decision_met_gc.count(False)
    assert set(own) <= set(controller.decision_cost_s)


def test_adaptive_pool_chains_a_transition_without_waiting_for_windows(
    model: PrefillModel,
) -> None:
    """Multi-step: the second split starts at the first one's commit, not a window later
    (the rules' transitions: the what-if check, which picks its own targets, is off)."""
    trace = two_phase_trace()
    runs = {}
    for multi in (True, False):
        opts = AdaptiveOptions(
            gpus=16,
            control=planner.PlannerSettings(
                window_s=5.0, persist_windows=2, multi_step=multi, whatif=False
            ),
            initial=Composition.parse("2xCP8"),
        )
        sim = build_adaptive(trace, model, opts)
        result = sim.run(trace.requests)
        assert sorted(c.request_id for c in result.completions) == list(range(len(trace)))
        runs[multi] = sim.attachments["executor"].transitions
    first, second = runs[True][:2]
    assert (first.kind, second.kind) == ("split", "split")
    assert second.started_s == first.committed_s  # started by advance() at the commit
    assert second.composition == "4xCP4" and first.reason.endswith("target 4xCP4")
    one_step = runs[False]
    assert one_step[1].started_s - one_step[0].started_s >= 5.0  # a window later


def test_adaptive_initial_composition_from_history(model: PrefillModel) -> None:
    trace = two_phase_trace()
    opts = AdaptiveOptions(gpus=16, history_s=30.0)
    sim = build_adaptive(trace, model, opts)
    # The first 30 s are the busy, short phase: the planner starts with lanes.
    assert sim.composition in planner.enumerate_lattice(16, (4, 8))
    assert sim.composition != Composition.parse("2xCP8")


def test_adaptive_rejects_degrees_outside_the_profile(model: PrefillModel) -> None:
    opts = AdaptiveOptions(gpus=32, control=planner.PlannerSettings(degrees=(16,), domain_size=16))
    with pytest.raises(ValueError, match="not in profile"):
        build_adaptive(two_phase_trace(), model, opts)


def test_adaptive_pool_runs_with_the_cache_manager_hook(model: PrefillModel) -> None:
    from vertumnus.core.cachemanager import CacheManager
    from vertumnus.core.policies.vertumnus import CostModelPolicy
    from vertumnus.sim.cachesim import attach_cache_manager
    from vertumnus.sim.engine import Simulation

    trace = two_phase_trace()
    opts = AdaptiveOptions(
        gpus=16,
        control=planner.PlannerSettings(window_s=5.0),
        initial=Composition.parse("2xCP8"),
    )
    sim = build_adaptive(
        trace,
        model,
        opts,
        lambda pool: Simulation(
            pool, CostModelPolicy(opts.placement), cache_manager=CacheManager()
        ),
    )
    attach_cache_manager(sim)
    result = sim.run(trace.requests)
    assert sorted(c.request_id for c in result.completions) == list(range(len(trace)))
    assert result.reconfigurations >= 1


def test_a_phase_change_is_met_within_a_look_of_it(model: PrefillModel) -> None:
    """The synthetic workload, flat, in two phases: a light long-heavy minute, then a
    busy short one. Judging on the requests since the change, the pool starts splitting
    at the first look after it (62.5 s) and serves the busy phase faster than when the
    check waits until the whole window holds the change (issue 12)."""
    from vertumnus.sim.phases import apply_phases
    from vertumnus.sim.traces import load_trace

    trace, _ = apply_phases(
        load_trace("synthetic:peak_to_trough=1"),
        "60s:rate=2,long=6,name=low;60s:rate=10,long=0.3,name=high",
        seed=0,
    )
    runs = {}
    for change in (25.0, 0.0):
        opts = AdaptiveOptions(
            gpus=40,
            control=planner.PlannerSettings(whatif_change=change),
            initial=Composition.parse("2xCP4+4xCP8"),
        )
        sim = build_adaptive(trace, model, opts)
        result = sim.run(trace.requests)
        assert sorted(c.request_id for c in result.completions) == list(range(len(trace)))
        busy = [c.ttft_s for c in result.completions if c.arrival_s >= 60.0]
        runs[change] = (sim.attachments["executor"].transitions, sum(busy) / len(busy))
    since, whole = runs[25.0], runs[0.0]
    assert since[0][0].kind == "split" and since[0][0].started_s == 62.5
    assert since[0][0].reason.endswith("on the last 2.5 s (a change of arrivals)")
    assert whole[0][0].started_s >= 70.0
    assert since[1] < 0.95 * whole[1]


def test_a_pool_of_workers_sustains_more_per_worker_than_one_alone(model: PrefillModel) -> None:
    # One worker makes every short request behind a long one wait; in a pool of
    # four, placement sends it around: at the same offered load per worker the
    # pool meets the SLO more often, and κ per worker is at least one worker's.
    rng = np.random.default_rng(0)
    lengths = [int(rng.integers(100000, 120000)) if i % 10 == 0 else 2000 for i in range(1600)]
    reqs = [
        Request(i, 0.0, n, tuple(range(i * 300, i * 300 + (n + 511) // 512)))
        for i, n in enumerate(lengths)
    ]
    loads = (0.3, 0.6, 0.95)
    alone = profile_degree(model, 4, reqs, 512, window_s=10.0, loads=loads)
    pool = profile_degree(model, 4, reqs, 512, window_s=10.0, loads=loads, workers=4)
    for a, b in zip(alone["levels"], pool["levels"], strict=True):
        assert b["demand_per_s"] == pytest.approx(a["demand_per_s"], rel=0.1)  # per worker
        assert b["attainment"] > a["attainment"]
    # At 95 % one worker alone misses the target; the pool meets it.
    assert alone["levels"][-1]["attainment"] < 0.9 <= pool["levels"][-1]["attainment"]
    assert alone["kappa_per_s"] < pool["kappa_per_s"]
    with pytest.raises(ValueError, match="at least one worker"):
        profile_degree(model, 4, reqs, 512, workers=0)


def test_the_capacity_cli_will_not_write_a_pool_measure_over_the_shipped_profile(capsys) -> None:
    with pytest.raises(SystemExit):
        capacity.main(["--trace", "unused.jsonl", "--workers", "4"])
    assert "give --out" in capsys.readouterr().err
