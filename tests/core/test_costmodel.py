import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from vertumnus.core.costmodel import PrefillModel, attention_pairs
from vertumnus.core.fit import ProfileRow, fit_profile, synthesize_profile


def test_attention_pairs_small_cases():
    assert attention_pairs(1, 0) == 1
    assert attention_pairs(3, 0) == 6  # 1 + 2 + 3
    assert attention_pairs(2, 5) == 2 * 5 + 3
    assert attention_pairs(0, 100) == 0


@given(st.integers(0, 300), st.integers(0, 300))
def test_attention_pairs_counts_causal_pairs(r, p):
    # naive reference: token t of the R new ones (0-based) sees P cached + t + 1 new keys
    assert attention_pairs(r, p) == sum(p + t + 1 for t in range(r))


def test_predict_formula(model):
    r, p, c = 4096, 1024, 4
    w = r * p + r * (r + 1) / 2
    expect = model.d[c] + model.a[c] * r + model.b * p + (model.c * r + model.alpha * w) / c
    assert model.predict(c, r, p) == pytest.approx(expect, rel=1e-12)


def test_default_profile_speedups_match_the_paper(model):
    # design.md section 2: S4 ~ 2.76 and S8 ~ 3.87 at 64K (paper: 2.71, 3.91); CP < 1x at 1K for C >= 4
    assert model.speedup(4, 65536) == pytest.approx(2.76, rel=0.02)
    assert model.speedup(8, 65536) == pytest.approx(3.87, rel=0.02)
    assert model.speedup(4, 1024) < 1.0
    assert model.speedup(8, 1024) < 1.0


def test_profile_round_trip(model):
    again = PrefillModel.from_dict(json.loads(json.dumps(model.to_dict())))
    assert again == model


def test_profile_missing_field_is_named():
    with pytest.raises(ValueError, match="alpha_s_per_pair"):
        PrefillModel.from_dict(
            {"name": "x", "c_s_per_token": 1, "degrees": {"1": {"d_s": 0, "a_s_per_token": 0}}}
        )


def test_fit_recovers_exact_coefficients(model):
    rows = synthesize_profile(
        model, [1024, 4096, 16384, 65536], [0, 8192], 0.0, np.random.default_rng(0)
    )
    fit = fit_profile(rows)
    assert fit.model.alpha == pytest.approx(model.alpha, rel=1e-6)
    assert fit.model.c == pytest.approx(model.c, rel=1e-6)
    for deg in model.degrees:
        assert fit.model.d[deg] == pytest.approx(model.d[deg], rel=1e-6)
        assert fit.model.a[deg] == pytest.approx(model.a[deg], rel=1e-6)
    assert fit.mape < 1e-9


def test_fit_with_five_percent_noise(model):
    rows = synthesize_profile(
        model,
        [1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072],
        [0, 4096, 16384, 65536],
        0.05,
        np.random.default_rng(1),
    )
    fit = fit_profile(rows)
    # attention dominates long prompts, so alpha is pinned tightly; the token terms less so
    assert fit.model.alpha == pytest.approx(model.alpha, rel=0.05)
    assert fit.model.c + fit.model.a[1] == pytest.approx(model.c + model.a[1], rel=0.15)
    # 5 % multiplicative noise has a mean absolute value of ~4 %: the fit cannot do better
    for deg, err in fit.mape_by_degree.items():
        assert 0.02 < err < 0.06, (deg, err)


def test_fit_rejects_bad_rows():
    with pytest.raises(ValueError, match="no rows"):
        fit_profile([])
    with pytest.raises(ValueError, match="row 1"):
        fit_profile([ProfileRow(1, 0, 0, 1.0)])
    with pytest.raises(ValueError, match="distinct uncached lengths"):
        fit_profile([ProfileRow(1, 100, 0, 1.0), ProfileRow(1, 100, 5, 1.1)])
