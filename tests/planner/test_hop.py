"""Sliding (hopping) windows: ``PlannerSettings.hop_s``.

Windows stay ``window_s`` = 20 s long but are evaluated every ``hop_s``; the
shell builds each window from per-hop buckets and reports the newest hop as
the observation's ``fresh_*`` part. Pool for the planner tests: CP4/CP8 with
κ_4 = 0.5/s and κ_8 = 0.6/s (6xCP4+2xCP8: K = 4.2/s, large-degree capacity
share 0.286), default thresholds (upper 0.9), ``mix_margin`` 0.2 (7 long
requests to read the long share from).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import pytest

from vertumnus.core import planner
from vertumnus.core.costmodel import PrefillModel
from vertumnus.core.planner import (
    CapacityProfile,
    ControllerState,
    PlannerSettings,
    Split,
    WindowObservation,
    advance,
    commit,
    initial_state,
    layout_for,
    step,
)
from vertumnus.core.types import Composition
from vertumnus.sim.reconfig import AdaptiveOptions, build_adaptive

from .helpers import two_phase_trace

CAP = CapacityProfile({4: 0.5, 8: 0.6})
DISJOINT = PlannerSettings(check_hops=1)  # window 20 s, one evaluation per window
HOP10 = replace(DISJOINT, hop_s=10.0)
K = CAP.capacity_per_s(Composition.parse("6xCP4+2xCP8").degrees)  # 4.2/s


def start(comp: str = "6xCP4+2xCP8") -> ControllerState:
    return initial_state(layout_for(Composition.parse(comp)))


Bucket = tuple[float, int, int, float]  # (demand, requests, long requests, long demand)


def bucket(u: float, share: float = 0.286, n: int = 20, n_long: int = 5, hop: float = 10.0):
    """One hop of ``hop`` seconds at utilization ``u`` of 6xCP4+2xCP8."""
    demand = u * K * hop
    return (demand, n, n_long, share * demand)


def windows(buckets: Sequence[Bucket], settings: PlannerSettings) -> list[WindowObservation]:
    """The observations the shell builds from per-hop ``buckets``: one per hop once a
    window is full, each the sum of the last window_s/hop buckets, the newest as fresh."""
    n = settings.hops_per_window
    out = []
    for end in range(n, len(buckets) + 1):
        if n == 1:
            d, r, lr, ld = buckets[end - 1]
            out.append(WindowObservation(d, r, lr, ld))
            continue
        parts = buckets[end - n : end]
        newest = parts[-1]
        out.append(
            WindowObservation(
                sum(p[0] for p in parts),
                sum(p[1] for p in parts),
                sum(p[2] for p in parts),
                sum(p[3] for p in parts),
                fresh_demand_s=newest[0],
                fresh_long_requests=newest[2],
                fresh_long_demand_s=newest[3],
            )
        )
    return out


def first_decision_s(buckets: Sequence[Bucket], settings: PlannerSettings) -> float | None:
    """When (seconds from the start of the 10-second buckets) the first operation starts."""
    state = start()
    hop = settings.hop
    for i, w in enumerate(windows(buckets, settings)):
        state, ops = step(state, w, CAP, settings)
        if ops:
            return settings.window_s + i * hop
    return None


def in_10s(buckets: Sequence[Bucket], settings: PlannerSettings) -> list[Bucket]:
    """10-second buckets re-cut to the settings' hop (20 s: pairs summed)."""
    if settings.hop == 10.0:
        return list(buckets)
    assert settings.hop == 20.0
    return [
        tuple(a + b for a, b in zip(buckets[i], buckets[i + 1], strict=True))  # type: ignore[misc]
        for i in range(0, len(buckets) - 1, 2)
    ]


def test_hop_settings_validate() -> None:
    assert DISJOINT.hop == 20.0 and DISJOINT.hops_per_window == 1
    assert HOP10.hop == 10.0 and HOP10.hops_per_window == 2
    assert replace(DISJOINT, hop_s=5.0).hops_per_window == 4
    assert replace(DISJOINT, hop_s=20.0).hops_per_window == 1
    # hop_s = 0 follows the window length, so the window can change on its own.
    assert replace(DISJOINT, window_s=30.0).hop == 30.0
    for bad in (-5.0, 30.0, 15.0, 7.0):
        with pytest.raises(ValueError, match="hop_s"):
            replace(DISJOINT, hop_s=bad)
    with pytest.raises(ValueError, match="hop_s"):
        replace(HOP10, window_s=25.0)


def test_a_sustained_overload_is_confirmed_one_hop_earlier() -> None:
    """From u = 0.6 to u = 1.1 at 60 s: confirmed at 100 s with disjoint 20 s windows
    (two windows), at 90 s with a 10 s hop (the window ending at 70 s is half new,
    u = 0.85 < 0.9; those ending at 80 s and 90 s are the two in a row)."""
    buckets = [bucket(0.6)] * 6 + [bucket(1.1)] * 6
    assert first_decision_s(in_10s(buckets, DISJOINT), DISJOINT) == 100.0
    assert first_decision_s(buckets, HOP10) == 90.0
    # window_s + (persist - 1)·hop after the change, instead of persist·window_s.
    assert HOP10.window_s + (HOP10.persist_windows - 1) * HOP10.hop == 90.0 - 60.0


