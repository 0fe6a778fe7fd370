"""The family benchmark's draws (``bench/families.py --draws``): successive stretches of
a cell's resampled source, each after a warm-up that is served but not scored."""

from __future__ import annotations

import json

import pytest

from tests.conftest import bench_script
from vertumnus.core.metrics import Completion


def test_a_draw_is_a_stretch_of_the_resampled_source_after_its_warm_up():
    from vertumnus.sim.phases import apply_phases

    f = bench_script("families.py")
    stored, scale = f.workload("toolagent", "light")
    second, scale1 = f.workload("toolagent", "light", 1)
    assert scale == scale1
    arrivals = [r.arrival_s for r in second]
    assert arrivals[0] >= 0.0 and arrivals[-1] < f.WARMUP_S + f.DURATION_S
    assert [r.id for r in second] == list(range(len(second)))
    # The source resampled over DURATION_S + WARMUP_S + DURATION_S, from DURATION_S
    # on, moved back by it.
    stream, _ = apply_phases(
        f.FAMILIES["toolagent"][1](), f"{2 * f.DURATION_S + f.WARMUP_S:g}s:rate={scale:.6g}"
    )
    later = [r for r in stream if r.arrival_s >= f.DURATION_S]
    assert len(later) == len(second)
    for a, b in zip(later[:50], second.requests[:50], strict=True):
        assert b.arrival_s == pytest.approx(a.arrival_s - f.DURATION_S)
        assert (a.length, a.block_keys) == (b.length, b.block_keys)
    # The same load as the stored stretch: as many requests per second, to a few percent.
    rate = len(second) / (f.WARMUP_S + f.DURATION_S)
    assert rate == pytest.approx(len(stored) / f.DURATION_S, rel=0.05)


def test_only_what_follows_the_warm_up_is_scored():
    f = bench_script("families.py")

    def done(arrival: float) -> Completion:
        return Completion(0, arrival, 100, 0, 0.1, 0, 4, 1.0)

    completions = [done(t) for t in (0.0, f.WARMUP_S - 1e-6, f.WARMUP_S, 900.0)]
    assert [c.arrival_s for c in f.scored(completions, 0)] == [f.WARMUP_S, 900.0]
    assert f.scored(completions, None) == completions


def test_a_replica_moves_every_arrival_by_less_than_the_jitter_and_nothing_else():
    f = bench_script("families.py")
    trace, _ = f.workload("toolagent", "light", 0)
    assert f.replica(trace, 0) is trace
    one, again, two = f.replica(trace, 1), f.replica(trace, 1), f.replica(trace, 2)
    assert [r.arrival_s for r in one] == [r.arrival_s for r in again]  # seeded
    assert [r.arrival_s for r in one] != [r.arrival_s for r in two]
    # Sorted by arrival again, so match each request by what it is.
    by_content = {(r.length, r.block_keys): r.arrival_s for r in trace}
    assert len(by_content) == len(trace)
    assert len(one) == len(trace)
    shifts = [r.arrival_s - by_content[(r.length, r.block_keys)] for r in one]
    assert min(shifts) >= 0.0 and max(shifts) < f.JITTER_S
    assert [r.arrival_s for r in one] == sorted(r.arrival_s for r in one)


def copy(adaptive: tuple[float, float], a: tuple[float, float], b: tuple[float, float]):
    """One copy of a toolagent light cell (10 requests): adaptive and two fixed
    compositions, A and B, each as (mean, P90)."""

    def run(mean: float, p90: float) -> dict[str, float]:
        return {"mean_ttft_s": mean, "p90_ttft_s": p90, "token_hit_rate": 0.5}

    return {
        "family": "toolagent",
        "load": "light",
        "draw": 0,
        "requests": 10,
        "runs": {
            "vertumnus-adaptive": {**run(*adaptive), "reconfigurations": 1},
            "vertumnus:A": run(*a),
            "vertumnus:B": run(*b),
        },
    }


