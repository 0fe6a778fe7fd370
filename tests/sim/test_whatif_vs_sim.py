"""``bench/whatif_vs_sim.py``: the what-if replay next to the simulator on one stretch.

Without prefix reuse the replay is the simulator's queueing and placement, so the
two agree to the float; that is the base the bias is measured from
(docs/benchmarks/adaptive.md, "How noisy one run is")."""

from __future__ import annotations

import pytest

from tests.conftest import bench_script
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
    sim_s, replay_s, n = b.compare(requests, trace.block_size, comps, PlacementParams(), 20.0)
    assert n == sum(q.arrival_s >= 20.0 for q in requests) > 100
    assert replay_s == pytest.approx(sim_s, rel=1e-9)
    assert sim_s[0] != sim_s[1]
    # Requests queue (TTFT above the mean isolated prefill): not just service times.
    model = load_model()
    scored = [q for q in requests if q.arrival_s >= 20.0]
    service = sum(model.predict(4, q.length, 0) for q in scored) / len(scored)
    assert sim_s[0] > 1.01 * service


def test_bad_arguments_are_refused_by_name(capsys):
    b = bench_script("whatif_vs_sim.py")
    with pytest.raises(SystemExit):
        b.main(["--trace", "synthetic:duration_s=10", "--no-reuse", "0"])
    assert "--no-reuse" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="--trace SPEC"):
        b.main([])