def test_a_one_window_burst_still_does_not_confirm() -> None:
    """A 20 s burst at u = 1.1 on u = 0.6: with a 10 s hop only the window aligned with
    it is above ``upper`` (its neighbours hold half of it, u = 0.85)."""
    for offset in (0, 1):  # burst aligned with the disjoint windows, or straddling two
        buckets = [bucket(0.6)] * (6 + offset) + [bucket(1.1)] * 2 + [bucket(0.6)] * 6
        assert first_decision_s(buckets, HOP10) is None
        if not offset:
            assert first_decision_s(in_10s(buckets, DISJOINT), DISJOINT) is None


def test_mix_evidence_counts_each_long_request_once() -> None:
    """The long share drops to 0.05 (a split, 6xCP4+2xCP8's threshold is 0.086) with 3
    long requests per 10 s hop. Two overlapping windows hold 6 + 6 long requests but
    cover only three hops, 9 long requests: 7 needed, so the change is confirmed at the
    second evaluation. With 2 per hop the two windows cover 6 (< 7, although the naive
    sum is 8) and the third evaluation, four hops and 8 long requests, confirms it."""
    for per_hop, confirmed_at in ((3, 30.0), (2, 40.0)):
        buckets = [bucket(0.6, share=0.05, n_long=per_hop)] * 8
        assert first_decision_s(buckets, HOP10) == confirmed_at
    ws = windows([bucket(0.6, share=0.05, n_long=2)] * 3, HOP10)
    assert sum(w.long_requests for w in ws) == 8  # what a per-window sum would count
    assert planner.distinct_time(ws)[1] == 6  # three distinct hops


def test_the_pooled_share_weights_each_hop_once() -> None:
    ws = windows([bucket(0.5, share=0.0), bucket(0.5, share=0.0), bucket(0.5, share=0.6)], HOP10)
    pooled = planner.pooled_share(ws)
    # Three hops of equal demand, one of them at 0.6: 0.2 (a per-window pool would say 0.15).
    assert all(w.long_share == pytest.approx(0.2) for w in pooled)
    assert [w.demand_s for w in pooled] == [w.demand_s for w in ws]


def test_disjoint_windows_are_unchanged() -> None:
    """hop_s = window_s (explicitly or 0) reads exactly as before: no fresh parts."""
    buckets = [bucket(0.6)] * 6 + [bucket(1.1)] * 6
    w20 = in_10s(buckets, DISJOINT)
    assert first_decision_s(w20, replace(DISJOINT, hop_s=20.0)) == first_decision_s(w20, DISJOINT)
    ws = windows(w20, DISJOINT)
    assert all(w.fresh_demand_s is None for w in ws)
    assert planner.distinct_time(ws)[1] == sum(w.long_requests for w in ws)


def test_follow_through_still_takes_one_evaluation() -> None:
    """After a confirmed split the next one in the same direction needs one window."""
    state = start("2xCP4+4xCP8")
    seen = []
    next_id = 1000
    for w in windows([bucket(0.4)] * 2 + [bucket(1.5)] * 8, HOP10):
        state, _ = step(state, w, CAP, HOP10)
        while state.pending:
            op = state.pending[0]
            new = [next_id, next_id + 1] if isinstance(op, Split) else [next_id]
            next_id += len(new)
            state = commit(state, new, op)
            state, _ = advance(state, (), CAP, HOP10)
        seen.append(str(state.layout.composition))
    assert seen[0] == "2xCP4+4xCP8"
    assert seen[-1] != "2xCP4+4xCP8"


def test_the_controller_ticks_every_hop_over_full_windows(model: PrefillModel) -> None:
    trace = two_phase_trace()
    runs = {}
    for hop in (5.0, 2.5):
        opts = AdaptiveOptions(
            gpus=16,
            control=PlannerSettings(window_s=5.0, persist_windows=2, hop_s=hop, check_hops=1),
            initial=Composition.parse("2xCP8"),
        )
        sim = build_adaptive(trace, model, opts)
        result = sim.run(trace.requests)
        assert sorted(c.request_id for c in result.completions) == list(range(len(trace)))
        ctl = sim.attachments["controller"]
        ends = [w["end_s"] for w in ctl.windows]
        assert ends[0] == pytest.approx(5.0)  # the first window is full
        assert all(b - a == pytest.approx(hop) for a, b in zip(ends, ends[1:], strict=False))
        # Before the first reconfiguration every request is placed on arrival: each
        # window counts exactly the arrivals of the last 5 s.
        first = sim.attachments["executor"].transitions[0].started_s
        for w in ctl.windows:
            if w["end_s"] > first:
                break
            arrivals = sum(
                1 for r in trace.requests if w["end_s"] - 5.0 <= r.arrival_s < w["end_s"]
            )
            assert w["requests"] == arrivals
        runs[hop] = first
    assert runs[2.5] <= runs[5.0]
