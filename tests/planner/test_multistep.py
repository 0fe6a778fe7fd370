"""Multi-step transitions: a target composition, concurrent operations, advance after commit.

Same toy profile as test_controller.py: κ_4 = 0.5/s, κ_8 = 0.6/s, 10 s windows
(κ_2 = 0.3/s where CP2 is allowed). On 4xCP4+3xCP8 (K = 3.8/s) a window's
capacity is 38 s.
"""

from __future__ import annotations

import random
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from vertumnus.core.planner import (
    CapacityProfile,
    ControllerState,
    Merge,
    Op,
    PlannerSettings,
    Split,
    WindowObservation,
    advance,
    commit,
    enumerate_lattice,
    initial_state,
    layout_for,
    plan_target,
    step,
)
from vertumnus.core.types import Composition

CAP = CapacityProfile({2: 0.3, 4: 0.5, 8: 0.6})
BASE = PlannerSettings(
    window_s=10.0,
    upper=1.0,
    lower=0.5,
    merge_admit=0.9,
    persist_windows=2,
    mix_margin=0.1,
    min_requests=10,
)
#: every operation may run at once: only the topology limits concurrency
FREE = replace(BASE, max_concurrent_ops=8, transition_admit=100.0)


def start(comp: str) -> ControllerState:
    return initial_state(layout_for(Composition.parse(comp)))


