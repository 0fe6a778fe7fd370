"""The walk to a pinned composition, and the controller shell's window feeding."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from vertumnus.core import planner
from vertumnus.core import transition as tr
from vertumnus.core.control import Controller
from vertumnus.core.lattice import check_grouping, enumerate_lattice, layout_for
from vertumnus.core.types import Composition
from vertumnus.operator.controller import feed, next_pinned_op
from vertumnus.operator.routerapi import Window
from vertumnus.profiles import load_capacity, load_model

DEGREES = (2, 4, 8)
LATTICE = enumerate_lattice(32, DEGREES, 8)


def _walk(
    pool: tr.PoolState, target: Composition, degrees=DEGREES, limit=64
) -> tuple[tr.PoolState, int]:
    steps = 0
    while (op := next_pinned_op(pool.layout, target, degrees, pool.busy())) is not None:
        pool, t, _ = tr.begin(pool, op)
        for w in t.members:
            pool, _ = tr.drained(pool, t.id, w)
        pool, _ = tr.switched(pool, t.id)
        check_grouping(pool.layout.slots, 8)
        steps += 1
        assert steps <= limit
    return pool, steps


@settings(max_examples=120, deadline=None)
@given(st.sampled_from(LATTICE), st.sampled_from(LATTICE))
def test_any_pinned_composition_is_reached_by_splits_and_merges(start, target):
    pool = tr.initial_pool(layout_for(start, 8))
    pool, steps = _walk(pool, target)
    assert Counter(s.degree for s in pool.layout.slots) == Counter(target.degrees)
    # Per domain, at most (workers before + workers after) operations: no wandering.
    assert steps <= start.workers + target.workers


def test_a_domain_already_at_its_share_is_left_alone():
    pool = tr.initial_pool(layout_for(Composition.parse("2xCP8"), 8))
    op = next_pinned_op(pool.layout, Composition.parse("2xCP4+1xCP8"), (4, 8), frozenset())
    assert op == planner.Split(1, "pinned composition")
    # ... and a domain whose workers are busy waits (the other one is not reshaped instead).
    assert (
        next_pinned_op(pool.layout, Composition.parse("2xCP4+1xCP8"), (4, 8), frozenset({1}))
        is None
    )
    assert next_pinned_op(pool.layout, Composition.parse("2xCP8"), (4, 8), frozenset()) is None


def test_feeding_sums_a_window_into_the_controller():
    cap = load_capacity("qwen3-30b-a3b/h200")
    layout = layout_for(Composition.parse("2xCP8"), 8)
    c = Controller(
        planner.initial_state(layout), cap, planner.PlannerSettings(window_s=1.0, check_hops=1)
    )
    w = Window(
        hop=1,
        demand_s=3.0,
        requests=30,
        running_remaining_s={0: 0.2, 99: 5.0},
        reused_blocks={1: 4.0},
    )
    tick = feed(c, w, layout, in_flight=False)
    assert tick is not None and tick.observation.demand_s == 3.0
    assert {o.worker: o.running_remaining_s for o in tick.observation.workers} == {0: 0.2, 1: 0.0}
    assert c.windows.reuse_weight(1) > 0
    tick = feed(c, w, layout, in_flight=True)  # a transition in flight: observe, do nothing
    assert tick is not None and tick.ops == ()


def _listed(n: int, long_every: int = 4) -> list[tuple[float, int, int, tuple[int, ...], int]]:
    """``n`` placements over one second as a router replica lists them: every
    ``long_every``-th one long, all sharing a first block (a system prompt), on
    workers 0 and 1 in turn."""
    rows = []
    for i in range(n):
        length = 60000 if i % long_every == 0 else 2000
        keys = (7, *(1000 * i + b for b in range(1, -(-length // 16))))
        rows.append((i / n, length, 16 if i else 0, keys, i % 2))
    return rows


def test_the_listed_placements_feed_the_what_if_check():
    cap = load_capacity("qwen3-30b-a3b/h200")
    layout = layout_for(Composition.parse("4xCP4"), 8)
    settings = planner.PlannerSettings(window_s=1.0, check_hops=1, min_requests=4, degrees=(4, 8))
    c = Controller(planner.initial_state(layout), cap, settings, load_model(), None, 16)
    w = Window(hop=1, demand_s=3.0, requests=12, placed=_listed(12), started_s=100.0)
    tick = feed(c, w, layout, in_flight=False)
    assert tick is not None and tick.whatif is not None
    assert tick.whatif.current.requests == 12
    assert tick.whatif.current.composition == Composition.parse("4xCP4")
    assert {str(e.composition) for _, e in tick.whatif.candidates} >= {"2xCP4+1xCP8"}
    # Each row's worker reaches the window (whatif_held starts the replays there).
    two = replace(settings, window_s=2.0, hop_s=1.0)
    c = Controller(planner.initial_state(layout), cap, two, load_model(), None, 16)
    feed(c, w, layout, in_flight=True)
    window = c.windows.columns()
    assert window.workers is not None and window.workers.tolist() == [i % 2 for i in range(12)]

    # A replica that listed only part of its hop: the check skips the window (a part
    # of the requests would look like a lighter load), the rules still read it.
    c = Controller(planner.initial_state(layout), cap, settings, load_model(), None, 16)
    cut = Window(hop=1, demand_s=3.0, requests=13, placed=_listed(12), placed_left_out=1)
    tick = feed(c, cut, layout, in_flight=False)
    assert tick is not None and tick.whatif is None and tick.observation.requests == 13
    # ... and so does a malformed row.
    c = Controller(planner.initial_state(layout), cap, settings, load_model(), None, 16)
    bad = Window(hop=1, demand_s=3.0, requests=12, placed=[*_listed(11), (0.5, 0, 0, (), 0)])
    tick = feed(c, bad, layout, in_flight=False)
    assert tick is not None and tick.whatif is None

    # Without a model (spec.controller.whatif false) there is no check.
    c = Controller(planner.initial_state(layout), cap, settings)
    tick = feed(c, w, layout, in_flight=False)
    assert tick is not None and tick.whatif is None


def test_the_listed_placements_feed_the_shadow_pools():
    cap = load_capacity("qwen3-30b-a3b/h200")
    layout = layout_for(Composition.parse("4xCP4"), 8)
    settings = planner.PlannerSettings(
        window_s=1.0, check_hops=1, min_requests=4, degrees=(4, 8), shadow=True
    )
    c = Controller(planner.initial_state(layout), cap, settings, load_model(), None, 16)
    feed(c, Window(hop=1, requests=12, placed=_listed(12), started_s=100.0), layout, False)
    assert c.shadows is None  # no report has said how large the workers' caches are
    sized = Window(
        hop=2, requests=12, placed=_listed(12), started_s=101.0, cache_blocks_per_gpu=500
    )
    feed(c, sized, layout, in_flight=False)
    bank = c.shadows
    assert bank is not None and bank.cache_blocks_per_gpu == 500
    followed = set(bank.shadows)  # the current composition and its neighbours, from now
    assert Composition.parse("4xCP4") in followed and len(followed) > 1
    sized.hop, sized.started_s = 3, 102.0
    feed(c, sized, layout, in_flight=False)
    assert all(len(s.ttfts) == 12 for s in bank.shadows.values())  # each served the hop
    # A hop some replica listed only in part: the shadows missed requests, so they
    # start over (cold, from the latest arrival).
    cut = Window(hop=4, requests=13, placed=_listed(12), started_s=103.0, placed_left_out=1)
    feed(c, cut, layout, in_flight=False)
    assert c.shadows is bank and set(bank.shadows) == followed
    assert all(len(s.ttfts) == 0 and s.started_s == bank.now_s for s in bank.shadows.values())
