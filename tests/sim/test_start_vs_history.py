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


def test_unknown_families_are_refused():
    b = bench_script("start_vs_history.py")
    with pytest.raises(SystemExit):
        b.main(["--families", "mooncake,nosuch"])