def load(demand: float, long_share: float = 0.5, n: int = 100) -> WindowObservation:
    return WindowObservation(demand, n, n // 2, long_share * demand)


def members(op: Op) -> tuple[int, ...]:
    return (op.worker,) if isinstance(op, Split) else op.workers


def finish(state: ControllerState, settings: PlannerSettings, order: random.Random | None = None):
    """Commit pending operations one at a time (in random order if ``order``), advancing after
    each; check the in-flight invariants throughout. Returns the final state and every op."""
    next_id = 1000
    done: list[Op] = []
    while state.pending:
        check_in_flight(state, settings)
        op = state.pending[order.randrange(len(state.pending))] if order else state.pending[0]
        new = [next_id, next_id + 1] if isinstance(op, Split) else [next_id]
        next_id += len(new)
        state = commit(state, new, op)
        done.append(op)
        state, _ = advance(state, (), CAP, settings)
    assert state.target is None
    return state, done


def check_in_flight(state: ControllerState, settings: PlannerSettings) -> None:
    """Pending ops are disjoint, on existing workers, at most max_concurrent_ops, and when
    more than one is in flight the workers still serving carry the confirming demand."""
    ids = [w for op in state.pending for w in members(op)]
    assert len(ids) == len(set(ids))
    degree_of = {s.worker: s.degree for s in state.layout.slots}
    assert all(w in degree_of for w in ids)
    assert len(state.pending) <= settings.max_concurrent_ops
    if len(state.pending) > 1:
        k_avail = CAP.capacity_per_s(d for w, d in degree_of.items() if w not in ids)
        d_max = max(w.demand_s for w in state.plan)
        assert d_max <= settings.transition_admit * settings.window_s * k_avail + 1e-9
        if settings.transition_admit <= 1.0:
            assert d_max <= settings.window_s * k_avail  # capacity never below demand


def test_target_reached_in_one_step_with_ops_on_disjoint_domains() -> None:
    # D = 48 s per 10 s: u = 1.26 on 4xCP4+3xCP8; 6xCP4+2xCP8 (K 4.2) 1.14,
    # 8xCP4+1xCP8 (4.6) 1.04, 10xCP4 (5.0) 0.96 -> the target is 10xCP4.
    state = start("4xCP4+3xCP8")
    state, ops = step(state, load(48.0), CAP, FREE)
    assert ops == ()
    state, ops = step(state, load(48.0), CAP, FREE)
    assert str(state.target) == "10xCP4"
    assert len(ops) == 3 and all(isinstance(op, Split) for op in ops)
    domains = [state.layout.slot(op.worker).domain for op in ops]
    assert len(set(domains)) == 3  # one CP8 per NVLink domain, each drained on its own
    assert all(op.reason.endswith("target 10xCP4") for op in ops)
    state, done = finish(state, FREE)
    assert done == list(ops)  # nothing more was needed after the first step
    assert str(state.layout.composition) == "10xCP4"
    assert state.epoch == 3


def test_chained_after_commits_when_capacity_precedence_holds_them_back() -> None:
    # Same demand, default transition bound: two CP8s draining at once would
    # leave 2.6/s for 4.8/s of demand, so the ops go one after another, each
    # started by advance() at the previous commit, with no window in between.
    settings = replace(BASE, transition_admit=1.0)
    state = start("4xCP4+3xCP8")
    state, _ = step(state, load(48.0), CAP, settings)
    state, ops = step(state, load(48.0), CAP, settings)
    assert len(ops) == 1 and str(state.target) == "10xCP4"
    chain = [ops]
    for i in range(3):
        op = state.pending[0]
        state = commit(state, [100 + 2 * i, 101 + 2 * i], op)
        state, more = advance(state, (), CAP, settings)
        chain.append(more)
    assert [len(c) for c in chain] == [1, 1, 1, 0]
    assert str(state.layout.composition) == "10xCP4" and state.target is None


def test_merges_run_concurrently_while_the_rest_carries_the_demand() -> None:
    # 10xCP4 (K 5.0) at u = 0.3: D = 15 s. Merging CP4 pairs lowers K by 0.4
    # each; admission (merged u <= 0.9) allows all five (5xCP8, K 3.0: u 0.5).
    # Each pair in flight removes 1.0/s; at transition_admit 0.9, 15 <= 9·K_avail
    # needs K_avail >= 1.67: at most three pairs at once (K_avail 2.0).
    # Long share 1.0: no merged composition would split back on the mix.
    settings = replace(BASE, transition_admit=0.9, max_concurrent_ops=8)
    state = start("10xCP4")
    state, _ = step(state, load(15.0, 1.0), CAP, settings)
    state, ops = step(state, load(15.0, 1.0), CAP, settings)
    assert str(state.target) == "5xCP8"
    assert len(ops) == 3 and all(isinstance(op, Merge) for op in ops)
    state, done = finish(state, settings)
    assert len(done) == 5 and str(state.layout.composition) == "5xCP8"


def test_max_concurrent_ops_bounds_the_operations_in_flight() -> None:
    settings = replace(FREE, max_concurrent_ops=2)
    state = start("4xCP4+3xCP8")
    for _ in range(2):
        state, ops = step(state, load(48.0), CAP, settings)
    assert len(ops) == 2
    state, done = finish(state, settings)
    assert len(done) == 3 and str(state.layout.composition) == "10xCP4"


def test_target_only_as_far_as_every_confirming_window_asks() -> None:
    # First window D = 48 (would go to 10xCP4), second D = 40 (u 1.05 on
    # 4xCP4+3xCP8, 0.95 on 6xCP4+2xCP8): the streak agrees on one split only.
    state = start("4xCP4+3xCP8")
    state, _ = step(state, load(48.0), CAP, FREE)
    state, ops = step(state, load(40.0), CAP, FREE)
    assert len(ops) == 1 and str(state.target) == "6xCP4+2xCP8"
    assert (
        str(plan_target(start("4xCP4+3xCP8").layout, [load(48.0)], "split", CAP, FREE)) == "10xCP4"
    )


def test_long_share_walk_stops_at_the_fixed_point() -> None:
    # Long requests bring 60 % of the demand. CP8 shares of K along the merges
    # from 10xCP4: 8xCP4+1xCP8 0.13, 6+2 0.29, 4+3 0.47, 2+4 0.71.
    # D = 35 s (u 0.7 of 10xCP4, stable): the long share asks to merge while
    # 0.6 > share + 0.1, but admission (D <= 0.9·H·K') refuses 4xCP4+3xCP8
    # (K' 3.8: 34.2 < 35), so the walk ends at 6xCP4+2xCP8.
    target = plan_target(start("10xCP4").layout, [load(35.0, 0.6)], "merge", CAP, BASE)
    assert str(target) == "6xCP4+2xCP8"
    # D = 20 s: low utilization asks to merge down to 4xCP4+3xCP8 (u 0.53),
    # the long share one step more (0.6 > 0.57); at 2xCP4+4xCP8 both hold.
    target = plan_target(start("10xCP4").layout, [load(20.0, 0.6)], "merge", CAP, BASE)
    assert str(target) == "2xCP4+4xCP8"


def test_one_step_mode_is_unchanged() -> None:
    settings = replace(BASE, multi_step=False)
    state = start("4xCP4+3xCP8")
    for _ in range(2):
        state, ops = step(state, load(48.0), CAP, settings)
    assert len(ops) == 1 and state.target is None
    state = commit(state, [100, 101])
    state, more = advance(state, (), CAP, settings)
    assert more == ()


def test_a_window_during_a_transition_asks_for_nothing() -> None:
    state = start("4xCP4+3xCP8")
    for _ in range(2):
        state, ops = step(state, load(48.0), CAP, replace(BASE, transition_admit=1.0))
    assert len(state.pending) == 1
    state, ops = step(state, load(48.0), CAP, BASE)
    assert ops == () and state.split_streak == 0 and state.target is not None


@settings(max_examples=150, deadline=None)
@given(
    comp=st.sampled_from(enumerate_lattice(24, (2, 4, 8))),
    u=st.floats(0.1, 2.0),
    u2=st.floats(0.1, 2.0),
    long_share=st.floats(0.0, 1.0),
    max_ops=st.integers(1, 6),
    admit=st.sampled_from([0.5, 0.8, 1.0, 2.0]),
    seed=st.integers(0, 10**6),
)
def test_multi_op_transitions_keep_capacity_and_reach_the_target(
    comp: Composition,
    u: float,
    u2: float,
    long_share: float,
    max_ops: int,
    admit: float,
    seed: int,
) -> None:
    """Random compositions (CP2/CP4/CP8 on 24 GPUs) and demands; commits in random order.

    While several operations are in flight, the workers still serving keep
    the confirming demand under ``transition_admit`` (and so, for admit <= 1,
    never below the demand); the transition ends exactly at its target.
    """
    settings = replace(BASE, degrees=(2, 4, 8), max_concurrent_ops=max_ops, transition_admit=admit)
    state = initial_state(layout_for(comp))
    k = CAP.capacity_per_s(comp.degrees) * settings.window_s
    state, _ = step(state, load(u * k, long_share), CAP, settings)
    state, ops = step(state, load(u2 * k, long_share), CAP, settings)
    if not ops:
        assert state.target is None
        return
    target = state.target
    assert target is not None
    assert target == plan_target(
        initial_state(layout_for(comp)).layout, state.plan, state.momentum or "", CAP, settings
    )
    state, done = finish(state, settings, random.Random(seed))
    assert state.layout.composition == target
    assert state.layout.composition.gpus == 24
    kinds = {type(op) for op in done}
    assert len(kinds) == 1  # one direction per transition


def test_all_large_degree_pool_at_low_utilization_splits_to_the_long_share_target() -> None:
    # 5xCP8 (K 3.0) at u = 0.2 (D = 6 s), long requests bring 30 % of D. CP8
    # shares of K along the splits: 2xCP4+4xCP8 0.71, 4+3 0.47, 6+2 0.29.
    # The long share asks to split while 0.3 < share - 0.1: down to 6xCP4+2xCP8.
    state = start("5xCP8")
    state, _ = step(state, load(6.0, 0.3), CAP, BASE)
    state, ops = step(state, load(6.0, 0.3), CAP, BASE)
    assert str(state.target) == "6xCP4+2xCP8"
    assert ops and all(isinstance(op, Split) for op in ops)
    state, done = finish(state, BASE)
    assert len(done) == 3 and str(state.layout.composition) == "6xCP4+2xCP8"
    # Utilization stays low, but merging back to 4xCP4+3xCP8 would ask for a
    # split again (0.3 < 0.47 - 0.1): not admitted, the pool stays put.
    for _ in range(6):
        state, ops = step(state, load(6.0, 0.3), CAP, BASE)
        assert ops == ()
    # The earlier rule: low utilization vetoes the split, 5xCP8 forever.
    off = replace(BASE, mix_below_lower=False)
    state = start("5xCP8")
    for _ in range(6):
        state, ops = step(state, load(6.0, 0.3), CAP, off)
        assert ops == ()


def test_overload_still_splits_an_all_large_degree_pool_whatever_the_long_share() -> None:
    # u = 1.2 on 5xCP8 with every request long: the capacity signal wins.
    state = start("5xCP8")
    state, _ = step(state, load(36.0, 1.0), CAP, BASE)
    state, ops = step(state, load(36.0, 1.0), CAP, BASE)
    assert ops and isinstance(ops[0], Split) and ops[0].reason.startswith("utilization")


def test_low_utilization_merges_stop_where_the_long_share_would_split_back() -> None:
    # 10xCP4 at u = 0.3 (D = 15 s), long share 0.5: merges while admitted on
    # capacity and while the merged pool's CP8 share minus 0.1 stays <= 0.5:
    # 4xCP4+3xCP8 (0.47) yes, 2xCP4+4xCP8 (0.71) no.
    target = plan_target(start("10xCP4").layout, [load(15.0, 0.5)], "merge", CAP, BASE)
    assert str(target) == "4xCP4+3xCP8"
    off = replace(BASE, mix_below_lower=False)
    assert str(plan_target(start("10xCP4").layout, [load(15.0, 0.5)], "merge", CAP, off)) == "5xCP8"
