"""``bench/p90_anatomy.py``: which degree serves a fixed composition's long requests, and
how long they wait there (docs/benchmarks/adaptive.md, "The P90's ridge is placement's")."""

from __future__ import annotations

import pytest

from tests.conftest import bench_script
from vertumnus.core.metrics import Completion
from vertumnus.profiles import load_model

LONG = 32768


def _done(i: int, length: int, cached: int, degree: int, wait_s: float) -> Completion:
    model = load_model()
    prefill = model.predict(degree, length - cached, cached)
    return Completion(i, float(i), length, cached, wait_s + prefill + 0.05, i, degree, 1.0)


def test_the_anatomy_splits_the_requests_by_degree_and_their_ttft_into_wait_and_prefill():
    b = bench_script("p90_anatomy.py")
    done = [_done(i, 4096, 0, 4, 0.0) for i in range(16)]
    done += [_done(16, 65536, 0, 4, 0.1), _done(17, 65536, 32768, 8, 0.5)]
    done += [_done(18, 40000, 0, 8, 0.3), _done(19, 8192, 0, 8, 0.0)]
    got = b.anatomy(done, LONG, load_model(), 0.05)
    assert got["long_share"] == pytest.approx(3 / 20)
    cp4, cp8 = got["per_degree"]["CP4"], got["per_degree"]["CP8"]
    assert cp4["share"] == pytest.approx(17 / 20) and cp8["share"] == pytest.approx(3 / 20)
    assert cp4["long_share"] == pytest.approx(1 / 17) and cp8["long_share"] == pytest.approx(2 / 3)
    assert cp4["long_mean_wait_s"] == pytest.approx(0.1)
    assert cp8["long_mean_wait_s"] == pytest.approx(0.4)  # (0.5 + 0.3) / 2
    assert cp8["long_mean_ttft_s"] == pytest.approx((done[17].ttft_s + done[18].ttft_s) / 2)
    # The slowest tenth (2 of 20) are the long requests that waited most.
    assert got["slowest_tenth_long_share"] == 1.0
    ttfts = sorted(c.ttft_s for c in done)
    assert got["mean_ttft_s"] == pytest.approx(sum(ttfts) / 20)
    assert ttfts[17] <= got["p90_ttft_s"] <= ttfts[18]


def test_a_composition_of_another_pool_size_is_refused(capsys):  # type: ignore[no-untyped-def]
    b = bench_script("p90_anatomy.py")
    with pytest.raises(SystemExit):
        b.main(["--family", "longcontext", "--load", "light", "--compositions", "8xCP4"])
    assert "40 GPUs" in capsys.readouterr().err
