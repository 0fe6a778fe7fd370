"""bench/mix_seeds.py's bookkeeping: where adaptive lost to the per-phase oracle, and
which seeds it runs."""

from __future__ import annotations

import json

import pytest

from tests.conftest import bench_script


def test_the_losses_per_phase_add_up_to_adaptive_minus_the_oracle():
    m = bench_script("mix_seeds.py")
    # Two phases of 300 and 100 requests; A is best in the first, B in the second.
    fixed = {
        "A": (0.0, [(1.0, 300), (3.0, 100)]),
        "B": (0.0, [(1.2, 300), (2.0, 100)]),
    }
    adaptive = [1.1, 2.5]
    losses = m.phase_losses(fixed, adaptive)
    assert losses == pytest.approx([0.1 * 300 / 400 * 1e3, 0.5 * 100 / 400 * 1e3])
    _, _, oracle = m.oracle(fixed)
    adaptive_mean = (1.1 * 300 + 2.5 * 100) / 400
    assert sum(losses) == pytest.approx((adaptive_mean - oracle) * 1e3)


def test_seeds_are_listed_or_ranged_and_anything_else_is_refused(capsys):
    m = bench_script("mix_seeds.py")
    assert m._seeds("0-5,9") == [0, 1, 2, 3, 4, 5, 9]
    assert m._seeds("3") == [3]
    for bad in ("0-x", "5-2", "a"):
        with pytest.raises(SystemExit):
            m.main(["--seeds", bad])
        assert "--seeds must be comma-separated integers or ranges" in capsys.readouterr().err


def test_fixed_runs_are_read_back_and_a_missing_draw_is_named(tmp_path):
    m = bench_script("mix_seeds.py")
    mix = m.MIXES["calibration"]
    draw = {"mix": "calibration", "seed": 3, "fixed": {"10xCP4": [0.3, [[0.2, 10], [0.4, 5]]]}}
    path = tmp_path / "earlier.json"
    path.write_text(json.dumps({"mixes": {"calibration": mix}, "draws": [draw]}))
    got = m.stored_fixed(path, [("calibration", 3)])
    assert got == {("calibration", 3): {"10xCP4": (0.3, [(0.2, 10), (0.4, 5)])}}
    with pytest.raises(ValueError, match="no fixed runs of the calibration mix, seed 4"):
        m.stored_fixed(path, [("calibration", 4)])
    path.write_text(json.dumps({"mixes": {"calibration": "300s:rate=1"}, "draws": [draw]}))
    with pytest.raises(ValueError, match="its calibration mix is"):
        m.stored_fixed(path, [("calibration", 3)])