def test_a_cell_of_several_copies_is_judged_on_their_means():
    f = bench_script("families.py")

    # A is luckier on copy 0, B better on average.
    cell = f.combine(
        [copy((1.0, 2.0), (0.9, 2.0), (1.0, 2.0)), copy((1.0, 2.0), (1.3, 2.4), (1.0, 2.0))]
    )
    assert cell["replicas"] == 2
    assert cell["best_fixed_mean"] == "vertumnus:B" and cell["best_fixed_p90"] == "vertumnus:B"
    assert cell["adaptive_vs_best_mean"] == pytest.approx(1.0)
    assert cell["replica0_adaptive_vs_best"][0] == pytest.approx(1.0 / 0.9)
    assert cell["runs"]["vertumnus:A"]["replicas"] == [[0.9, 2.0], [1.3, 2.4]]
    assert cell["runs"]["vertumnus:A"]["mean_ttft_s"] == pytest.approx(1.1)
    assert cell["best_fixed_spread"] == [0.0, 0.0]
    # One copy: the cell as it was, without the replica fields.
    single = f.combine([copy((1.0, 2.0), (0.9, 2.0), (1.0, 2.0))])
    assert single["best_fixed_mean"] == "vertumnus:A" and "replicas" not in single


def test_fixed_pools_in_hindsight_per_cell_and_per_workload():
    f = bench_script("families.py")

    def drawn(d: int, a: tuple[float, float], b: tuple[float, float], load: str = "light"):
        return {**copy((1.0, 1.0), a, b), "draw": d, "load": load}

    cells = [
        # Light: A best in draw 0, B in draw 1 (A is 2 % behind on the P90 there), both
        # in draw 2; no one composition meets all three draws.
        drawn(0, (1.0, 2.0), (1.0, 2.1)),
        drawn(1, (1.0, 2.04), (1.005, 2.0)),
        drawn(2, (1.0, 2.0), (1.0, 2.0)),
        # Moderate: the best mean is 3 % behind on the P90 and the best P90 3 % behind
        # on the mean: no fixed composition meets it.
        drawn(0, (1.0, 2.06), (1.03, 2.0), "moderate"),
    ]
    assert f.hindsight(cells) == {
        "some_fixed_composition": 3,
        "one_fixed_composition_per_workload": 2,
    }


def test_fixed_runs_from_an_earlier_output_judge_a_cell_as_if_run_again():
    f = bench_script("families.py")

    copies = [copy((1.0, 2.0), (0.9, 2.0), (1.0, 2.0)), copy((1.2, 2.2), (1.3, 2.4), (1.0, 2.1))]
    stored = f.combine(copies)
    # Adaptive alone, run again; the fixed compositions' copies read back from the cell.
    alone = [{**c, "runs": {"vertumnus-adaptive": c["runs"]["vertumnus-adaptive"]}} for c in copies]
    again = f.combine([f.with_stored_fixed(c, stored, r) for r, c in enumerate(alone)])
    for key in ("best_fixed_mean", "best_fixed_p90", "adaptive_vs_best_mean"):
        assert again[key] == stored[key]
    assert again["adaptive_vs_best_p90"] == pytest.approx(stored["adaptive_vs_best_p90"])
    assert again["replica0_adaptive_vs_best"] == pytest.approx(stored["replica0_adaptive_vs_best"])
    assert again["runs"]["vertumnus:A"]["replicas"] == [[0.9, 2.0], [1.3, 2.4]]
    # A cell of another stream is refused by name.
    with pytest.raises(SystemExit, match="toolagent light draw 0 has 10 requests stored"):
        f.with_stored_fixed({**alone[0], "requests": 11}, stored, 0)


def test_copies_past_the_stored_ones_bring_their_own_fixed_runs():
    f = bench_script("families.py")

    stored = f.combine([copy((1.0, 2.0), (0.9, 2.0), (1.0, 2.0))])  # one copy stored
    alone = copy((1.0, 2.0), (5.0, 5.0), (5.0, 5.0))["runs"]["vertumnus-adaptive"]
    first = f.with_stored_fixed({**stored, "runs": {"vertumnus-adaptive": alone}}, stored, 0)
    second = copy((1.2, 2.2), (1.3, 2.4), (1.0, 2.1))  # run whole, as copy 1 is
    cell = f.combine([first, second])
    assert cell["runs"]["vertumnus:A"]["replicas"] == [[0.9, 2.0], [1.3, 2.4]]
    assert cell["runs"]["vertumnus:B"]["replicas"] == [[1.0, 2.0], [1.0, 2.1]]
    assert cell["best_fixed_mean"] == "vertumnus:B"


