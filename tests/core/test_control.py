"""The controller's windows: demand per hop, sliding windows, reuse weights, history."""

from __future__ import annotations

import pytest

from vertumnus.core import planner
from vertumnus.core.start import history_requests
from vertumnus.core.types import Request
from vertumnus.core.windows import ControlWindows


def r(rid: int, length: int, t: float = 0.0, keys=()) -> Request:
    return Request(rid, t, length, tuple(keys))


def test_disjoint_windows_count_each_hop_once():
    w = ControlWindows(planner.PlannerSettings(window_s=10.0, long_threshold=100, check_hops=1))
    assert w.ready
    w.placed(r(0, 50), 1.0)
    w.placed(r(1, 500), 4.0)
    obs = w.observation((), reconfiguring=False)
    assert (obs.demand_s, obs.requests, obs.long_requests, obs.long_demand_s) == (5.0, 2, 1, 4.0)
    assert obs.fresh_demand_s is None
    w.close_hop()
    assert w.observation((), False).demand_s == 0.0


def test_sliding_windows_sum_the_last_hops_and_report_the_newest():
    w = ControlWindows(planner.PlannerSettings(window_s=30.0, hop_s=10.0))
    for demand in (1.0, 2.0, 4.0):
        assert w.ready == (demand == 4.0)
        w.placed(r(0, 10), demand)
        if demand != 4.0:
            w.close_hop()
    obs = w.observation((), True)
    assert obs.demand_s == 7.0 and obs.fresh_demand_s == 4.0 and obs.reconfiguring
    w.close_hop()
    w.placed(r(0, 10), 8.0)
    assert w.observation((), False).demand_s == 14.0  # 2 + 4 + 8


def test_reuse_weights_halve_per_window():
    w = ControlWindows(planner.PlannerSettings(window_s=20.0, hop_s=10.0))
    w.reused(3, 8)
    w.close_hop()
    assert w.reuse_weight(3) == pytest.approx(8 * 0.5**0.5)
    w.forget([3])
    assert w.reuse_weight(3) == 0.0


def test_history_uses_the_first_seconds_and_an_ideal_cache():
    reqs = [r(0, 1536, 0.0, (1, 2, 3)), r(1, 2048, 5.0, (1, 2, 3, 4)), r(2, 100, 50.0, (9,))]
    hist = history_requests(reqs, 512, 10.0)
    assert [(h.arrival_s, h.length, h.cached_tokens) for h in hist] == [
        (0.0, 1536, 0),
        (5.0, 2048, 1536),
    ]
