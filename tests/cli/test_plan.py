"""``vertumnus plan``: the ranking is the what-if estimate of every composition, the
recommendation is the simulator's adaptive start, and bad input is one clear line."""

import json

import pytest

from tests.cli.test_cli import run
from vertumnus.cli import main
from vertumnus.core import planner, whatif
from vertumnus.core.placement import PlacementParams
from vertumnus.core.start import history_requests, initial_composition
from vertumnus.core.types import Composition
from vertumnus.profiles import load_capacity, load_model
from vertumnus.sim.traces import load_trace

TRACE = "synthetic:duration_s=120"


def test_the_ranking_is_every_composition_estimated_and_the_best_is_the_adaptive_start(
    tmp_path, capsys
):
    out = tmp_path / "plan.json"
    assert main(["plan", "--trace", TRACE, "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    data = json.loads(out.read_text())
    lattice = planner.enumerate_lattice(40, (4, 8), 8)
    ranking = data["ranking"]
    assert sorted(r["composition"] for r in ranking) == sorted(map(str, lattice))
    means = [r["mean_s"] for r in ranking]
    assert means == sorted(means) and [r["rank"] for r in ranking] == list(range(1, 7))
    # Each figure is the what-if replay of the trace (reuse as an ideal cache finds it).
    model = load_model()
    trace = load_trace(TRACE)
    hist = history_requests(trace.requests, trace.block_size)
    rows = [
        (h.arrival_s, h.length, h.cached_tokens, r.block_keys)
        for h, r in zip(hist, trace.requests, strict=True)
    ]
    table = whatif.RequestTable(rows, trace.block_size, model, (4, 8))
    worst = ranking[-1]
    direct = whatif.estimate(table, Composition.parse(worst["composition"]), PlacementParams())
    assert worst["mean_s"] == round(direct.mean_s, 6) and worst["p90_s"] == round(direct.p90_s, 6)
    # The recommendation is where the simulator's adaptive pool would start.
    start = initial_composition(
        trace.requests, trace.block_size, None, lattice, load_capacity(model.name), model,
        planner.PlannerSettings(),
    )  # fmt: skip
    assert ranking[0]["composition"] == str(start)
    spec = data["cppool_spec"]
    assert spec["gpus"] == 40 and spec["degrees"] == [4, 8]
    assert (
        Composition.of([p["degree"] for p in spec["composition"] for _ in range(p["count"])])
        == start
    )
    assert data["operator_default"] == "5xCP8"
    assert f"start on {start}" in printed and "  composition:\n    - {count:" in printed


def test_degrees_and_a_history_window(capsys):
    assert (
        main(["plan", "--trace", TRACE, "--degrees", "2/4/8", "--history-s", "30", "--top", "3"])
        == 0
    )
    printed = capsys.readouterr().out
    assert printed.count("x\n") == 3 and "more (--top)" in printed


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--degrees", "3/8"], "each degree is a power of two"),
        (["--degrees", "four"], "give degrees like 4/8"),
        (["--degrees", "16"], "not in profile"),
        (["--gpus", "12"], "whole number of 8-GPU domains"),
        (["--rate-scale", "0"], "--rate-scale must be > 0"),
        (["--top", "0"], "--top must be >= 1"),
        (["--json", "/nonexistent/dir/x.json"], "output folder does not exist"),
        (["--trace", "synthetic:preset=nope"], "unknown synthetic preset"),
    ],
)
def test_bad_input_is_one_line_naming_it(argv, message):
    r = run("plan", "--trace", "synthetic:duration_s=30", *argv)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr and r.stderr.count("\n") == 1, r.stderr
