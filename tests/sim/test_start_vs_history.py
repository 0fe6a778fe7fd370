"""``bench/start_vs_history.py``: a family cell's start next to the simulator's best for
its history (docs/benchmarks/adaptive.md, "What the remaining misses are not")."""

from __future__ import annotations

import json

import pytest

from tests.conftest import bench_script
from vertumnus.profiles import load_model
from vertumnus.sim.reconfig import build_adaptive
from vertumnus.sim.runner import parse_planner_settings


def test_the_start_it_judges_is_adaptives_and_each_pick_is_held_against_the_stored_runs():
    b = bench_script("start_vs_history.py")
    f = bench_script("families.py")
    stored = json.loads(b.STORED.read_text())
    found = [
        c
        for c in stored["cells"]
        if (c["family"], c["load"], c["draw"]) == ("toolagent", "light", 0)
    ]
    got = b.cell("toolagent", "light", 0, found[0])
    # The estimate's pick is where the family benchmark's adaptive pool starts.
    trace, _ = f.workload("toolagent", "light", 0)
    options = f.adaptive_options(trace, parse_planner_settings(""), draw=0)
    start = (
        build_adaptive(trace, load_model(), options).attachments["executor"].pool.layout.composition
    )
    assert got["estimate"]["pick"] == str(start)
    assert found[0]["runs"]["vertumnus-adaptive"]["timeline"][0]["composition"] == str(start)
    # Each pick held fixed is read from the stored fixed runs, against their best.
    runs = found[0]["runs"]
    best = min(r["mean_ttft_s"] for k, r in runs.items() if k.startswith("vertumnus:"))
    for pick in (got["estimate"], got["simulator_on_history"]):
        fixed = runs[f"vertumnus:{pick['pick']}"]
        assert pick["held"][0] == pytest.approx(fixed["mean_ttft_s"] / best)
        assert min(pick["held"]) >= 1.0
    assert got["adaptive"][0] == pytest.approx(runs["vertumnus-adaptive"]["mean_ttft_s"] / best)
    # Weight 0 on the P90 is the shipped start, on both sources.
    lattice = got["lattice"]
    for source in ("estimate", "simulator_on_history"):
        values = {n: v[source] for n, v in lattice.items()}
        assert b.weighed_pick(values, 0.0) == got[source]["pick"]
        assert lattice[got[source]["pick"]]["held"] == got[source]["held"]


def test_a_start_weighing_the_p90_trades_the_mean_for_it():
    b = bench_script("start_vs_history.py")
    values = {"a": [1.00, 1.10], "b": [1.02, 1.00], "c": [1.20, 1.01]}
    assert b.weighed_pick(values, 0.0) == "a"
    assert b.weighed_pick(values, 0.5) == "b"  # b: 0.51 + 0.50 = 1.01; a: 0.50 + 0.55 = 1.05
    assert b.weighed_pick(values, 1.0) == "b"
    # Ties go to the first.
    assert b.weighed_pick({"x": [1.0, 1.0], "y": [1.0, 1.0]}, 0.5) == "x"


def test_unknown_families_are_refused():
    b = bench_script("start_vs_history.py")
    with pytest.raises(SystemExit):
        b.main(["--families", "mooncake,nosuch"])


@pytest.mark.parametrize("weights", ["0,1.5", "half"])
def test_bad_p90_weights_are_refused_by_name(weights, capsys):
    b = bench_script("start_vs_history.py")
    with pytest.raises(SystemExit):
        b.main(["--p90-weights", weights])
    assert "--p90-weights" in capsys.readouterr().err
