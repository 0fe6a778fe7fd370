"""``bench/start_vs_history.py``: a family cell's start next to the simulator's best for
its history (docs/benchmarks/adaptive.md, "What the remaining misses are not")."""

from __future__ import annotations

import json

import pytest

from tests.conftest import bench_script
from vertumnus.core import planner
from vertumnus.core.control import initial_composition
from vertumnus.profiles import load_capacity, load_model
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
    # The estimate's pick is where the adaptive pool starts.
    trace, _ = f.workload("toolagent", "light", 0)
    model, control = load_model(), parse_planner_settings("")
    lattice = planner.enumerate_lattice(f.GPUS, control.degrees, control.domain_size)
    start = initial_composition(
        trace.requests,
        trace.block_size,
        f.WARMUP_S,
        lattice,
        load_capacity(model.name),
        model,
        control,
    )
    assert got["estimate"]["pick"] == str(start)
    assert found[0]["runs"]["vertumnus-adaptive"]["timeline"][0]["composition"] == str(start)
    # Each pick held fixed is read from the stored fixed runs, against their best.
    runs = found[0]["runs"]
    for pick in (got["estimate"], got["simulator_on_history"]):
        fixed = runs[f"vertumnus:{pick['pick']}"]
        best = min(r["mean_ttft_s"] for k, r in runs.items() if k.startswith("vertumnus:"))
        assert pick["held"][0] == pytest.approx(fixed["mean_ttft_s"] / best)
        assert min(pick["held"]) >= 1.0
    assert got["adaptive"][0] == pytest.approx(runs["vertumnus-adaptive"]["mean_ttft_s"] / best)


def test_unknown_families_are_refused():
    b = bench_script("start_vs_history.py")
    with pytest.raises(SystemExit):
        b.main(["--families", "mooncake,nosuch"])
