"""The per-window controller on constructed window sequences.

Pool: 4xCP4+3xCP8 with κ_4 = 0.5/s and κ_8 = 0.6/s, so K = 3.8/s and a
10-second window has capacity 38 s: demand 38·u gives utilization u.
"""

from __future__ import annotations

import pytest

from vertumnus.core.planner import (
    CapacityProfile,
    ControllerState,
    HistoryRequest,
    Merge,
    PlannerSettings,
    Split,
    WindowObservation,
    WorkerObservation,
    commit,
    enumerate_lattice,
    initial_composition,
    initial_state,
    layout_for,
    step,
)
from vertumnus.core.types import Composition

CAP = CapacityProfile({4: 0.5, 8: 0.6})
SETTINGS = PlannerSettings(
    window_s=10.0,
    upper=1.0,
    lower=0.5,
    merge_admit=0.9,
    persist_windows=3,
    mix_margin=0.1,
    min_requests=10,
    multi_step=False,  # one operation per decision; multi-step: test_multistep.py
)
WINDOW_CAPACITY = 38.0  # K·H for 4xCP4+3xCP8
LARGE_SHARE = 1.8 / 3.8  # the three CP8 workers' share of K: 0.474


def start(comp: str = "4xCP4+3xCP8") -> ControllerState:
    return initial_state(layout_for(Composition.parse(comp)))


def window(u: float, long_share: float = 0.5, n: int = 100, **kw) -> WindowObservation:
    """A window at utilization ``u`` of 4xCP4+3xCP8 whose long requests bring ``long_share`` of D."""
    demand = u * WINDOW_CAPACITY
    return WindowObservation(
        demand_s=demand, requests=n, long_requests=n // 2, long_demand_s=long_share * demand, **kw
    )


def one(ops: tuple) -> object:
    """The single operation of a one-step decision, or None."""
    assert len(ops) <= 1
    return ops[0] if ops else None


def run(state: ControllerState, windows: list[WindowObservation]):
    decisions = []
    for w in windows:
        state, ops = step(state, w, CAP, SETTINGS)
        decisions.append(one(ops))
    return state, decisions


def test_nothing_happens_inside_the_band() -> None:
    _, ds = run(start(), [window(0.7)] * 10)
    assert ds == [None] * 10


def test_split_needs_persist_windows_in_a_row() -> None:
    # Two hot windows, a calm one, then three hot: only the third of those splits.
    _, ds = run(
        start(), [window(1.2), window(1.2), window(0.8), window(1.2), window(1.2), window(1.2)]
    )
    assert ds[:5] == [None] * 5
    assert isinstance(ds[5], Split)


def test_split_takes_the_worker_with_the_shortest_drain() -> None:
    workers = tuple(
        WorkerObservation(w, running_remaining_s=r) for w, r in ((4, 3.0), (5, 0.2), (6, 1.0))
    )
    _, ds = run(start(), [window(1.2, workers=workers)] * 3)
    assert ds[2] == Split(5, reason="utilization 1.20 > 1.0")


def test_near_equal_drains_are_ranked_by_reconciliation_traffic() -> None:
    workers = (
        WorkerObservation(4, running_remaining_s=0.1, reuse_weight=50.0),
        WorkerObservation(5, running_remaining_s=0.2, reuse_weight=5.0),
        WorkerObservation(6, running_remaining_s=0.0, reuse_weight=80.0),
    )
    _, ds = run(start(), [window(1.2, workers=workers)] * 3)
    assert isinstance(ds[2], Split) and ds[2].worker == 5


def test_merge_when_demand_stays_low_and_capacity_remains() -> None:
    # Merging two CP4 into one CP8: K' = 3.8 - 1.0 + 0.6 = 3.4/s -> 34 s per window.
    # Long share 0.75: at least 2xCP4+4xCP8's CP8 share (0.71), the balance
    # point a low-utilization merge may reach.
    state, ds = run(start(), [window(0.4, long_share=0.75)] * 3)
    assert ds[:2] == [None, None]
    assert isinstance(ds[2], Merge) and ds[2].workers == (0, 1)
    assert state.pending == (ds[2],)


def test_merge_refused_when_merged_capacity_would_fall_short() -> None:
    # u = 0.45 < lower asks for a merge; merged, 0.45·38/34 = 0.50 > merge_admit 0.45.
    tight = PlannerSettings(**{**SETTINGS.__dict__, "merge_admit": 0.45})
    state = start()
    for _ in range(5):
        state, d = step(state, window(0.45), CAP, tight)
        assert d == ()
    assert state.merge_streak == 0


def test_capacity_wins_over_the_long_fraction_signal() -> None:
    # Long requests bring 95 % of the demand (asks for a merge) while demand
    # is above the upper threshold (asks for a split): the split wins.
    _, ds = run(start(), [window(1.3, long_share=0.95)] * 3)
    assert isinstance(ds[2], Split)
    assert ds[2].reason.startswith("utilization")