@pytest.mark.parametrize(
    ("flag", "bad"),
    [("--draws", b) for b in ("x", "0,-1", "")]
    + [(flag, b) for flag in ("--replicas", "--gpus", "--lattice-step") for b in ("0", "x", "-2")],
)
def test_bad_draws_replicas_and_pool_sizes_are_refused_by_name(capsys, flag, bad):
    with pytest.raises(SystemExit):
        bench_script("families.py").main([flag, bad])
    assert flag in capsys.readouterr().err


def test_fixed_runs_of_other_draws_or_copies_are_refused(tmp_path, capsys):
    earlier = tmp_path / "earlier.json"
    earlier.write_text('{"draws": [0, 1], "replicas": 3, "cells": []}')
    families = bench_script("families.py")
    for argv in (["--replicas", "2"], ["--draws", "0,2", "--replicas", "3"], []):
        with pytest.raises(SystemExit):
            families.main(["--fixed-from", str(earlier), *argv])
        assert "--fixed-from" in capsys.readouterr().err
    # Fixed runs of another pool size.
    with pytest.raises(SystemExit):
        families.main(["--fixed-from", str(earlier), "--draws", "0,1", "--replicas", "3",
                       "--gpus", "256"])  # fmt: skip
    assert (
        "40 GPUs and spread compress, this run [0, 1], 3, 256 and populations"
        in capsys.readouterr().err
    )
    # Fixed runs of a large pool whose users came faster (made before 2026-12-07,
    # no spread stored), where this run has more users.
    large = tmp_path / "large.json"
    large.write_text('{"draws": [0], "replicas": 1, "gpus": 256, "cells": []}')
    with pytest.raises(SystemExit):
        families.main(["--fixed-from", str(large), "--draws", "0", "--gpus", "256"])
    assert (
        "256 GPUs and spread compress, this run [0], 1, 256 and populations"
        in capsys.readouterr().err
    )
    with pytest.raises(SystemExit):
        families.main(["--fixed-from", str(large), "--draws", "0", "--gpus", "256",
                       "--spread", "compress"])  # fmt: skip
    assert "no cell ('mooncake', 'light', 0)" in capsys.readouterr().err
    # The draws and copies match, but the earlier output has no such cell.
    with pytest.raises(SystemExit):
        families.main(["--fixed-from", str(earlier), "--draws", "1", "--replicas", "3"])
    assert "no cell ('mooncake', 'light', 1)" in capsys.readouterr().err


def test_decision_times_leave_out_the_ticks_that_met_a_full_garbage_collection():
    f = bench_script("families.py")
    got = f.decision_ms([0.001, 0.002, 0.250, 0.003], [0.001, 0.002, 0.003])
    assert got["decision_ms_max"] == pytest.approx(3.0)
    assert got["decision_ms_max_with_gc"] == pytest.approx(250.0)
    assert got["decision_ticks_with_full_gc"] == 1
    assert 2.0 < got["decision_ms_p99"] <= 3.0
    empty = f.decision_ms([], [])
    assert empty["decision_ms_max"] == empty["decision_ms_p99"] == 0.0


def test_a_larger_pool_gets_the_same_load_per_gpu_and_a_strided_lattice():
    from vertumnus.core import planner

    f = bench_script("families.py")
    small, scale = f.workload("toolagent", "light", 0)
    large, scale4 = f.workload("toolagent", "light", 0, gpus=160)
    assert scale4 == pytest.approx(4 * scale)
    assert len(large) == pytest.approx(4 * len(small), rel=0.05)
    settings = planner.PlannerSettings()
    lattice = list(planner.enumerate_lattice(256, settings.degrees, settings.domain_size))
    assert f.fixed_compositions(256, settings) == lattice and len(lattice) == 33
    strided = f.fixed_compositions(256, settings, 4)
    assert strided == lattice[::4] and len(strided) == 9
    # The last is kept where the step skips it.
    assert f.fixed_compositions(256, settings, 5) == [*lattice[::5], lattice[-1]]
    assert all(sum(c.degrees) == 256 for c in strided)


def _turn_gaps(trace) -> list[float]:
    """Seconds from each request back to the latest earlier request that ends on one of
    its full blocks (a conversation's previous turn, or a shared preamble's last user)."""
    last: dict[int, float] = {}
    gaps = []
    for r in trace:
        full = len(r.block_keys) - (1 if r.length % trace.block_size else 0)
        for key in reversed(r.block_keys[1:]):
            if key in last:
                gaps.append(r.arrival_s - last[key])
                break
        if full > 0:
            last[r.block_keys[full - 1]] = r.arrival_s
    return gaps


