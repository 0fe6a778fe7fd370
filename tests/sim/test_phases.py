"""--phases workload shaping: syntax, rates, length bias, key preservation."""

from __future__ import annotations

import numpy as np
import pytest

from vertumnus.core.types import Request
from vertumnus.sim.phases import Phase, apply_phases, parse_phases
from vertumnus.sim.synthetic import SyntheticConfig, generate, token_hit_rate
from vertumnus.sim.traces import Trace


@pytest.fixture(scope="module")
def source() -> Trace:
    return generate(SyntheticConfig(), 0)


def test_parse_full_syntax() -> None:
    ph = parse_phases("300s:rate=2,long=0.3; 5m:rate=0.5,long=3,name=quiet ;repeat=2")
    assert len(ph) == 4
    assert ph[0] == Phase(300.0, 2.0, 0.3, "rate=2,long=0.3")
    assert ph[1] == Phase(300.0, 0.5, 3.0, "quiet")
    assert ph[2:] == ph[:2]
    assert parse_phases("90") == [Phase(90.0, 1.0, 1.0, "rate=1,long=1")]
    assert parse_phases("0.5h:long=0")[0] == Phase(1800.0, 1.0, 0.0)
    assert parse_phases("1.5m")[0].duration_s == 90.0


@pytest.mark.parametrize(
    ("spec", "bad_part"),
    [
        ("", "empty --phases"),
        ("fast", "'fast'"),
        ("300x:rate=2", "'300x:rate=2'"),
        ("300s:rate=", "'300s:rate='"),
        ("300s:rate=abc", "rate='abc' is not a number"),
        ("300s:speed=2", "unknown option 'speed'"),
        ("300s:rate=-1", "'300s:rate=-1'"),
        ("300s:rate=0", "'300s:rate=0'"),
        ("300s:long=-2", "'300s:long=-2'"),
        ("0s", "'0s'"),
        ("repeat=2;300s", "'repeat=2'"),
        ("300s;repeat=0", "'repeat=0'"),
        ("300s;repeat=two", "'repeat=two'"),
        ("300s;;300s", "empty phase at position 2"),
        ("repeat=3", "no phases"),
    ],
)
def test_parse_errors_name_the_bad_part(spec: str, bad_part: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_phases(spec)
    assert bad_part in str(info.value)


def test_one_neutral_phase_reproduces_the_source() -> None:
    src = generate(SyntheticConfig(duration_s=120), 3)
    n = len(src)
    period = src.duration_s * n / (n - 1)
    out, bounds = apply_phases(src, [Phase(period)])
    assert bounds == [(0.0, period, "rate=1,long=1")]
    assert len(out) == n
    assert [r.block_keys for r in out] == [r.block_keys for r in src]
    assert np.allclose([r.arrival_s for r in out], [r.arrival_s - src.start_s for r in src])


def _per_phase(
    tr: Trace, bounds: list[tuple[float, float, str]]
) -> list[tuple[float, float, float]]:
    """(rate, mean length, long fraction) per phase."""
    out = []
    for start, end, _ in bounds:
        lens = [r.length for r in tr if start <= r.arrival_s < end]
        out.append(
            (
                len(lens) / (end - start),
                float(np.mean(lens)),
                float(np.mean(np.array(lens) > 32768)),
            )
        )
    return out


def test_rates_and_length_bias(source: Trace) -> None:
    spec = "120s:rate=2,long=0.3;120s:rate=0.5,long=3;repeat=2"
    out, bounds = apply_phases(source, spec, seed=1)
    assert [b[2] for b in bounds] == ["rate=2,long=0.3", "rate=0.5,long=3"] * 2
    assert bounds[0][0] == 0.0 and bounds[-1][1] == 480.0
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:], strict=False))
    n = len(source)
    base = n / (source.duration_s * n / (n - 1))
    stats = _per_phase(out, bounds)
    for ph, (start, end, _), (rate, _, _) in zip(parse_phases(spec), bounds, stats, strict=True):
        # Exact count: round(multiplier x source rate x duration).
        assert round(rate * (end - start)) == round(ph.rate * base * (end - start))
    high, low = stats[0::2], stats[1::2]
    assert min(h[0] for h in high) > 3 * max(lo[0] for lo in low)
    assert min(lo[1] for lo in low) > 1.5 * max(h[1] for h in high)
    # Long fraction follows p F / (p F + 1 - p) roughly (source p ~ 5 %).
    assert max(h[2] for h in high) < 0.04
    assert min(lo[2] for lo in low) > 0.08
    assert len(out) == sum(round(ph.rate * base * ph.duration_s) for ph in parse_phases(spec))


def test_keys_kept_ids_renumbered_prefix_reuse_survives(source: Trace) -> None:
    out, _ = apply_phases(source, "200s:rate=1.5;200s:rate=0.7,long=2", seed=4)
    src_keys = {r.block_keys for r in source}
    assert all(r.block_keys in src_keys for r in out)
    assert [r.id for r in out] == list(range(len(out)))
    assert all(
        a.arrival_s <= b.arrival_s for a, b in zip(out.requests, out.requests[1:], strict=False)
    )
    assert token_hit_rate(out) > 0.3
    assert out.block_size == source.block_size


def test_cycling_remaps_keys_per_cycle(source: Trace) -> None:
    # 4x the source rate for longer than the source: it is read ~3 times.
    out, _ = apply_phases(source, "450s:rate=4", seed=0)
    assert len(out) > 2.5 * len(source)
    src_keys = {r.block_keys for r in source}
    reused = sum(r.block_keys in src_keys for r in out)
    assert reused == len(source)  # exactly the first cycle
    assert len({r.block_keys for r in out}) > 2.5 * len(src_keys) * 0.9
    # Within a later cycle, reuse is kept, so the hit rate stays near the source's.
    assert abs(token_hit_rate(out) - token_hit_rate(source)) < 0.1


def test_cycled_keys_keep_their_position(source: Trace) -> None:
    """A chained key names one prefix, so it stands at one position in every request.
    (A salt of mix64(cycle) broke this wherever a block id equalled the cycle number,
    and the prefix index refused the trace.)"""
    out, _ = apply_phases(source, "900s:rate=6", seed=0)
    assert len(out) > 5 * len(source)  # several cycles
    position: dict[int, int] = {}
    for r in out:
        for i, k in enumerate(r.block_keys):
            assert position.setdefault(k, i) == i


def test_deterministic_and_seeded(source: Trace) -> None:
    spec = "100s:rate=2,long=0.5;100s:rate=0.5,long=4"
    a, b, c = (apply_phases(source, spec, seed=s)[0] for s in (5, 5, 6))
    assert a == b
    assert a.requests != c.requests


def test_unshapeable_inputs() -> None:
    one = Trace("one", (Request(0, 0.0, 5, (1,)),), 4)
    with pytest.raises(ValueError, match="spans no time"):
        apply_phases(one, "10s")
    all_long = Trace.from_requests(
        "long", [Request(i, float(i), 40000, (i,)) for i in range(5)], 512
    )
    with pytest.raises(ValueError, match="long=0"):
        apply_phases(all_long, "10s:long=0")
    with pytest.raises(ValueError, match="no phases"):
        apply_phases(all_long, [])


def test_extreme_long_weight_without_long_requests_terminates() -> None:
    short = Trace.from_requests("s", [Request(i, float(i), 100, (i,)) for i in range(10)], 512)
    out, _ = apply_phases(short, "10s:long=1e12")
    assert len(out) == 10