def test_long_share_against_large_degree_share_merges_then_holds_then_splits() -> None:
    # Stable demand, long requests bring 80 % of it, CP8 workers hold 47 % of K.
    state, ds = run(start(), [window(0.7, long_share=0.8)] * 3)
    assert isinstance(ds[2], Merge)
    assert ds[2].reason == f"long share 0.80 > large-degree share {LARGE_SHARE:.2f}"
    state = commit(state, [100])  # 2xCP4+4xCP8: CP8 share 2.4/3.4 = 0.71
    # 0.8 is within the margin of 0.71: the mix matches, nothing more to do.
    state, ds = run(state, [window(0.7, long_share=0.8)] * 5)
    assert ds == [None] * 5
    # Back to short-dominated: long share 0.2, well below 0.71 -> split.
    state, ds = run(state, [window(0.7, long_share=0.2)] * 3)
    assert isinstance(ds[2], Split)


def test_matching_mix_is_a_fixed_point() -> None:
    _, ds = run(start(), [window(0.7, long_share=LARGE_SHARE + 0.05)] * 6)
    assert ds == [None] * 6


def test_long_fraction_ignored_on_thin_windows() -> None:
    _, ds = run(start(), [window(0.7, long_share=0.95, n=5)] * 5)
    assert ds == [None] * 5


def test_no_decision_while_reconfiguring_and_streaks_reset() -> None:
    state, ds = run(start(), [window(1.2), window(1.2), window(1.2, reconfiguring=True)])
    assert ds == [None, None, None]
    assert state.split_streak == 0
    # An uncommitted decision also blocks further decisions.
    state, ds = run(start(), [window(1.2)] * 3 + [window(1.2)] * 3)
    assert isinstance(ds[2], Split) and ds[3:] == [None, None, None]


def test_commit_updates_layout_and_epoch() -> None:
    state, ds = run(start(), [window(1.2)] * 3)
    assert isinstance(ds[2], Split)
    parent = state.layout.slot(ds[2].worker)
    state = commit(state, [10, 11])
    assert state.epoch == 1 and state.pending == ()
    assert str(state.layout.composition) == "6xCP4+2xCP8"
    a, b = state.layout.slot(10), state.layout.slot(11)
    assert (a.domain, a.offset, a.degree) == (parent.domain, parent.offset, 4)
    assert (b.domain, b.offset, b.degree) == (parent.domain, parent.offset + 4, 4)
    # The two children are buddies again: they can merge back.
    state, ds = run(state, [window(0.3)] * 3)
    assert isinstance(ds[2], Merge)


def test_commit_without_pending_is_an_error() -> None:
    with pytest.raises(ValueError, match="no reconfiguration"):
        commit(start(), [1])


def test_nothing_to_split_in_an_all_smallest_pool() -> None:
    state = start("10xCP4")
    # 10xCP4: K = 5/s; u well above upper, but CP4 is the smallest degree allowed.
    for _ in range(4):
        state, d = step(state, window(2.0), CAP, SETTINGS)
        assert d == ()


def test_initial_composition_prefers_large_degrees_with_enough_capacity() -> None:
    from vertumnus.profiles import load_model

    model = load_model()
    lattice = enumerate_lattice(40, (4, 8))
    # 1 short request per second: any pool has capacity -> 5xCP8.
    light = [HistoryRequest(float(t), 2000) for t in range(120)]
    assert str(initial_composition(light, lattice, CAP, model, SETTINGS)) == "5xCP8"
    # 100 short requests per second overload every pool -> the largest K.
    heavy = [HistoryRequest(t / 100, 2000) for t in range(100 * 120)]
    assert str(initial_composition(heavy, lattice, CAP, model, SETTINGS)) == "10xCP4"
    medium = [HistoryRequest(t / 60, 2000) for t in range(60 * 120)]
    got = initial_composition(medium, lattice, CAP, model, SETTINGS)
    # The first in large-first order whose P90 window demand fits under upper·K·H.
    e = {d: model.predict(d, 2000, 0) for d in (4, 8)}
    assert str(got) not in ("5xCP8", "10xCP4")
    for c in lattice:
        pref = 4 if 4 in c.degrees and e[4] <= (1 + 0.1 * (8 / 4 - 1)) * e[8] else 8
        if 60 * e[pref] <= SETTINGS.upper * CAP.capacity_per_s(c.degrees):
            assert got == c
            break


def test_settings_validate() -> None:
    with pytest.raises(ValueError, match="lower < upper"):
        PlannerSettings(lower=0.9, upper=0.8)
    with pytest.raises(ValueError, match="merge_admit"):
        PlannerSettings(upper=0.8, lower=0.4, merge_admit=0.9)
    with pytest.raises(ValueError, match="degrees"):
        PlannerSettings(degrees=(16,))