def test_a_larger_pool_gets_more_users_each_as_fast_as_on_forty_gpus():
    import numpy as np

    f = bench_script("families.py")
    small, scale = f.workload("toolagent", "light", 0)
    same, _ = f.workload("toolagent", "light", 0, spread="compress")
    assert [(r.arrival_s, r.block_keys) for r in same] == [
        (r.arrival_s, r.block_keys) for r in small
    ]
    more, scale4 = f.workload("toolagent", "light", 0, gpus=160)
    faster, _ = f.workload("toolagent", "light", 0, gpus=160, spread="compress")
    assert scale4 == pytest.approx(4 * scale)
    assert f.offered_load(more, 160) == pytest.approx(f.LOADS["light"], rel=0.03)
    assert [r.id for r in more] == list(range(len(more)))
    # A conversation's next turn comes as soon after its last as on 40 GPUs with
    # more users, four times sooner with the same users faster.
    base = np.median(_turn_gaps(small))
    assert np.median(_turn_gaps(more)) == pytest.approx(base, rel=0.2)
    assert np.median(_turn_gaps(faster)) < 0.4 * base
    with pytest.raises(ValueError, match="spread 'wider'"):
        f.workload("toolagent", "light", 0, gpus=160, spread="wider")


def test_a_finer_lattice_runs_only_the_fixed_compositions_the_stored_file_lacks(monkeypatch):
    from vertumnus.core import planner
    from vertumnus.sim.synthetic import SyntheticConfig, generate

    f = bench_script("families.py")
    tiny = generate(SyntheticConfig(duration_s=60.0, mean_rate=2.0), seed=3)
    monkeypatch.setattr(f, "workload", lambda family, load, draw, gpus, spread: (tiny, 1.0))
    lattice = f.fixed_compositions(40, planner.PlannerSettings())
    stored = tuple(f"vertumnus:{c}" for c in lattice[1:])
    cell = f.run_replica("toolagent", "light", "", True, None, 0, stored)
    assert set(cell["runs"]) == {"vertumnus-adaptive", f"vertumnus:{lattice[0]}"}
    whole = f.run_replica("toolagent", "light", "", True, None, 0)
    assert set(whole["runs"]) == {"vertumnus-adaptive", *(f"vertumnus:{c}" for c in lattice)}
    first = f"vertumnus:{lattice[0]}"
    assert whole["runs"][first]["mean_ttft_s"] == cell["runs"][first]["mean_ttft_s"]


def test_progress_prints_a_line_as_each_simulation_of_a_copy_ends(monkeypatch, capsys):
    from vertumnus.core import planner
    from vertumnus.sim.synthetic import SyntheticConfig, generate

    f = bench_script("families.py")
    tiny = generate(SyntheticConfig(duration_s=60.0, mean_rate=2.0), seed=3)
    monkeypatch.setattr(f, "workload", lambda family, load, draw, gpus, spread: (tiny, 1.0))
    lattice = f.fixed_compositions(40, planner.PlannerSettings())
    stored = tuple(f"vertumnus:{c}" for c in lattice[2:])
    f.run_replica("toolagent", "light", "", True, None, 0, stored)
    assert capsys.readouterr().err == ""
    cell = f.run_replica("toolagent", "light", "", True, None, 0, stored, progress=True)
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(": ")[1].split()[0] for line in lines] == [
        "vertumnus-adaptive",
        str(lattice[0]),
        str(lattice[1]),
    ]
    first = cell["runs"][f"vertumnus:{lattice[0]}"]
    assert lines[1].strip().startswith("toolagent light draw None copy 0:")
    assert f"mean {first['mean_ttft_s']:.4f} s" in lines[1]


