"""The what-if estimate (core/whatif.py) and the controller's check built on it (core/control.py)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from vertumnus.core import planner, probes, whatif
from vertumnus.core.control import Controller
from vertumnus.core.costmodel import PrefillModel
from vertumnus.core.memory import Memory
from vertumnus.core.placement import PlacementParams
from vertumnus.core.start import history_requests, initial_composition
from vertumnus.core.types import Composition, Request
from vertumnus.core.windows import ControlWindows
from vertumnus.profiles import load_model
from vertumnus.sim.synthetic import SyntheticConfig, generate

BS = 512
FIXED_BETA = PlacementParams(beta=1.0, lam=0.0, beta_busy=1.0)


@pytest.fixture(scope="module")
def model() -> PrefillModel:
    return load_model()


def table(model, rows, degrees=(4, 8)):
    return whatif.RequestTable(rows, BS, model, degrees)


def keys(*ids):
    return tuple(ids)


def test_an_idle_pool_serves_each_request_at_its_best_degree(model):
    t = table(model, [(0.0, 60000, 0, keys(1)), (100.0, 2000, 0, keys(2))])
    e = whatif.estimate(t, Composition.parse("1xCP4+1xCP8"), FIXED_BETA)
    assert e.requests == 2
    long_s = min(model.predict(d, 60000, 0) for d in (4, 8))
    short_s = min(model.predict(d, 2000, 0) for d in (4, 8))
    assert long_s == model.predict(8, 60000, 0)  # CP8 wins long, CP4 (less start-up) short
    assert short_s == model.predict(4, 2000, 0)
    assert e.mean_s == pytest.approx((long_s + short_s) / 2)


def test_simultaneous_requests_queue_on_a_single_worker(model):
    t = table(model, [(0.0, 8000, 0, keys(1)), (0.0, 8000, 0, keys(2))])
    e1 = model.predict(8, 8000, 0)
    one = whatif.estimate(t, Composition.parse("CP8"), FIXED_BETA)
    assert one.mean_s == pytest.approx(1.5 * e1)  # the second waits for the first
    two = whatif.estimate(t, Composition.parse("2xCP4"), FIXED_BETA)
    assert two.mean_s == pytest.approx(model.predict(4, 8000, 0))  # in parallel


def test_a_cached_prefix_counts_only_where_it_is_held(model):
    # Request 2 reuses request 1's first 40 blocks (20K tokens); it arrives while
    # request 1 still runs, so its choice is: wait for the holder (hit) or run
    # now elsewhere (miss).
    doc = tuple(range(1, 41))
    rows = [(0.0, 20480, 0, doc), (0.1, 20992, 20480, (*doc, 99))]
    t = table(model, rows, degrees=(8,))
    e = whatif.estimate(t, Composition.parse("2xCP8"), FIXED_BETA)
    first = model.predict(8, 20480, 0)
    hit = model.predict(8, 512, 20480)
    miss = model.predict(8, 20992, 0)
    second = min(first - 0.1 + hit, miss)  # the cheaper of waiting for the hit and missing
    assert e.mean_s == pytest.approx((first + second) / 2)
    # With no holder (a table that says nothing was reused) both run at once.
    cold = table(model, [(0.0, 20480, 0, doc), (0.1, 20992, 0, (*doc, 99))], degrees=(8,))
    assert whatif.estimate(cold, Composition.parse("2xCP8"), FIXED_BETA).mean_s == pytest.approx(
        (first + miss) / 2
    )


def test_workers_a_transition_creates_serve_only_from_their_start(model):
    t = table(model, [(0.0, 4000, 0, keys(1)), (0.0, 4000, 0, keys(2))])
    starts = whatif.transition_starts([(1.0, (4, 4))], switch_s=0.5, concurrent=4)
    assert starts == {4: [1.5, 1.5]}
    late = whatif.estimate(t, Composition.parse("2xCP4"), FIXED_BETA, starts)
    e4 = model.predict(4, 4000, 0)
    assert late.mean_s == pytest.approx(1.5 + e4)
    assert late.transition_s == 1.5


def test_transition_batches_follow_the_concurrency_limit():
    steps = [(1.0, (4, 4)), (0.2, (4, 4)), (3.0, (8,))]
    assert whatif.transition_starts(steps, switch_s=0.5, concurrent=2) == {
        4: [1.5, 1.5, 1.5, 1.5],
        8: [1.5 + 3.5],
    }


def test_a_request_no_worker_can_hold_is_not_dropped_from_the_mean(model):
    too_long = model.max_tokens(4) + 1
    t = table(model, [(0.0, 1000, 0, keys(1)), (1.0, too_long, 0, keys(2))], degrees=(4,))
    e = whatif.estimate(t, Composition.parse("CP4"), FIXED_BETA)
    assert e.requests == 2 and e.mean_s == pytest.approx(model.predict(4, 1000, 0))


def test_best_of_picks_the_lowest_mean(model):
    burst = [(0.0, 3000, 0, keys(i)) for i in range(8)]
    best, found = whatif.best_of(
        table(model, burst), [Composition.parse("CP8"), Composition.parse("2xCP4")], FIXED_BETA
    )
    assert best == Composition.parse("2xCP4") and found[1].mean_s < found[0].mean_s


# -- the controller's check -------------------------------------------------------


def settings(**kw):
    base = dict(window_s=20.0, persist_windows=1, domain_size=8, degrees=(4, 8), check_hops=1)
    return planner.PlannerSettings(**{**base, **kw})


def feed(ctl: Controller, requests):
    for i, (t, length) in enumerate(requests):
        ctl.windows.placed(Request(i, t, length, (i + 1,)), 1.0, 0)


def test_a_split_the_rules_ask_for_is_vetoed_when_it_does_not_pay(model):
    # κ tiny: every window is "overloaded" and the rules ask to split the CP8.
    # The requests are long and sparse: on two CP4s each one just runs slower.
    tiny = planner.CapacityProfile({4: 0.001, 8: 0.002})
    layout = planner.layout_for(Composition.parse("CP8"), 8)
    ctl = Controller(planner.initial_state(layout), tiny, settings(min_requests=4), model)
    feed(ctl, [(t, 60000) for t in (0.0, 5.0, 10.0, 15.0)])
    tick = ctl.tick({0: 0.0}, reconfiguring=False)
    assert tick is not None and tick.ops == ()
    assert tick.whatif is not None and tick.whatif.verdict == "veto"
    assert tick.whatif.proposed is not None
    assert tick.whatif.proposed.mean_s > tick.whatif.current.mean_s
    # Without the check the rules split.
    rules = Controller(
        planner.initial_state(layout), tiny, settings(min_requests=4, whatif=False), model
    )
    feed(rules, [(t, 60000) for t in (0.0, 5.0, 10.0, 15.0)])
    tick = rules.tick({0: 0.0}, reconfiguring=False)
    assert tick is not None and tick.whatif is None
    assert [type(op) for op in tick.ops] == [planner.Split]


def test_the_check_moves_on_its_own_after_persist_windows(model):
    # κ huge: utilization is low and the rules ask for a merge of nothing (one
    # CP8) — they ask for nothing. Bursts of short requests: two CP4s halve the wait.
    huge = planner.CapacityProfile({4: 1000.0, 8: 1000.0})
    layout = planner.layout_for(Composition.parse("CP8"), 8)
    ctl = Controller(
        planner.initial_state(layout),
        huge,
        settings(persist_windows=2, min_requests=4, whatif_decisive=1.0),
        model,
    )
    # A small request opens the window; the burst comes after the switch would be done.
    burst = [(0.0, 100)] + [(2.0, 6000)] * 6
    feed(ctl, burst)
    first = ctl.tick({0: 0.0}, reconfiguring=False)
    assert first is not None and first.ops == () and first.whatif.verdict == "wait"
    feed(ctl, [(20.0 + t, n) for t, n in burst])
    second = ctl.tick({0: 0.0}, reconfiguring=False)
    assert second is not None and second.whatif.verdict == "trigger"
    assert second.ops == (planner.Split(0, reason=second.ops[0].reason),)
    assert second.ops[0].reason.startswith("what-if: 2xCP4")
    assert second.target == "2xCP4"
    # The commit ends the move: the target is reached.
    assert ctl.committed(second.ops[0], [1, 2], [0], {1: 0.0, 2: 0.0}) == ()
    assert ctl.state.target is None and ctl.state.pending == ()


def test_a_move_by_persistence_needs_the_looks_between_to_agree(model):
    # The burst window of the test above pays a split by the margin, not decisively,
    # and the streak says the window before paid too. What the looks of the last
    # persist_windows windows estimated (given as the controller's memory, one look
    # per window here) decides: on average they must not say the split loses.
    huge = planner.CapacityProfile({4: 1000.0, 8: 1000.0})
    layout = planner.layout_for(Composition.parse("CP8"), 8)
    on = str(layout.composition)

    def verdict(looks, agree=True):  # type: ignore[no-untyped-def]
        ps = settings(persist_windows=2, min_requests=4, whatif_decisive=1.0,
                      whatif_accumulate=False, whatif_agree=agree)  # fmt: skip
        memory = Memory(streak=("split", 1), looks=looks)
        ctl = Controller(planner.initial_state(layout), huge, ps, model, memory=memory)
        feed(ctl, [(0.0, 100)] + [(2.0, 6000)] * 6)
        tick = ctl.tick({0: 0.0}, reconfiguring=False)
        assert tick is not None and tick.whatif is not None
        gain = 1.0 - tick.whatif.best.mean_s / tick.whatif.current.mean_s
        assert 0.03 <= gain < 0.5  # pays the margin, and a look at -0.5 outweighs it
        return tick.whatif.verdict, ctl.memory().looks

    assert verdict((on, ((0.0, 0.0),)))[0] == "trigger"
    # The look before estimated that a split loses half the mean: no move yet...
    said, looks = verdict((on, ((-0.5, 0.0),)))
    assert said == "wait"
    assert looks[0] == on and len(looks[1]) == 2 and looks[1][0] == (-0.5, 0.0)
    # ... unless the looks are not asked, or were taken on another composition.
    assert verdict((on, ((-0.5, 0.0),)), agree=False)[0] == "trigger"
    assert verdict(("2xCP4", ((-0.5, 0.0),)))[0] == "trigger"


def test_a_decisive_gain_moves_after_one_window(model):
    huge = planner.CapacityProfile({4: 1000.0, 8: 1000.0})
    layout = planner.layout_for(Composition.parse("CP8"), 8)
    ctl = Controller(
        planner.initial_state(layout), huge, settings(persist_windows=2, min_requests=4), model
    )
    feed(ctl, [(0.0, 100)] + [(2.0, 6000)] * 6)
    tick = ctl.tick({0: 0.0}, reconfiguring=False)
    assert tick is not None and tick.whatif.verdict == "trigger" and tick.target == "2xCP4"
    best = tick.whatif.best
    assert best is not None and best.mean_s <= 0.9 * tick.whatif.current.mean_s


def test_a_rules_move_that_stops_short_is_extended(model):
    # The rules (κ tiny: "overloaded") split one CP8 of 2xCP8 per window with
    # one-step planning; the burst pays most on 4xCP4: the check goes all the way.
    tiny = planner.CapacityProfile({4: 0.001, 8: 0.002})
    ps = settings(min_requests=4, multi_step=False, whatif_decisive=1.0, domain_size=16)
    layout = planner.layout_for(Composition.parse("2xCP8"), 16)
    ctl = Controller(planner.initial_state(layout), tiny, ps, model)
    feed(ctl, [(0.0, 100)] + [(3.0, 6000)] * 16)
    tick = ctl.tick({0: 0.0, 1: 0.0}, reconfiguring=False)
    assert tick is not None and tick.whatif.verdict == "extend"
    assert tick.whatif.proposed is not None
    assert str(tick.whatif.proposed.composition) == "2xCP4+1xCP8"  # the rules' one step
    assert tick.target == "4xCP4"
    # One split at a time: both at once would leave no worker serving.
    assert [type(op) for op in tick.ops] == [planner.Split]
    more = ctl.committed(tick.ops[0], [2, 3], [tick.ops[0].worker], {1: 0.0, 2: 0.0, 3: 0.0})
    assert more == (planner.Split(1, reason=tick.ops[0].reason),)


def test_a_multi_step_move_hands_out_the_rest_on_commit(model):
    huge = planner.CapacityProfile({4: 1000.0, 8: 1000.0})
    layout = planner.layout_for(Composition.parse("2xCP8"), 8)
    ctl = Controller(
        planner.initial_state(layout),
        huge,
        settings(persist_windows=1, min_requests=4, max_concurrent_ops=1),
        model,
    )
    feed(ctl, [(0.0, 100)] + [(5.0, 6000)] * 12)
    tick = ctl.tick({0: 0.0, 1: 0.0}, reconfiguring=False)
    assert tick is not None and tick.whatif.verdict == "trigger" and tick.target == "4xCP4"
    assert len(tick.ops) == 1  # one at a time
    more = ctl.committed(tick.ops[0], [2, 3], [tick.ops[0].worker], {1: 0.0, 2: 0.0, 3: 0.0})
    assert [type(op) for op in more] == [planner.Split]
    assert ctl.committed(more[0], [4, 5], [more[0].worker], {2: 0.0, 3: 0.0, 4: 0.0, 5: 0.0}) == ()
    assert sorted(s.degree for s in ctl.state.layout.slots) == [4, 4, 4, 4]


def test_no_check_without_a_model_or_while_reconfiguring(model):
    huge = planner.CapacityProfile({4: 1000.0, 8: 1000.0})
    layout = planner.layout_for(Composition.parse("CP8"), 8)
    blind = Controller(planner.initial_state(layout), huge, settings(min_requests=1))
    feed(blind, [(0.0, 6000)] * 6)
    assert blind.tick({0: 0.0}, reconfiguring=False).whatif is None
    busy = Controller(planner.initial_state(layout), huge, settings(min_requests=1), model)
    feed(busy, [(0.0, 6000)] * 6)
    assert busy.tick({0: 0.0}, reconfiguring=True).whatif is None


def test_initial_composition_is_the_lowest_estimate_on_the_history(model):
    lattice = planner.enumerate_lattice(16, (4, 8))
    # A steady stream of short requests: the estimate prefers more, smaller workers.
    reqs = [Request(i, 0.05 * i, 3000, (i + 1,)) for i in range(400)]
    cap = planner.CapacityProfile({4: 0.458, 8: 0.631})
    got = initial_composition(reqs, BS, None, lattice, cap, model, settings())
    t = whatif.RequestTable(
        [(r.arrival_s, r.length, 0, r.block_keys) for r in reqs], BS, model, (4, 8)
    )
    assert got == whatif.best_of(t, lattice, PlacementParams())[0]
    ruled = initial_composition(reqs, BS, None, lattice, cap, model, settings(whatif=False))
    hist = [planner.HistoryRequest(r.arrival_s, r.length) for r in reqs]
    assert ruled == planner.initial_composition(hist, lattice, cap, model, settings())


def test_settings_reject_a_bad_margin():
    with pytest.raises(ValueError, match="whatif_margin"):
        planner.PlannerSettings(whatif_margin=1.5)
    with pytest.raises(ValueError, match="switch_s"):
        planner.PlannerSettings(switch_s=-1)


def random_table(model, seed: int, n: int = 600):
    import random

    rng = random.Random(seed)
    rows, t = [], 0.0
    for i in range(n):
        t += rng.expovariate(40.0) if rng.random() > 0.1 else 0.0  # some ties in arrival
        length = int(rng.lognormvariate(8.5, 1.0)) + 50
        nb = -(-length // BS)
        shared = rng.randrange(min(nb, 6))  # a few popular prefixes of up to 5 blocks
        doc = rng.randrange(12)
        keys = tuple(doc * 100 + j for j in range(shared)) + tuple(
            10**6 + i * 1000 + j for j in range(nb - shared)
        )
        cached = min(length - 1, shared * BS)
        rows.append((t, length, cached, keys))
    return table(model, rows, degrees=(2, 4, 8))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_compiled_replay_gives_the_python_floats(model, seed):
    if whatif.HOT_PATH != "c":
        pytest.skip("built without a C compiler: only the Python replay exists")
    t = random_table(model, seed)
    params = PlacementParams()  # load-dependent β: the waiting count matters
    for comp, starts in (
        (Composition.parse("2xCP2+1xCP4+1xCP8"), None),
        (Composition.parse("4xCP4"), {4: [0.7, 0.7]}),
        (Composition.parse("1xCP8"), None),
        # Heaps several levels deep, of odd and even sizes, some workers starting late.
        (Composition.parse("13xCP2+6xCP4+2xCP8"), {2: [0.3, 0.3, 1.1]}),
    ):
        counts = {d: comp.degrees.count(d) for d in set(comp.degrees)}
        degs = sorted(counts)
        index = [t.degrees.index(d) for d in degs]
        late = starts or {}
        ws = [[0.0] * (counts[d] - len(late.get(d, []))) + sorted(late.get(d, [])) for d in degs]
        lam = [params.lam * (d / degs[0] - 1.0) for d in degs]
        extra = params.beta_busy - params.beta
        py = whatif.replay_py(t, index, ws, lam, params.beta, extra)
        c = np.empty(t.n)
        whatif.replay(
            t.arrivals,
            t.hit,
            t.miss,
            index,
            t.reused,
            t.carry_ptr,
            t.carry_ids,
            t.n_prefixes,
            ws,
            lam,
            params.beta,
            extra,
            c,
        )
        assert c.tolist() == py  # bit for bit
        assert any(h > 0 for h in t.reused)  # the table exercises the holders


def test_the_compiled_replay_refuses_inconsistent_shapes(model):
    if whatif.HOT_PATH != "c":
        pytest.skip("built without a C compiler")
    t = random_table(model, 0, n=20)
    with pytest.raises(ValueError, match="inconsistent table shapes"):
        whatif.replay(
            t.arrivals, t.hit[:1], t.miss, [0, 1], t.reused, t.carry_ptr, t.carry_ids,
            t.n_prefixes, [[0.0], [0.0]], [0.0, 0.0], 1.0, 0.0, np.empty(t.n),
        )  # fmt: skip
    with pytest.raises(ValueError, match="outside the table's rows"):
        whatif.replay(
            t.arrivals, t.hit, t.miss, [0, len(t.degrees)], t.reused, t.carry_ptr, t.carry_ids,
            t.n_prefixes, [[0.0], [0.0]], [0.0, 0.0], 1.0, 0.0, np.empty(t.n),
        )  # fmt: skip


def prefixes(table: whatif.RequestTable) -> list[tuple[int, list[int]]]:
    """Per row, the prefix it reused and those it carries (of the prefixes some row
    reuses), each numbered by its first reuse: the same for two tables of the same
    rows however their ids were given."""
    first: dict[int, int] = {}
    for i in table.reused.tolist():
        if i >= 0:
            first.setdefault(i, len(first))
    return [
        (first.get(r, -1), sorted(first[i] for i in carried if i in first))
        for r, carried in zip(table.reused.tolist(), table.lists()[2], strict=True)
    ]


def test_the_windows_columns_give_the_table_of_their_rows(model):
    w = ControlWindows(planner.PlannerSettings(window_s=30.0, hop_s=10.0))
    import random

    rows = []
    rng = random.Random(5)
    for hop in range(3):
        for i in range(30):
            n_blocks = rng.randrange(1, 8)
            shared = rng.randrange(n_blocks)
            keys = tuple(range(shared)) + tuple(
                10**6 + 100 * (30 * hop + i) + j for j in range(n_blocks - shared)
            )
            req = Request(30 * hop + i, 10.0 * hop + 0.3 * i, n_blocks * BS, keys)
            w.placed(req, 1.0, shared * BS)
            rows.append((req.arrival_s, req.length, shared * BS, keys))
        if hop < 2:
            w.close_hop()
    cols = w.columns()
    # A key one request of the hop carries is indexed by its position (an int, which
    # the garbage collector does not walk); several carriers make a list.
    values = [v for part in w._parts() for v in part.keys.values()]
    assert len(w._parts()) == 3
    assert any(isinstance(v, int) for v in values) and any(isinstance(v, list) for v in values)
    assert all(isinstance(v, int) or len(v) >= 2 for v in values)
    assert cols.arrivals.tolist() == [r[0] for r in rows]
    assert cols.lengths.tolist() == [r[1] for r in rows]
    assert cols.cached.tolist() == [r[2] for r in rows]
    # One id per reused key.
    reused = [whatif.reused_key(r[3], r[2], BS) for r in rows]
    assert [i >= 0 for i in cols.reused.tolist()] == [k is not None for k in reused]
    ids = {k: i for k, i in zip(reused, cols.reused.tolist(), strict=True) if k is not None}
    assert len(set(ids.values())) == len(ids)
    # The table of the windows' columns (their carriers paired at placement) is the
    # table of the same rows paired afresh: the same carried prefixes per request and
    # the same replay.
    columnar = whatif.RequestTable.of_columns(cols, model, (4, 8))
    fresh = whatif.RequestTable(rows, BS, model, (4, 8))
    assert prefixes(columnar) == prefixes(fresh)
    # Each request's carried ids in ascending order (the order the replay reads them).
    carried = columnar.lists()[2]
    assert all(c == sorted(c) for c in carried) and any(len(c) > 1 for c in carried)
    for comp in ("2xCP4", "1xCP4+1xCP8", "2xCP8"):
        c = Composition.parse(comp)
        assert whatif.estimate(columnar, c, PlacementParams()) == whatif.estimate(
            fresh, c, PlacementParams()
        )


def test_the_windows_pair_carriers_as_the_window_slides(model):
    # Ten hops through a window of three: documents reused in bursts, so that a key
    # is carried before anyone reuses it (found in the older hops when it first is),
    # stops being reused long enough to be forgotten, and is reused again. At every
    # hop the table of the windows' columns is the table of the window's rows alone.
    import random

    rng = random.Random(23)
    w = ControlWindows(planner.PlannerSettings(window_s=30.0, hop_s=10.0))
    hops: list[list[tuple[float, int, int, tuple[int, ...]]]] = []
    for hop in range(10):
        rows = []
        for i in range(25):
            doc = rng.randrange(8)
            shared = rng.randrange(1, 5)
            own = rng.randrange(0, 4)
            keys = tuple(1000 * doc + j for j in range(shared)) + tuple(
                10**6 + 100 * (25 * hop + i) + j for j in range(own)
            )
            # Document d is reused in two hops in a row, then carried without being
            # reused for four (long enough to be forgotten), and so on.
            reuse = (hop // 2) % 3 == doc % 3 and rng.random() < 0.7
            cached = rng.randrange(1, shared + 1) * BS if reuse else 0
            req = Request(25 * hop + i, 10.0 * hop + 0.4 * i, len(keys) * BS, keys)
            w.placed(req, 1.0, cached)
            rows.append((req.arrival_s, req.length, cached, keys))
        hops.append(rows)
        window = [r for h in hops[-3:] for r in h]
        columnar = whatif.RequestTable.of_columns(w.columns(), model, (4, 8))
        fresh = whatif.RequestTable(window, BS, model, (4, 8))
        assert prefixes(columnar) == prefixes(fresh), f"hop {hop}"
        assert columnar.carry_ptr[-1] > 0
        c = Composition.parse("1xCP4+1xCP8")
        assert whatif.estimate(columnar, c, PlacementParams()) == whatif.estimate(
            fresh, c, PlacementParams()
        )
        w.close_hop()
    # Only the keys reused in the hops kept are still paired at placement, and the ids
    # of the others are given again.
    kept = {whatif.reused_key(r[3], r[2], BS) for h in hops[-len(w._seen_hops) :] for r in h} - {
        None
    }
    assert set(w._ids) == kept
    assert len(w._id_keys) < len({k for h in hops for r in h for k in r[3]})


def test_the_table_cut_at_a_change_is_the_table_of_the_requests_since_it(model):
    # Three hops whose arrivals overlap (a request can be placed a little after a
    # later one arrived), prefixes reused within and across hops: the window's
    # table cut after its first hop replays exactly as a table of the last two
    # hops' requests alone, and the same for a table whose rows need no sort.
    import random

    rng = random.Random(11)
    w = ControlWindows(planner.PlannerSettings(window_s=30.0, hop_s=10.0))
    rows = []
    for hop in range(3):
        for i in range(40):
            n_blocks = rng.randrange(1, 10)
            shared = rng.randrange(n_blocks)
            doc = rng.randrange(6)
            keys = tuple(1000 * doc + j for j in range(shared)) + tuple(
                10**6 + 100 * (40 * hop + i) + j for j in range(n_blocks - shared)
            )
            at = 6.0 + 10.0 * hop + 0.25 * i - rng.uniform(0.0, 6.0)
            req = Request(40 * hop + i, at, n_blocks * BS, keys)
            w.placed(req, 1.0, shared * BS)
            rows.append((at, req.length, shared * BS, keys))
        if hop < 2:
            w.close_hop()
    assert sorted(rows[40:]) != sorted(rows)[40:]  # the hops overlap in arrival time
    whole = whatif.RequestTable.of_columns(w.columns(), model, (4, 8))
    for tab, since in (
        (whole, rows[40:]),
        (whatif.RequestTable(sorted(rows), BS, model, (4, 8)), sorted(rows)[40:]),
    ):
        cut = tab.since(40)
        fresh = whatif.RequestTable(since, BS, model, (4, 8))
        assert cut.n == fresh.n == 80
        assert cut.arrivals.tolist() == fresh.arrivals.tolist()
        assert any(r >= 0 for r in cut.reused.tolist())
        for comp, starts in (
            ("3xCP4", None),
            ("1xCP4+1xCP8", {4: [0.7]}),
            ("2xCP8", {8: [0.2, 1.5]}),
        ):
            c = Composition.parse(comp)
            params = PlacementParams()
            assert whatif.estimate(cut, c, params, starts) == whatif.estimate(
                fresh, c, params, starts
            )


def test_a_horizon_weighs_a_lasting_gain_against_a_one_off_transition(model):
    # Two CP4s halve the burst's wait; the CP8's running prefill needs 1 s to
    # drain first. On the window alone the drain eats the gain; over five
    # windows (the drain paid in the first) the split pays.
    huge = planner.CapacityProfile({4: 1000.0, 8: 1000.0})
    layout = planner.layout_for(Composition.parse("CP8"), 8)
    burst = [(0.0, 100)] + [(2.0, 6000)] * 6
    checks = {}
    for horizon in (1, 5):
        ps = settings(persist_windows=1, min_requests=4, whatif_horizon=horizon)
        ctl = Controller(planner.initial_state(layout), huge, ps, model)
        feed(ctl, burst)
        columns = ctl.windows.columns()
        tick = ctl.tick({0: 1.0}, reconfiguring=False)
        assert tick is not None and tick.whatif is not None
        checks[horizon] = tick.whatif
    one, five = checks[1], checks[5]
    assert one.verdict == "stay" and one.candidates[0][1].mean_s > one.current.mean_s
    assert five.verdict == "trigger" and five.best is not None
    assert five.best.composition == Composition.parse("2xCP4")
    # The horizon's estimate: one window with the transition, four without it.
    steady = whatif.estimate(
        whatif.RequestTable.of_columns(columns, model, (4, 8)),
        Composition.parse("2xCP4"),
        ctl.params,
    )
    assert five.best.mean_s == pytest.approx((one.candidates[0][1].mean_s + 4 * steady.mean_s) / 5)
    with pytest.raises(ValueError, match="whatif_horizon"):
        settings(whatif_horizon=0)


@pytest.mark.parametrize("path", ["c", "python"])
def test_p90_is_numpys_percentile_bit_for_bit(path, monkeypatch):
    if path == "c" and whatif.HOT_PATH != "c":
        pytest.skip("built without a C compiler")
    monkeypatch.setattr(whatif, "HOT_PATH", path)
    rng = np.random.default_rng(0)
    # 200,000 and 460,800: the largest sample, as a 1,024-GPU pool's shadows read it.
    for n in [*range(1, 60), 1000, 1024, 1100, 15409, 23085, 40000, 200_000, 460_800]:
        ramp = np.sort(rng.random(n))
        for values in (
            rng.lognormal(0.0, 1.0, n),
            rng.integers(0, 4, n) * 0.1,  # ties across the P90
            ramp,
            ramp[::-1].copy(),
            np.concatenate([ramp[: n // 3], np.full(n - n // 3, 1e300)]),
            np.full(n, 2.5),
        ):
            assert whatif.p90(values.copy()) == float(np.percentile(values, 90))


def test_the_compiled_order_pair_is_the_sorted_pair():
    if whatif.HOT_PATH != "c":
        pytest.skip("built without a C compiler")
    rng = np.random.default_rng(3)
    for i in range(300):
        n = int(rng.integers(2, 30000 if i % 10 else 500_000))
        values = rng.lognormal(0.0, 2.0, n)
        k = int(rng.integers(0, n - 1))
        values[rng.random(n) < 0.01] = math.inf  # the order holds past the finite
        ordered = np.sort(values)
        assert whatif.order_pair(values, k) == (ordered[k], ordered[k + 1])
    with pytest.raises(ValueError, match="k=9 outside"):
        whatif.order_pair(np.zeros(10), 9)


def test_between_windows_the_check_alone_looks_and_only_a_decisive_gain_moves(model):
    # check_hops=4: a 20 s window evaluated every 5 s. The rules (κ tiny: they
    # always ask to split) read the disjoint windows only.
    tiny = planner.CapacityProfile({4: 0.001, 8: 0.002})
    layout = planner.layout_for(Composition.parse("CP8"), 8)
    rules = Controller(
        planner.initial_state(layout), tiny, settings(check_hops=4, whatif=False), model
    )
    assert rules.settings.hop == 5.0 and rules.settings.rules_at_boundaries
    decided = []
    for hop in range(8):
        rules.windows.placed(Request(hop, 5.0 * hop, 60000, (hop + 1,)), 1.0, 0)
        tick = rules.tick({0: 0.0}, reconfiguring=False)
        decided.append(None if tick is None else len(tick.ops))
        if tick is not None and tick.ops:
            rules.state = planner.initial_state(layout)  # not carried out: ask again
    # Three hops fill the first window; then the rules speak every fourth hop only.
    assert decided == [None, None, None, 1, 0, 0, 0, 1]

    # The check between windows: four quiet hops fill the first window, then a burst
    # arrives in the fifth hop, an evaluation between two windows' ends.
    huge = planner.CapacityProfile({4: 1000.0, 8: 1000.0})
    ps = settings(check_hops=4, persist_windows=2, min_requests=4)

    def burst_between_windows(ps: planner.PlannerSettings):  # type: ignore[no-untyped-def]
        ctl = Controller(planner.initial_state(layout), huge, ps, model)
        for hop in range(5):
            if hop == 4:
                feed(ctl, [(20.0, 100)] + [(21.0, 6000)] * 6)
            else:
                ctl.windows.placed(Request(100 + hop, 5.0 * hop, 100, (200 + hop,)), 1.0, 0)
            tick = ctl.tick({0: 0.0}, reconfiguring=False)
        return tick

    # A burst worth >= whatif_decisive moves at once...
    tick = burst_between_windows(ps)
    assert tick is not None and tick.whatif is not None
    assert tick.whatif.verdict == "trigger" and tick.target == "2xCP4"
    # ... a smaller one waits for the windows' end, where persistence is counted.
    tick = burst_between_windows(replace(ps, whatif_decisive=1.0))
    assert tick is not None and tick.whatif is not None
    assert tick.whatif.verdict == "wait" and tick.ops == ()


def test_replays_on_threads_give_the_same_check(model):
    # 2,400 requests: enough for the check to use its threads (>= 2000).
    trace = generate(SyntheticConfig(duration_s=20.0, mean_rate=120.0, peak_to_trough=1.0), seed=3)
    assert len(trace) >= 2000
    hist = history_requests(trace.requests, trace.block_size)
    layout = planner.layout_for(Composition.parse("6xCP4+2xCP8"), 8)
    kappa = planner.CapacityProfile({4: 0.46, 8: 0.63})
    checks = []
    for threads in (1, 2):
        ps = settings(persist_windows=1, whatif_threads=threads)
        ctl = Controller(planner.initial_state(layout), kappa, ps, model, None, trace.block_size)
        for r, h in zip(trace.requests, hist, strict=True):
            ctl.windows.placed(r, 0.01, h.cached_tokens)
        tick = ctl.tick({s.worker: 0.1 * s.worker for s in layout.slots}, reconfiguring=False)
        assert tick is not None and tick.whatif is not None
        checks.append((tick.whatif.to_dict(), tick.ops))
    assert checks[0] == checks[1]
    assert len(checks[0][0]["candidates"]) >= 3
    with pytest.raises(ValueError, match="whatif_threads"):
        settings(whatif_threads=0)


@pytest.mark.parametrize(
    ("composition", "verdict"),
    [("6xCP4+2xCP8", "agree"), ("2xCP4+4xCP8", "trigger")],  # the window's, the change's
)
def test_after_a_change_replays_on_threads_give_the_same_check(model, composition, verdict):
    # 15 s at 80 requests/s, then 5 s at three times that: the last look of the
    # window finds the change and also replays the requests since it, on threads
    # queued behind those the whole window's replays (dropped if they decide).
    rows = []
    for seed, (start, span, rate) in enumerate(((0.0, 15.0, 80.0), (15.0, 5.0, 240.0))):
        trace = generate(
            SyntheticConfig(duration_s=span, mean_rate=rate, peak_to_trough=1.0), seed=seed
        )
        hist = history_requests(trace.requests, trace.block_size)
        for r, h in zip(trace.requests, hist, strict=True):
            rows.append((replace(r, id=len(rows), arrival_s=r.arrival_s + start), h.cached_tokens))
    layout = planner.layout_for(Composition.parse(composition), 8)
    kappa = planner.CapacityProfile({4: 0.46, 8: 0.63})
    checks = []
    for threads in (1, 2):
        ps = settings(persist_windows=1, whatif_threads=threads, check_hops=8)
        ctl = Controller(planner.initial_state(layout), kappa, ps, model)
        for hop in range(8):
            for r, cached in rows:
                if 2.5 * hop <= r.arrival_s < 2.5 * (hop + 1):
                    ctl.windows.placed(r, 0.01, cached)
            tick = ctl.tick({s.worker: 0.1 * s.worker for s in layout.slots}, False)
        assert tick is not None and tick.whatif is not None and tick.whatif.change is not None
        checks.append((tick.whatif.to_dict(), tick.ops))
    assert len(rows) >= 2000
    assert checks[0] == checks[1]
    assert checks[0][0]["verdict"] == verdict


def _last_look(ctl: Controller, hops):  # type: ignore[no-untyped-def]
    """Each hop's (arrival, length) requests placed on one worker, ticking after each
    hop: the last tick, with its check."""
    rid, tick = 0, None
    for batch in hops:
        for t, n in batch:
            ctl.windows.placed(Request(rid, t, n, (1000 + rid,)), 1.0, 0)
            rid += 1
        tick = ctl.tick({0: 0.0}, reconfiguring=False)
    assert tick is not None and tick.whatif is not None
    return tick


def _quiet_then_burst(ctl: Controller):  # type: ignore[no-untyped-def]
    """Seven hops of two long requests each, then a burst of short ones in the eighth
    (the window's last 2.5 s), ticking after each hop: the eighth tick's check."""
    quiet = [[(2.5 * hop, 60000), (2.5 * hop + 0.5, 60000)] for hop in range(7)]
    return _last_look(ctl, [*quiet, [(17.5, 100)] + [(18.0, 8000)] * 10])


def test_after_a_change_of_arrivals_the_check_judges_on_the_requests_since(model):
    """On the whole window two CP4s do not pay decisively (its long requests run slower
    there); on the requests since the burst began they do."""
    huge = planner.CapacityProfile({4: 1000.0, 8: 1000.0})
    layout = planner.layout_for(Composition.parse("CP8"), 8)
    ps = settings(check_hops=8, persist_windows=2, min_requests=4)
    since = _quiet_then_burst(Controller(planner.initial_state(layout), huge, ps, model))
    assert since.whatif.change is not None and since.whatif.change.hops == 1
    assert since.whatif.change.statistic >= ps.whatif_change
    assert since.whatif.since_s == 2.5 and since.whatif.current.requests == 11
    assert since.whatif.verdict == "trigger" and since.target == "2xCP4"
    assert since.ops[0].reason.endswith("on the last 2.5 s (a change of arrivals)")
    assert since.whatif.to_dict()["since_s"] == 2.5
    # The whole window (the setting off): no decisive gain, and no persistence yet.
    off = replace(ps, whatif_change=0.0)
    whole = _quiet_then_burst(Controller(planner.initial_state(layout), huge, off, model))
    assert whole.whatif.change is None and whole.whatif.current.requests == 25
    assert whole.ops == () and whole.whatif.verdict == "wait"
    assert whole.whatif.to_dict()["since_s"] is None
    with pytest.raises(ValueError, match="whatif_change"):
        settings(whatif_change=-1.0)


def test_a_change_of_arrivals_must_stand_out_of_the_traffics_own_bursts(model):
    """Bursty but stationary arrivals (a burst every third hop) reach the change-point
    threshold at every look. Once the controller has a window's worth of looks, those
    bursts are its usual and no longer a change (no replay since one, the whole
    window judges); a tenfold step after them still is. With ``whatif_change_over``
    0 every burst is a change."""
    huge = planner.CapacityProfile({4: 1000.0, 8: 1000.0})
    layout = planner.layout_for(Composition.parse("CP8"), 8)
    bursts = [4, 4, 60]
    counts = [bursts[h % 3] for h in range(30)] + [600, 600]

    def looks(ps):  # type: ignore[no-untyped-def]
        ctl = Controller(planner.initial_state(layout), huge, ps, model)
        rid, out = 0, []
        for hop, n in enumerate(counts):
            for i in range(n):
                ctl.windows.placed(Request(rid, 2.5 * (hop + i / n), 64, (1000 + rid,)), 1.0, 0)
                rid += 1
            tick = ctl.tick({0: 0.0}, reconfiguring=False)
            if tick is not None:
                assert tick.ops == () and tick.whatif is not None
                out.append(tick.whatif.change)
        return out

    # No move: every look stands on the one CP8.
    ps = settings(
        check_hops=8, min_requests=4, whatif_margin=0.99, whatif_decisive=1.0,
        whatif_change_decisive=1.0, whatif_accumulate=False,
    )  # fmt: skip
    found = looks(ps)
    assert len(found) == 25
    assert all(c is not None for c in found[:8])  # no usual yet: every burst is a change
    assert all(c is None for c in found[8:-2])  # the bursts are the usual now
    step = found[-1]
    assert step is not None and step.hops == 2 and step.statistic > 1000
    every = looks(replace(ps, whatif_change_over=0.0))
    assert all(c is not None and c.statistic >= ps.whatif_change for c in every)
    with pytest.raises(ValueError, match="whatif_change_over"):
        settings(whatif_change_over=-1.0)
    with pytest.raises(ValueError, match="whatif_change_memory_s"):
        settings(whatif_change_memory_s=0.0)


def test_a_move_of_the_whole_window_is_vetoed_when_it_does_not_pay_since_the_change(model):
    """2xCP4 with one 100K-token request per hop, then a burst of short requests: on
    the whole window a merge to one CP8 pays (the long requests run faster there), on
    the burst since the change it does not (one worker instead of two)."""
    huge = planner.CapacityProfile({4: 1000.0, 8: 1000.0})
    layout = planner.layout_for(Composition.parse("2xCP4"), 8)

    def window(ps: planner.PlannerSettings):  # type: ignore[no-untyped-def]
        ctl = Controller(planner.initial_state(layout), huge, ps, model)
        rid = 0
        for hop in range(8):
            if hop < 7:
                batch = [(2.5 * hop, 100_000)]
            else:
                batch = [(17.5 + 0.05 * i, 6000) for i in range(10)]
            for t, n in batch:
                ctl.windows.placed(Request(rid, t, n, (1000 + rid,)), 1.0, 0)
                rid += 1
            tick = ctl.tick({0: 0.0, 1: 0.0}, reconfiguring=False)
        assert tick is not None and tick.whatif is not None
        return tick, ctl

    ps = settings(check_hops=8, min_requests=4)
    whole, _ = window(replace(ps, whatif_change=0.0))
    assert whole.whatif.verdict == "trigger" and whole.target == "1xCP8"
    since, ctl = window(ps)
    assert since.whatif.verdict == "veto" and since.ops == ()
    assert since.whatif.since_s == 2.5 and since.whatif.current.requests == 10
    assert since.whatif.proposed is not None
    assert since.whatif.proposed.composition == Composition.parse("1xCP8")
    assert since.whatif.proposed.mean_s > since.whatif.current.mean_s
    assert since.target is None and ctl.state.pending == () and ctl._goal is None


def test_since_a_change_a_smaller_gain_than_the_whole_windows_is_decisive(model):
    """The burst of short requests since the change (after long ones: the long share
    fell, the way of a split) pays for two CP4s by some gain g: it moves at once when
    ``whatif_change_decisive`` is below g, whatever ``whatif_decisive`` is, and not
    when it is above."""
    huge = planner.CapacityProfile({4: 1000.0, 8: 1000.0})
    layout = planner.layout_for(Composition.parse("CP8"), 8)
    ps = settings(check_hops=8, persist_windows=2, min_requests=4, whatif_decisive=1.0)

    def look(change_decisive: float):  # type: ignore[no-untyped-def]
        changed = replace(ps, whatif_change_decisive=change_decisive)
        return _quiet_then_burst(Controller(planner.initial_state(layout), huge, changed, model))

    moved = look(0.10)
    assert moved.whatif.verdict == "trigger" and moved.whatif.since_s == 2.5
    gain = 1.0 - moved.whatif.best.mean_s / moved.whatif.current.mean_s
    assert 0.10 < gain < 1.0
    assert look(gain - 0.01).whatif.verdict == "trigger"
    held = look(gain + 0.01)
    assert held.ops == () and held.whatif.verdict != "trigger"
    with pytest.raises(ValueError, match="whatif_change_decisive"):
        settings(whatif_change_decisive=0.0)


def test_a_smaller_gain_decides_since_a_change_only_if_the_mix_moved_the_moves_way(model):
    """With only ``whatif_change_decisive`` able to decide: a burst of short requests
    after long ones (the long share fell) splits the CP8 at once; a burst of the same
    mix as before (only the rate changed) does not, though the split pays as much."""
    huge = planner.CapacityProfile({4: 1000.0, 8: 1000.0})
    layout = planner.layout_for(Composition.parse("CP8"), 8)
    ps = settings(
        check_hops=8, persist_windows=2, min_requests=4,
        whatif_decisive=1.0, whatif_change_decisive=0.05,
    )  # fmt: skip

    def fresh() -> Controller:
        return Controller(planner.initial_state(layout), huge, ps, model)

    shifted = _quiet_then_burst(fresh())
    assert shifted.whatif.verdict == "trigger" and shifted.target == "2xCP4"
    same = _last_look(
        fresh(),
        [[(2.5 * h, 60000), (2.5 * h + 0.5, 8000)] for h in range(7)]
        + [[(17.5 + 0.1 * i, 60000 if i % 2 else 8000) for i in range(20)]],
    )
    assert same.whatif.change is not None and same.ops == ()
    gain = 1.0 - same.whatif.best.mean_s / same.whatif.current.mean_s
    assert same.whatif.best.composition == Composition.parse("2xCP4") and gain > 0.05


def test_once_moved_on_the_requests_since_a_change_the_whole_window_holds(model):
    """Long requests, then a burst: the look on the burst splits the CP8 at once. At
    the next look the whole window (mostly the long requests) leads back to one CP8:
    the pool moved on the requests since the change, so that is held. Without the
    memory of that move the same look goes on to judge the merge on the requests
    since the change (and vetoes it): the hold comes from the move."""
    huge = planner.CapacityProfile({4: 1000.0, 8: 1000.0})
    layout = planner.layout_for(Composition.parse("CP8"), 8)
    ps = settings(check_hops=8, min_requests=4, whatif_decisive=0.12)

    def looks(forget: bool):  # type: ignore[no-untyped-def]
        ctl = Controller(planner.initial_state(layout), huge, ps, model)
        hops = [[(2.5 * h, 100_000)] for h in range(7)]
        hops += [[(17.5 + 0.05 * i, 6000) for i in range(10)], [(20.2, 100_000)]]
        rid, ticks = 0, []
        for hop, batch in enumerate(hops):
            for t, n in batch:
                ctl.windows.placed(Request(rid, t, n, (1000 + rid,)), 1.0, 0)
                rid += 1
            if forget and hop == 8:
                ctl._last_move = None
            workers = {s.worker: 0.0 for s in ctl.state.layout.slots}
            tick = ctl.tick(workers, reconfiguring=False)
            for op in () if tick is None else tick.ops:
                assert isinstance(op, planner.Split)
                new = [50, 51]
                rest = {w: 0.0 for w in workers if w != op.worker}
                assert ctl.committed(op, new, [op.worker], rest | dict.fromkeys(new, 0.0)) == ()
            ticks.append(tick)
        return ticks, ctl

    ticks, ctl = looks(forget=False)
    assert ticks[7].whatif.verdict == "trigger" and ticks[7].target == "2xCP4"
    assert ticks[7].whatif.since_s == 2.5
    held = ticks[8]
    assert held.whatif.verdict == "hold" and held.ops == () and held.target is None
    assert held.whatif.since_s == 5.0 and held.whatif.to_dict()["verdict"] == "hold"
    assert ctl.state.pending == () and ctl._goal is None
    assert sorted(s.degree for s in ctl.state.layout.slots) == [4, 4]
    forgot, _ = looks(forget=True)
    assert forgot[8].whatif.verdict == "veto" and forgot[8].ops == ()


def _flapping(model, ps: planner.PlannerSettings, windows: str, restart: str = ""):  # type: ignore[no-untyped-def]
    """One CP8 domain fed, window by window, bursts of short requests ("s": two CP4s
    pay decisively) or sparse long ones ("l": one CP8 does); every move committed at
    once. At a "|" in ``windows`` the controller is replaced by a new one on its
    state (a shell restarted), given its memory with ``restart="memory"``. The
    ticks, in order."""
    huge = planner.CapacityProfile({4: 1000.0, 8: 1000.0})
    ctl = Controller(planner.initial_state(planner.layout_for(Composition.parse("CP8"), 8)),
                     huge, ps, model)  # fmt: skip
    rid, next_id, ticks = 0, 100, []
    for k, kind in enumerate(windows):
        if kind == "|":
            memory = ctl.memory() if restart == "memory" else None
            ctl = Controller(ctl.state, huge, ps, model, memory=memory)
            continue
        batch = (
            [(0.0, 100)] + [(2.0, 6000)] * 6
            if kind == "s"
            else [(t, 60000) for t in (0.0, 5.0, 10.0, 15.0)]
        )
        for t, n in batch:
            ctl.windows.placed(Request(rid, 20.0 * k + t, n, (10**6 + rid,)), 1.0, 0)
            rid += 1
        workers = {s.worker: 0.0 for s in ctl.state.layout.slots}
        tick = ctl.tick(workers, reconfiguring=False)
        assert tick is not None
        ticks.append(tick)
        for op in tick.ops:
            if isinstance(op, planner.Split):
                new, removed = [next_id, next_id + 1], [op.worker]
            else:
                new, removed = [next_id], list(op.workers)
            next_id += len(new)
            workers = {w: 0.0 for w in workers if w not in removed} | {w: 0.0 for w in new}
            assert ctl.committed(op, new, removed, workers) == ()
    return ticks, ctl


def test_merges_are_damped_once_the_pool_flaps(model):
    ps = settings(min_requests=4, damp_flaps=2, flap_s=120.0, damp_s=1200.0)
    ticks, ctl = _flapping(model, ps, "slsll")
    moves = [(t.whatif.verdict, t.target) for t in ticks]
    # Split, merge back (a flap), split again (a second flap): the next merge that
    # pays, and would be a third flap, is not made; the pool stays on 2xCP4.
    assert moves[:3] == [("trigger", "2xCP4"), ("trigger", "1xCP8"), ("trigger", "2xCP4")]
    assert moves[3] == ("damped", None) and ticks[3].ops == ()
    assert ticks[3].whatif.to_dict()["verdict"] == "damped"
    assert ticks[4].whatif.verdict == "damped"
    assert sorted(s.degree for s in ctl.state.layout.slots) == [4, 4]
    assert ctl.state.pending == () and ctl._goal is None
    # Off, the pool follows every window.
    free, _ = _flapping(model, replace(ps, damp_flaps=0), "slsll")
    assert [t.target for t in free][:4] == ["2xCP4", "1xCP8", "2xCP4", "1xCP8"]


_BUSY = [6000] * 24 + [60000] * 3
"""A hop of a load where one CP8 queues and two CP4s do not (a long share of 1/9)."""
_TROUGH = [6000] * 8 + [60000]
"""A third of that load at the same mix: a merge to one CP8 serves it faster."""
_LONG = [40000, 40000]
"""Long requests alone: another mix (the short ones stopped)."""


def _trough(model, ps: planner.PlannerSettings, last: list[int], memory: Memory | None = None):  # type: ignore[no-untyped-def]
    """2xCP4 serving :data:`_BUSY` for 15 hops (the looks estimate that a merge to one
    CP8 loses), then one hop of ``last``: the last look's tick."""
    huge = planner.CapacityProfile({4: 1000.0, 8: 1000.0})
    layout = planner.layout_for(Composition.parse("2xCP4"), 8)
    ctl = Controller(planner.initial_state(layout), huge, ps, model, memory=memory)
    rid, tick = 0, None
    for hop in range(16):
        t0 = 2.5 * hop
        lengths = _BUSY if hop < 15 else last
        gap = 2.5 / len(lengths)
        for i, n in enumerate(lengths):
            ctl.windows.placed(Request(rid, t0 + gap * i, n, (1000 + rid,)), 1.0, 0)
            rid += 1
        tick = ctl.tick({0: 0.0, 1: 0.0}, reconfiguring=False)
        assert tick is None or hop == 15 or tick.ops == ()  # nothing moves before
    assert tick is not None and tick.whatif is not None
    return tick


# A change of arrivals at G >= 8, whatever the looks before saw (this pool's hops hold
# tens of requests; a large pool's, hundreds).
_TROUGH_SETTINGS = dict(
    check_hops=8, persist_windows=2, min_requests=2, damp_flaps=2, whatif_change=8.0,
    whatif_change_over=0.0,
)  # fmt: skip


def test_while_the_pool_flaps_a_merge_since_a_change_is_held_to_the_recall(model):
    """A rate that cycles within a window makes each trough a change of arrivals
    (on a large pool, with the counts to see it), and on the requests since it a merge
    pays decisively. While the pool flaps, such a merge is made only if the recall
    (the looks on this composition at the same mix) does not find that it loses."""
    ps = settings(**_TROUGH_SETTINGS)
    calm = _trough(model, ps, _TROUGH)
    assert calm.whatif.verdict == "trigger" and calm.whatif.since_s == 2.5
    assert calm.target == "1xCP8"
    # The same look on a pool that flapped twice: the looks of the window before the
    # trough, at its mix, estimated that the merge loses.
    flapped = Memory(flaps=(0, 0), last_move=("split", 0))
    held = _trough(model, ps, _TROUGH, flapped)
    assert held.whatif.verdict == "damped" and held.ops == () and held.target is None
    assert held.whatif.since_s == 2.5
    # Without the recall (off), damping lets a merge since a change through, as before.
    free = _trough(model, replace(ps, whatif_recall_s=0.0), _TROUGH, flapped)
    assert free.whatif.verdict == "trigger" and free.target == "1xCP8"


def test_while_the_pool_flaps_a_merge_at_a_change_of_mix_is_not_held_to_the_last_one(model):
    """The recall reads the looks at the mix of the requests since the change. When
    the short requests stop, the window's long fraction, nearly all from before the
    change, is still the old mix's, whose looks estimated that the merge loses; the
    requests since the change are another mix, and the merge is made (the previous
    code damped it: the calibration mix's draws 7 and 16 held a phase change's merge
    for two minutes)."""
    ps = settings(**_TROUGH_SETTINGS)
    flapped = Memory(flaps=(0, 0), last_move=("split", 0))
    tick = _trough(model, ps, _LONG, flapped)
    assert tick.whatif.verdict == "trigger" and tick.whatif.since_s == 2.5
    assert tick.target == "1xCP8" and tick.ops


def test_a_light_stretch_that_outlasts_the_horizon_is_merged_for_all_the_damping(model):
    # Split, merge back, split again (two flaps), then long requests window after
    # window: the merge is damped until every look of the check's horizon (3
    # windows here) on 2xCP4 estimated that it pays, and then made. A window
    # where the merge does not pay ("s") starts the count again.
    ps = settings(min_requests=4, damp_flaps=2, flap_s=120.0, damp_s=1200.0, whatif_horizon=3)

    def moves(windows: str, restart: str = ""):  # type: ignore[no-untyped-def]
        ticks, _ = _flapping(model, ps, windows, restart)
        return [(t.whatif.verdict, t.target) for t in ticks]

    damped = ("damped", None)
    assert moves("slsl" + "l")[3:] == [damped, damped]
    assert moves("slsl" + "ll")[3:] == [damped, damped, ("trigger", "1xCP8")]
    assert moves("slsl" + "s" + "ll")[5:] == [damped, damped]
    assert moves("slsl" + "s" + "lll")[5:] == [damped, damped, ("trigger", "1xCP8")]
    # The looks it reads are part of the memory: a controller restarted after the
    # first of them, given it, merges at the same window (without the first look
    # it would need one window more).
    assert moves("slsl" + "|ll", restart="memory") == moves("slsl" + "ll")


def test_a_restarted_controller_given_its_memory_stays_damped(model):
    # Split, merge back, split again: two flaps, damped. A shell restarts the
    # controller here, and the new one meets a burst, then two windows where a
    # merge pays. Given the memory it decides as the controller that ran on
    # does (damped); without it, it has forgotten the flaps and merges.
    ps = settings(min_requests=4, damp_flaps=2, flap_s=120.0, damp_s=1200.0)
    on, _ = _flapping(model, ps, "slsl" + "sll")
    kept, ctl = _flapping(model, ps, "slsl|" + "sll", restart="memory")
    lost, _ = _flapping(model, ps, "slsl|" + "sll")

    def moves(ticks):  # type: ignore[no-untyped-def]
        return [(t.whatif.verdict, t.target) for t in ticks]

    assert moves(kept) == moves(on)
    assert moves(on)[-2:] == [("damped", None), ("damped", None)]
    assert moves(lost)[:5] == moves(on)[:5] and moves(lost)[5] == ("trigger", "1xCP8")
    # The memory is all of it: the restored controller's equals the one it came from.
    memory = ctl.memory()
    assert memory.flaps and memory.last_move is not None
    again = Controller(ctl.state, planner.CapacityProfile({4: 1.0, 8: 1.0}), ps, model,
                       memory=memory)  # fmt: skip
    assert again.memory() == memory
    assert memory.without_plans() == replace(
        memory, streak=("", 0), lean=("", ()), looks=("", ()), recall=(), goal=None
    )


def test_a_memory_that_cannot_be_refuses_to_restore():
    from vertumnus.core.memory import Memory

    with pytest.raises(ValueError, match="flaps must be ascending"):
        Memory(evaluations=5, flaps=(4, 2))
    with pytest.raises(ValueError, match="flaps must be ascending"):
        Memory(evaluations=5, flaps=(9,))
    with pytest.raises(ValueError, match="last_move: direction"):
        Memory(evaluations=5, last_move=("up", 3))
    with pytest.raises(ValueError, match="last_move: evaluation 7"):
        Memory(evaluations=5, last_move=("split", 7))
    with pytest.raises(ValueError, match="streak count"):
        Memory(streak=("merge", -1))
    with pytest.raises(ValueError, match="goal: direction"):
        Memory(goal=("", Composition.parse("CP8")))
    with pytest.raises(ValueError, match="evaluations must be >= 0"):
        Memory(evaluations=-1)
    with pytest.raises(ValueError, match="looks: each look is a"):
        Memory(looks=("CP8", ((0.1,),)))


def _cycling(model, windows: str, restart_at: int | None = None, **kw):  # type: ignore[no-untyped-def]
    """Verdicts and targets of a 2xCP4 domain fed, window by window, the same mix (one
    long request and six short ones) at a crest ("c": the short ones at once, where
    the split's two workers pay) or in a trough ("t": spread out, where one CP8 runs
    the long request faster), or a burst of short ones alone ("b": another mix). Up
    to the first move; at ``restart_at`` a new controller is given the memory."""
    huge = planner.CapacityProfile({4: 1000.0, 8: 1000.0})
    ps = settings(min_requests=4, **kw)
    ctl = Controller(planner.initial_state(planner.layout_for(Composition.parse("2xCP4"), 8)),
                     huge, ps, model)  # fmt: skip
    kinds = {
        "c": [(0.0, 60000)] + [(1.0 + 0.1 * i, 6000) for i in range(6)],
        "t": [(0.0, 60000)] + [(3.0 * (i + 1), 6000) for i in range(6)],
        "b": [(1.0 + 0.1 * i, 6000) for i in range(7)],
    }
    rid, moves = 0, []
    for k, kind in enumerate(windows):
        if k == restart_at:
            ctl = Controller(ctl.state, huge, ps, model, memory=ctl.memory())
        for t, n in kinds[kind]:
            ctl.windows.placed(Request(rid, 20.0 * k + t, n, (10**6 + rid,)), 1.0, 0)
            rid += 1
        tick = ctl.tick({s.worker: 0.0 for s in ctl.state.layout.slots}, reconfiguring=False)
        assert tick is not None and tick.whatif is not None
        moves.append((tick.whatif.verdict, tick.target))
        if tick.ops:
            break
    return moves


def test_a_merge_that_lost_at_the_last_crest_of_the_same_mix_is_recalled(model):
    # A trough alone pays the merge to one CP8 (+14 %, the long request runs faster
    # there); at the crest before it, with the same long fraction, the merge lost
    # 40 %. Recalled, the looks average a loss: no merge, until enough troughs (three)
    # outweigh the crest.
    merged, recalled = ("trigger", "1xCP8"), ("recall", None)
    assert _cycling(model, "t")[-1] == merged
    assert _cycling(model, "ct") == [("stay", None), recalled]
    assert _cycling(model, "cttt") == [("stay", None), recalled, recalled, merged]
    # Off, or remembering one window only, the trough merges at once.
    assert _cycling(model, "ct", whatif_recall_s=0.0)[-1] == merged
    assert _cycling(model, "ct", whatif_recall_s=20.0)[-1] == merged
    # A burst of another mix (no long request) is not a crest of this one.
    assert _cycling(model, "bt")[-1] == merged
    # The looks are part of the memory: a restarted controller recalls them.
    assert _cycling(model, "ct", restart_at=1) == [("stay", None), recalled]


def test_splits_are_never_damped_and_flaps_age_out(model):
    ps = settings(min_requests=4, damp_flaps=1, flap_s=120.0, damp_s=100.0)
    ticks, _ = _flapping(model, ps, "slsl" + "s" * 5 + "l")
    verdicts = [t.whatif.verdict for t in ticks]
    # The merge back is a flap; the split after it is made all the same, the merge
    # after that is damped.
    assert verdicts[:4] == ["trigger", "trigger", "trigger", "damped"]
    # Five windows (100 s) later the flaps are older than damp_s: a merge goes again.
    assert verdicts[-1] == "trigger" and ticks[-1].target == "1xCP8"
    with pytest.raises(ValueError, match="damp_flaps"):
        settings(damp_flaps=-1)
    with pytest.raises(ValueError, match="flap_s"):
        settings(flap_s=0.0)


def test_small_gains_that_add_up_move_the_pool(model):
    # Each "s" window gains 0.399 of the mean by splitting the CP8: below every
    # margin here, so only the added-up gains can move. They must average
    # margin·√(persist/k) over k ≥ 2·persist windows in a row.
    # (The mean's gains alone, whatif_lean_p90=0; the test below weighs the P90's in.)
    def moves(margin, persist, windows, accumulate=True, p90=0.0):  # type: ignore[no-untyped-def]
        ps = settings(min_requests=4, whatif_margin=margin, whatif_decisive=0.95,
                      damp_flaps=0, persist_windows=persist, whatif_accumulate=accumulate,
                      whatif_lean_p90=p90)  # fmt: skip
        ticks, _ = _flapping(model, ps, windows)
        return [(t.whatif.verdict, t.target) for t in ticks]

    # margin 0.5, persist 2: k = 4 windows, 0.354 needed.
    assert moves(0.5, 2, "ssssss")[3] == ("trigger", "2xCP4")
    assert [v for v, _ in moves(0.5, 2, "ssssss")[:3]] == ["stay"] * 3
    # margin 0.7, persist 1: 0.404 at k = 3 is not met, 0.35 at k = 4 is.
    assert [v for v, _ in moves(0.7, 1, "ssss")] == ["stay", "stay", "stay", "trigger"]
    # A window that loses that way ("l": long requests a CP8 serves best, -0.41)
    # counts its loss: after "sl", five more "s" windows (mean 0.283 over 7, 0.265
    # needed), where ending the lean at "l" and counting again would move after four.
    assert [v for v, _ in moves(0.7, 1, "slsssss")] == ["stay"] * 6 + ["trigger"]
    assert [v for v, _ in moves(0.7, 1, "sslssss")] == ["stay"] * 6 + ["trigger"]
    # Off: only the margin's persistence moves, and nothing pays the margin.
    assert all(v == "stay" for v, _ in moves(0.5, 1, "ssssss", accumulate=False))
    # The P90 weighed in: an "s" window's split gains 0.433 of the P90, so half and
    # half 0.416, which meets the 0.404 of k = 3 a window sooner than the mean alone.
    assert [v for v, _ in moves(0.7, 1, "sss", p90=0.5)] == ["stay", "stay", "trigger"]
    assert [v for v, _ in moves(0.7, 1, "sss", p90=1.0)] == ["stay", "stay", "trigger"]


def test_a_short_path_is_probed_at_every_step_up_to_four_probes():
    # 40 GPUs of CP4/CP8: from 8xCP4+1xCP8 the merge path has 4 steps, each
    # probed (the low phase's 2xCP4+4xCP8 is the third); from 10xCP4 it has 5,
    # probed at steps 1, 2, 4 and 5.
    ps = settings()

    def probed(comp: str) -> list[str]:
        layout = planner.layout_for(Composition.parse(comp))
        return [str(steps[-1].composition) for steps in probes.along(layout, (), "merge", ps)]

    assert probed("8xCP4+1xCP8") == ["6xCP4+2xCP8", "4xCP4+3xCP8", "2xCP4+4xCP8", "5xCP8"]
    assert probed("10xCP4") == ["8xCP4+1xCP8", "6xCP4+2xCP8", "2xCP4+4xCP8", "5xCP8"]
    assert probed("2xCP4+4xCP8") == ["5xCP8"]


def test_a_look_replays_within_its_bound_keeping_each_paths_longest_steps(model):
    # 40 GPUs at 6xCP4+2xCP8: the split path has 2 steps, the merge path 3, all
    # probed; each probe costs two replays of the window (with its transition,
    # and steady: the horizon), the current composition one. A bound that
    # affords three probes hands them out one per direction in turn, each
    # direction keeping its longest steps; one that affords none still keeps
    # one per direction.
    layout = planner.layout_for(Composition.parse("6xCP4+2xCP8"))
    requests = [(0.4 * i, 3000) for i in range(50)]

    def candidates(rows: int) -> list[tuple[str, str]]:
        ps = settings(whatif_rows=rows, persist_windows=8)
        ctl = Controller(planner.initial_state(layout), planner.CapacityProfile({4: 1.0, 8: 1.0}),
                         ps, model)  # fmt: skip
        feed(ctl, requests)
        tick = ctl.tick({s.worker: 0.0 for s in layout.slots}, reconfiguring=False)
        assert tick is not None and tick.whatif is not None
        return [(d, str(e.composition)) for d, e in tick.whatif.candidates]

    every = [
        ("split", "8xCP4+1xCP8"),
        ("split", "10xCP4"),
        ("merge", "4xCP4+3xCP8"),
        ("merge", "2xCP4+4xCP8"),
        ("merge", "5xCP8"),
    ]
    assert candidates(50 + 5 * 100) == every
    assert candidates(50 + 3 * 100) == [every[0], every[1], every[4]]
    assert candidates(50 + 3 * 100 - 1) == [every[1], every[4]]
    assert candidates(1) == [every[1], every[4]]
    with pytest.raises(ValueError, match="whatif_rows"):
        settings(whatif_rows=0)


def test_a_prefix_cached_before_the_window_hits_anywhere_at_its_first_reuse(model):
    # r0 reuses prefix Q, which no earlier row of the window carries: it was cached
    # before the window. The shipped replay charges it uncached; with
    # ``cached_before_anywhere`` (``whatif_cached_before``) it costs its cached Ê
    # on whichever worker takes it.
    # r1 reuses Q after r0 carried it: a hit at r0's worker either way. r2 reuses
    # prefix P, which r1 carries first: not cached before the window, so a miss at
    # the other (idle) worker and a hit at r1's, both ways.
    q = tuple(range(1, 21))  # 20 blocks of 512
    p = (*q, 50, 51)
    rows = [
        (0.0, 10752, 10240, (*q, 99)),
        (100.0, 11264, 10240, p),
        (200.0, 11776, 11264, (*p, 52)),
    ]
    cold_table = table(model, rows, (4,))
    warm = whatif.cached_before_anywhere(cold_table)
    assert warm.hit.tolist() == cold_table.hit.tolist()
    assert warm.miss[0, 0] == cold_table.hit[0, 0] < cold_table.miss[0, 0]
    assert warm.miss[0, 1:].tolist() == cold_table.miss[0, 1:].tolist()
    # The original kept.
    assert cold_table is not warm and cold_table.miss[0, 0] > cold_table.hit[0, 0]
    pool = Composition.parse("2xCP4")
    cold = whatif.estimate(cold_table, pool, FIXED_BETA)
    hot = whatif.estimate(warm, pool, FIXED_BETA)
    saved = cold_table.miss[0, 0] - cold_table.hit[0, 0]
    assert cold.mean_s - hot.mean_s == pytest.approx(saved / 3)


def test_with_whatif_cached_before_the_check_counts_prefixes_cached_before_the_window(model):
    # Four long requests, each the next turn of a conversation whose earlier turn
    # came before the window: 59,392 of its 60,000 tokens cached at its worker.
    # Cold, the window's replay charges them uncached; with whatif_cached_before,
    # cached, as the worker served them.
    layout = planner.layout_for(Composition.parse("CP8"), 8)

    def current(**kw):  # type: ignore[no-untyped-def]
        huge = planner.CapacityProfile({4: 1000.0, 8: 1000.0})
        ps = settings(min_requests=4, **kw)
        ctl = Controller(planner.initial_state(layout), huge, ps, model)
        for i, t in enumerate((0.0, 5.0, 10.0, 15.0)):
            turn = Request(i, t, 60000, tuple(range(i * 1000, i * 1000 + 118)))
            ctl.windows.placed(turn, 1.0, 59392)
        tick = ctl.tick({0: 0.0}, reconfiguring=False)
        assert tick is not None and tick.whatif is not None
        return tick.whatif.current.mean_s

    assert current() == pytest.approx(model.predict(8, 60000, 0))
    assert current(whatif_cached_before=True) == pytest.approx(model.predict(8, 608, 59392))


def test_the_compiled_replay_starts_from_the_same_holders_as_the_python_one(model):
    if whatif.HOT_PATH != "c":
        pytest.skip("built without a C compiler")
    import random

    rng = random.Random(5)
    t = random_table(model, 3)
    params = PlacementParams()
    # 13xCP2+6xCP4+2xCP8, one CP4 starting late.
    ws = [[0.0] * 13, [0.0] * 5 + [0.4], [0.0] * 2]
    lam = [params.lam * (d / 2 - 1.0) for d in (2, 4, 8)]
    extra = params.beta_busy - params.beta
    held = np.array([rng.randrange(-1, 21) for _ in range(t.n_prefixes)], dtype=np.int64)
    py = whatif.replay_py(t, [0, 1, 2], ws, lam, params.beta, extra, held=held)
    c = np.empty(t.n)
    whatif.replay(
        t.arrivals, t.hit, t.miss, [0, 1, 2], t.reused, t.carry_ptr, t.carry_ids,
        t.n_prefixes, ws, lam, params.beta, extra, c, held,
    )  # fmt: skip
    assert c.tolist() == py  # bit for bit
    cold = whatif.replay_py(t, [0, 1, 2], ws, lam, params.beta, extra)
    assert py != cold  # the holders changed what the replay did
    with pytest.raises(ValueError, match="held is shorter"):
        whatif.replay(
            t.arrivals, t.hit, t.miss, [0, 1, 2], t.reused, t.carry_ptr, t.carry_ids,
            t.n_prefixes, ws, lam, params.beta, extra, c, held[:-1],
        )  # fmt: skip


def test_held_before_names_where_the_pool_served_a_prefix_cached_before_the_table(model):
    # r0 reuses Q (no earlier row carries it) on worker 3: Q was at worker 3 before.
    # r1 carries P first; r2 reuses P after it: P was not cached before the window.
    # r3 reuses R, cached before, but its worker was not reported.
    q, p, r = tuple(range(1, 21)), (200, 201), (300, 301, 302)
    w = ControlWindows(planner.PlannerSettings(window_s=30.0, hop_s=10.0), BS)
    w.placed(Request(0, 0.0, 10752, (*q, 99)), 1.0, 10240, worker=3)
    w.placed(Request(1, 1.0, 1024, p), 1.0, 0, worker=1)
    w.placed(Request(2, 2.0, 1536, (*p, 202)), 1.0, 1024, worker=1)
    w.placed(Request(3, 3.0, 2048, (*r, 303)), 1.0, 1536)
    t = whatif.RequestTable.of_columns(w.columns(), model, (4,))
    held = t.held_before()
    ids = {name: int(t.reused[row]) for name, row in (("Q", 0), ("P", 2), ("R", 3))}
    assert held[ids["Q"]] == 3
    assert held[ids["P"]] == -1
    assert held[ids["R"]] == -1
    # Cut after r1: P's first reuse (r2) now precedes any carrier in the cut.
    assert t.since(2).held_before()[ids["P"]] == 1
    # A table built from rows knows no workers: nothing held.
    rows = [(0.0, 10752, 10240, (*q, 99))]
    assert (table(model, rows, (4,)).held_before() == -1).all()


def test_a_replay_starts_with_the_prefixes_where_they_were_held(model):
    # Two requests reuse Q at once; Q is held by the second CP4 worker. Cold, both
    # miss; held, the first hits there and the second waits for it.
    q = tuple(range(1, 21))
    rows = [(0.0, 10752, 10240, (*q, 98)), (0.0, 10752, 10240, (*q, 99))]
    t = table(model, rows, (4,))
    qid = int(t.reused[0])
    pool = Composition.parse("2xCP4")
    cold = whatif.estimate(t, pool, FIXED_BETA)
    held = np.full(t.n_prefixes, -1, dtype=np.int64)
    held[qid] = 1
    warm = whatif.estimate(t, pool, FIXED_BETA, held=held)
    hit, miss = model.predict(4, 512, 10240), model.predict(4, 10752, 0)
    assert cold.mean_s == pytest.approx(miss)
    # The first goes to its holder; the second waits for it there, cheaper than missing.
    assert 2 * hit < miss
    assert warm.mean_s == pytest.approx((hit + 2 * hit) / 2)


def heirs(layout, steps) -> dict[int, tuple[int, ...]]:
    """probes.Heirs as worker id -> the replay workers holding its prefixes."""
    table = probes.Heirs(layout).after(steps)
    ids = sorted(s.worker for s in layout.slots)
    return {
        w: tuple(dict.fromkeys(x for x in table[i].tolist() if x >= 0)) for i, w in enumerate(ids)
    }


def test_heirs_follow_a_workers_cache_through_splits_and_merges():
    layout = planner.layout_for(Composition.parse("2xCP8"), 16)
    a, b = (s.worker for s in layout.slots)
    ps = planner.PlannerSettings(degrees=(2, 4, 8))
    obs = [planner.WorkerObservation(s.worker, 0.0, 0.0) for s in layout.slots]
    one = planner.free_path(layout, (), "split", ps, obs, limit=1)
    first = one[0].op.worker
    other = b if first == a else a
    # 2xCP4 (the halves, replay workers 0 and 1) + 1xCP8 (the other, worker 2).
    assert heirs(layout, one) == {first: (0, 1), other: (2,)}
    # Nothing moved: each worker holds its own, numbered by degree in layout order.
    assert heirs(layout, ()) == {a: (0,), b: (1,)}
    # Split further: the split worker's prefixes spread over what it became.
    path = planner.free_path(layout, (), "split", ps, obs, limit=6)
    end = heirs(layout, path)
    assert path[-1].composition == Composition.parse("8xCP2")
    assert sorted(end[a] + end[b]) == list(range(8))
    # A merge's worker holds both buddies'.
    pair = planner.layout_for(Composition.parse("2xCP4"), 8)
    merged = planner.free_path(pair, (), "merge", ps, [], limit=1)
    assert heirs(pair, merged) == {s.worker: (0,) for s in pair.slots}
    # Mixed degrees: the layout's workers are numbered degree by degree, the new last.
    mixed = planner.layout_for(Composition.parse("1xCP8+2xCP4"), 16)
    by_degree = sorted(mixed.slots, key=lambda s: s.degree)
    split = planner.free_path(mixed, (), "split", ps, [], limit=1)
    halves = split[0].op.worker
    assert split[0].made == (2, 2)
    got = heirs(mixed, split)
    # 2xCP2 (0, 1) + the CP4 left (2) + the CP8 (3).
    assert got[halves] == (0, 1)
    left = [s.worker for s in by_degree if s.degree == 4 and s.worker != halves]
    assert got[left[0]] == (2,)
    assert got[by_degree[-1].worker] == (3,)


def test_holders_on_deals_a_split_workers_prefixes_between_its_halves():
    held_before = np.array([5, 5, 5, 5, 7, -1, 9], dtype=np.int64)
    rows = whatif.holder_rows(held_before, np.array([5, 7, 8]))
    assert rows.tolist() == [0, 0, 0, 0, 1, -1, -1]  # worker 9 is not in the layout
    table = np.array([[0, 1], [2, 2], [3, 3]])
    assert whatif.holders_on(rows, table).tolist() == [0, 1, 0, 1, 2, -1, -1]


def test_with_whatif_held_the_check_starts_where_the_pool_held_each_prefix(model):
    # Four next turns whose earlier turns came before the window, at worker 0 of a
    # CP8+CP8 pool: cold the window charges them uncached; with whatif_held, cached
    # where they were (the turns reported without a worker stay cold).
    layout = planner.layout_for(Composition.parse("2xCP8"), 16)
    w0 = layout.slots[0].worker

    def current(report: bool, **kw):  # type: ignore[no-untyped-def]
        huge = planner.CapacityProfile({4: 1000.0, 8: 1000.0})
        ps = settings(min_requests=4, **kw)
        ctl = Controller(planner.initial_state(layout), huge, ps, model)
        for i, t in enumerate((0.0, 5.0, 10.0, 15.0)):
            turn = Request(i, t, 60000, tuple(range(i * 1000, i * 1000 + 118)))
            ctl.placed(turn, w0 if report else -1, 1.0, 59392)
        tick = ctl.tick({s.worker: 0.0 for s in layout.slots}, reconfiguring=False)
        assert tick is not None and tick.whatif is not None
        return tick.whatif.current.mean_s

    cold, warm = model.predict(8, 60000, 0), model.predict(8, 608, 59392)
    assert current(True) == pytest.approx(cold)
    assert current(True, whatif_held=True) == pytest.approx(warm)
    assert current(False, whatif_held=True) == pytest.approx(cold)