def test_follow_through_needs_one_window_per_further_step() -> None:
    state, ds = run(start(), [window(1.2)] * 3)
    assert isinstance(ds[2], Split) and state.momentum == "split"
    state = commit(state, [10, 11])  # 6xCP4+2xCP8, K = 4.2/s: 1.2·38/42 = 1.09 > upper
    state, ops = step(state, window(1.2), CAP, SETTINGS)
    assert isinstance(one(ops), Split)  # one window was enough
    state = commit(state, [12, 13])
    # A calm window ends the follow-through: back to persist_windows.
    state, ds = run(state, [window(0.8), window(1.3), window(1.3), window(1.3)])
    assert ds[:3] == [None, None, None] and isinstance(ds[3], Split)


def test_without_follow_through_every_step_waits_persist_windows() -> None:
    slow = PlannerSettings(**{**SETTINGS.__dict__, "follow_through": False})
    state = start()
    for _ in range(3):
        state, ops = step(state, window(1.2), CAP, slow)
    assert isinstance(one(ops), Split)
    state = commit(state, [10, 11])
    decisions = []
    for _ in range(3):
        state, ops = step(state, window(1.2), CAP, slow)
        decisions.append(one(ops))
    assert decisions[:2] == [None, None] and isinstance(decisions[2], Split)


def test_low_utilization_merge_yields_to_a_long_share_that_asks_for_a_split() -> None:
    # u = 0.3 on 4xCP4+3xCP8 (CP8 share 0.47) with long share 0.2 < 0.47 - 0.1:
    # the long share asks for a split and low utilization no longer vetoes it.
    _, ds = run(start(), [window(0.3, long_share=0.2)] * 3)
    assert ds[:2] == [None, None]
    assert isinstance(ds[2], Split)
    assert ds[2].reason.startswith("long share 0.20 < large-degree share 0.47 (utilization 0.30")
    # The earlier rule (switch off): the same windows merge.
    off = PlannerSettings(**{**SETTINGS.__dict__, "mix_below_lower": False})
    state = start()
    for _ in range(3):
        state, d = step(state, window(0.3, long_share=0.2), CAP, off)
    assert isinstance(one(d), Merge)


def test_low_utilization_merge_not_admitted_if_the_long_share_would_split_back() -> None:
    # u = 0.4, long share 0.5 (neutral on 4xCP4+3xCP8: 0.47 ± 0.1): low
    # utilization asks for a merge, but 2xCP4+4xCP8 (CP8 share 0.71) would
    # ask to split back (0.5 < 0.61), so no merge is admitted and none happens.
    state, ds = run(start(), [window(0.4, long_share=0.5)] * 5)
    assert ds == [None] * 5
    assert state.merge_streak == 0 and state.split_streak == 0


def test_overload_splits_whatever_the_long_share_at_low_and_high_mix() -> None:
    for share in (0.0, 1.0):
        _, ds = run(start("5xCP8"), [window(1.2 * 30 / 38, long_share=share)] * 3)
        assert isinstance(ds[2], Split) and ds[2].reason.startswith("utilization")


def test_low_utilization_merge_lands_a_full_margin_clear_of_a_split_back() -> None:
    # 6xCP4+2xCP8 at u ≈ 0.27 (CP8 share 1.2/4.2 = 0.29). The long share
    # alternates in runs around 4xCP4+3xCP8's split threshold, 0.474 - 0.1 =
    # 0.374. Admitting the merge at that threshold flapped: 3 windows at 0.384
    # merged, 3 at 0.364 split back, and so on. The merge must now land at or
    # below the balance point (CP8 share 0.474 ≤ long share), so nothing
    # happens: 0.364 and 0.384 are both neutral on 6xCP4+2xCP8.
    state = start("6xCP4+2xCP8")
    for _ in range(4):
        state, ds = run(state, [window(0.3, long_share=0.384)] * 3 + [window(0.3, 0.364)] * 3)
        assert ds == [None] * 6
    assert state.history == ()
    # A long share at the balance point merges; windows within a margin of it
    # (0.40 / 0.42 > 0.374) then keep the merged pool where it is.
    state, ds = run(state, [window(0.3, long_share=0.48)] * 3)
    assert isinstance(ds[2], Merge)
    state = commit(state, [100])
    state, ds = run(state, [window(0.3, long_share=0.40), window(0.3, long_share=0.42)] * 6)
    assert ds == [None] * 12
    # A full margin below it, the split back is asked for.
    _, ds = run(state, [window(0.3, long_share=0.36)] * 3)
    assert isinstance(ds[2], Split)