def test_where_no_fixed_composition_meets_both_the_least_regret_is_the_yardstick(tmp_path, capsys):
    f = bench_script("families.py")

    # A has the best mean, B the best P90; C between them is 2 % behind on each.
    cell = f.combine([copy((1.01, 2.06), (1.0, 2.1), (1.05, 2.0))])
    cell["runs"]["vertumnus:C"] = {"mean_ttft_s": 1.02, "p90_ttft_s": 2.04}
    name, least, adaptive = f.least_regret(cell)
    assert name == "vertumnus:C" and least == pytest.approx(1.02)
    assert adaptive == pytest.approx(1.03)  # its P90, 2.06 / 2.0
    got = f.verdict([cell])
    assert got["within_1pct_mean_and_p90"] == 0 and got["fixed_in_hindsight"] == {
        "some_fixed_composition": 0,
        "one_fixed_composition_per_workload": 0,
    }
    assert got["least_regret"]["within_1pct"] == 1
    assert got["least_regret"]["worst_adaptive_over_least"] == pytest.approx(1.03 / 1.02)
    # Adaptive 2 % past the least regret misses it.
    cell["runs"]["vertumnus-adaptive"]["p90_ttft_s"] = 2.0808
    assert f.verdict([cell])["least_regret"]["within_1pct"] == 0
    # --judge reads an earlier output and runs nothing.
    cell = {**cell, "role": "evaluation", "rate_scale": 1.0}
    cell["runs"]["vertumnus-adaptive"]["timeline"] = [{"t_s": 0.0, "composition": "A"}]
    earlier = tmp_path / "earlier.json"
    earlier.write_text(json.dumps({"cells": [cell]}))
    assert f.main(["--judge", str(earlier)]) == 0
    out = capsys.readouterr().out
    assert "| toolagent | light, draw 0 | C | 1.020 / 1.020 | 1.020 | 1.040 | **1.020** |" in out
    assert json.loads(out.strip().splitlines()[-1]) == f.verdict([cell])


def test_later_copies_may_serve_only_the_compositions_near_the_best(tmp_path, capsys):
    f = bench_script("families.py")

    first = copy((1.0, 2.0), (1.0, 2.3), (1.2, 2.0))
    first["runs"]["vertumnus:C"] = {"mean_ttft_s": 1.1, "p90_ttft_s": 2.2, "token_hit_rate": 0.5}
    # A is best on the mean, B on the P90; C is 10 % behind on both.
    assert f.shortlist(first, 0.05) == {"vertumnus:A", "vertumnus:B"}
    assert f.shortlist(first, 0.1) == {"vertumnus:A", "vertumnus:B", "vertumnus:C"}
    # The later copy served A and B only: C is left out of the judgement, its figures kept.
    later = copy((1.0, 2.0), (1.1, 2.3), (1.2, 2.1))
    cell = f.combine([first, later])
    assert set(cell["runs"]) == {"vertumnus-adaptive", "vertumnus:A", "vertumnus:B"}
    assert cell["left_out"] == {"vertumnus:C": [1.1, 2.2]}
    assert cell["runs"]["vertumnus:A"]["replicas"] == [[1.0, 2.3], [1.1, 2.3]]
    # --near needs a stored file to pick from and copies it lacks; and a fraction.
    earlier = tmp_path / "earlier.json"
    earlier.write_text('{"draws": [0], "replicas": 1, "cells": []}')
    for argv in (["--near", "0.05"], ["--near", "0.05", "--fixed-from", str(earlier),
                                       "--draws", "0"]):  # fmt: skip
        with pytest.raises(SystemExit):
            f.main(argv)
        assert "--near needs --fixed-from" in capsys.readouterr().err
    for bad in ("x", "-0.1", "1.5"):
        with pytest.raises(SystemExit):
            f.main(["--near", bad])
        assert "--near wants a fraction" in capsys.readouterr().err


def test_adaptive_alone_against_a_near_file_serves_no_fixed_composition_again():
    f = bench_script("families.py")

    first = copy((1.0, 2.0), (1.0, 2.3), (1.2, 2.0))
    first["runs"]["vertumnus:C"] = {"mean_ttft_s": 1.1, "p90_ttft_s": 2.2, "token_hit_rate": 0.5}
    near = f.combine([first, copy((1.0, 2.0), (1.1, 2.3), (1.2, 2.1))])  # C left out
    lattice = ["vertumnus:A", "vertumnus:B", "vertumnus:C", "vertumnus:D"]
    # Its copies: every composition it served or left out is skipped (D, which it
    # lacks, is served: a finer lattice); past them, the near ones only.
    for r in (0, 1):
        assert sorted(f.skipped(near, r, 2, None, lattice)) == lattice[:3]
    assert sorted(f.skipped(near, 2, 2, 0.05, lattice)) == ["vertumnus:C", "vertumnus:D"]
    assert f.skipped(near, 2, 2, None, lattice) == ()
    assert f.skipped(None, 0, 0, None, lattice) == ()
