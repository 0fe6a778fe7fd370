"""The state recorded in the CPPool status reads back to the same values (JSON round trip)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vertumnus.core import planner
from vertumnus.core import transition as tr
from vertumnus.core.control import Controller
from vertumnus.core.lattice import enumerate_lattice, layout_for
from vertumnus.operator import serialize
from vertumnus.operator.record import Record, decode_record, encode_record
from vertumnus.profiles import load_capacity

LATTICE = enumerate_lattice(32, (2, 4, 8), 8)


@st.composite
def pool_states(draw):
    """A pool after a random walk of begin / drained / switched steps."""
    pool = tr.initial_pool(layout_for(draw(st.sampled_from(LATTICE)), 8))
    for _ in range(draw(st.integers(0, 12))):
        choice = draw(st.integers(0, 2))
        busy = pool.busy()
        if choice == 0:
            ops: list[tr.Op] = [
                tr.Replace(s.worker, "worker failed: exit 1")
                for s in pool.layout.slots
                if s.worker not in busy
            ]
            ops += [
                planner.Split(s.worker, "s")
                for s in pool.layout.slots
                if s.degree > 2 and s.worker not in busy
            ]
            ops += [
                planner.Merge((a.worker, b.worker), "m")
                for a, b in planner.buddy_pairs(pool.layout, {2, 4, 8})
                if a.worker not in busy and b.worker not in busy
            ]
            if ops:
                pool, _, _ = tr.begin(pool, draw(st.sampled_from(ops)))
        elif pool.transitions:
            t = draw(st.sampled_from(pool.transitions))
            if t.phase is tr.Phase.DRAINING:
                pool, _ = tr.drained(pool, t.id, draw(st.sampled_from(t.members)))
            elif choice == 2:
                pool, _ = tr.switched(pool, t.id)
    return pool


@settings(max_examples=150, deadline=None)
@given(pool_states())
def test_a_pool_state_round_trips_through_json(pool):
    raw = json.loads(json.dumps(serialize.encode_pool(pool)))
    back = serialize.decode_pool(raw)
    assert back == pool
    assert tr.resume(back) == tr.resume(pool)


def test_a_controller_state_mid_transition_round_trips():
    cap = load_capacity("qwen3-30b-a3b/h200")
    ps = planner.PlannerSettings(window_s=30.0, hop_s=10.0, degrees=(4, 8))
    layout = layout_for(planner.Composition.parse("5xCP8"), 8)
    c = Controller(planner.initial_state(layout), cap, ps)
    for _ in range(8):
        c.windows.add(40.0, 50, 3, 6.0)
        c.tick({s.worker: 0.1 for s in c.state.layout.slots}, False)
    state = c.state
    assert state.pending and state.plan and state.target is not None  # a rich state
    raw = json.loads(json.dumps(serialize.encode_controller(state)))
    assert serialize.decode_controller(raw) == state
    pool, t, _ = tr.begin(tr.initial_pool(layout), planner.Split(0, "test"))
    record = Record(pool, state, hop=8, seq=3, started=((t.id, 12.5),), drained_at=((t.id, 13.0),))
    again = decode_record(json.loads(json.dumps(encode_record(record))))
    assert again == record


def test_a_record_keeps_the_times_of_transitions_in_flight_only():
    """The status is written as a JSON merge patch, which keeps the keys it does not name:
    times kept in a map by transition id grew by one entry per transition, forever. They
    are lists now, and the map an older operator wrote is read without its stale ids."""
    layout = layout_for(planner.Composition.parse("2xCP8"), 8)
    pool, t, _ = tr.begin(tr.initial_pool(layout), planner.Split(0, "test"))
    raw = encode_record(Record(pool, started=((t.id, 5.0),)))
    assert raw["started"] == [[t.id, 5.0]] and raw["drainedAt"] == []
    raw["started"] = {"90": 1.0, "91": 2.0, str(t.id): 5.0}  # as written before 2026-12-05
    raw["drainedAt"] = {"91": 2.5}
    back = decode_record(json.loads(json.dumps(raw)))
    assert back.started == ((t.id, 5.0),) and back.drained_at == ()
    assert encode_record(back)["started"] == [[t.id, 5.0]]


def test_the_planner_never_has_a_replacement_pending():
    cap = load_capacity("qwen3-30b-a3b/h200")
    ps = planner.PlannerSettings(window_s=30.0, hop_s=10.0, degrees=(4, 8))
    layout = layout_for(planner.Composition.parse("1xCP8"), 8)
    raw = serialize.encode_controller(Controller(planner.initial_state(layout), cap, ps).state)
    raw["pending"] = [{"replace": 0, "reason": "x"}]
    with pytest.raises(serialize.StateError, match=r"pending\[0\]: the planner never asks"):
        serialize.decode_controller(raw)


def test_a_bad_record_names_the_field():
    raw = serialize.encode_pool(tr.initial_pool(layout_for(planner.Composition.parse("1xCP8"), 8)))
    raw["layout"]["slots"][0] = [0, 8, 0]
    with pytest.raises(serialize.StateError, match=r"layout.slots\[0\]: expected"):
        serialize.decode_pool(raw)
    raw = serialize.encode_pool(tr.initial_pool(layout_for(planner.Composition.parse("1xCP8"), 8)))
    del raw["nextWorker"]
    with pytest.raises(serialize.StateError, match="status.state.pool.nextWorker: missing"):
        serialize.decode_pool(raw)


def test_the_controllers_memory_round_trips_and_a_bad_one_names_the_field():
    from vertumnus.core.kappa import LearnedBins
    from vertumnus.core.memory import Look, Memory

    memory = Memory(
        evaluations=40,
        flaps=(12, 31),
        last_move=("split", 31),
        streak=("merge", 1),
        lean=("merge", (0.012, 0.02, -0.0)),
        looks=("2xCP4+1xCP8", ((0.01, -0.04), (-0.2, 0.031))),
        # A look that estimated one merge candidate and one that estimated two.
        recall=(
            Look(0.12, (("2xCP8", 0.07),)),
            Look(0.3, (("1xCP4+1xCP8", 0.01), ("2xCP8", -0.2))),
        ),
        goal=("merge", planner.Composition.parse("2xCP4+1xCP8")),
        kappa=LearnedBins({4: ((3, 0.7, 0.65, 0.61, 0.3), (17, 1.9, 1.1, 0.7, 1.6))}, 41),
    )
    raw = json.loads(json.dumps(serialize.encode_memory(memory)))
    assert serialize.decode_memory(raw) == memory
    assert serialize.decode_memory(serialize.encode_memory(Memory())) == Memory()
    layout = layout_for(planner.Composition.parse("2xCP4+1xCP8"), 8)
    record = Record(tr.initial_pool(layout), planner.initial_state(layout), memory, hop=40)
    assert decode_record(json.loads(json.dumps(encode_record(record)))) == record
    # A record written before the memory was kept reads back without one, and one
    # written before the recall was kept, without the recall.
    old = encode_record(record)
    del old["memory"]
    assert decode_record(old).memory is None
    older = dict(raw)
    del older["recall"]
    assert serialize.decode_memory(older) == replace(memory, recall=())
    for field, value, message in (
        ("flaps", [31, 12], r"status.state.memory: memory flaps must be ascending"),
        ("flaps", ["12"], r"status.state.memory.flaps: expected evaluations"),
        ("lastMove", ["sideways", 3], r"status.state.memory: memory last_move: direction"),
        ("streak", ["merge"], r"status.state.memory.streak: expected \[direction, value\]"),
        ("lean", ["merge", ["x"]], r"status.state.memory.lean: expected gains"),
        ("looks", ["CP8", [[0.1]]], r"status.state.memory.looks: expected \[split gain"),
        ("looks", ["CP8"], r"status.state.memory.looks: expected \[composition, "),
        ("recall", [], r"status.state.memory.recall: expected \{compositions"),
        ("recall", {"compositions": ["CP9x"], "looks": []}, r"recall.compositions: 'CP9x' is"),
        ("recall", {"compositions": ["CP8"], "looks": [[0.1, []]]}, r"recall.looks\[0\]: expected"),
        ("recall", {"compositions": ["CP8"], "looks": [[0.1, ["x"]]]}, r"looks\[0\]: a gain"),
        ("recall", {"compositions": ["CP8"], "looks": [[1.5, [0.1]]]}, r"memory recall: a long fr"),
        ("goal", ["merge", "CP8 and more"], r"status.state.memory: bad composition term"),
        ("kappa", {"bins": {"4": [[3, 0.7]]}}, r"status.state.memory.kappa.bins.4: expected"),
        ("kappa", {"bins": {"4": [[99, 1, 1, 1, 1]]}}, r"memory.kappa: .*bin 99 is not in"),
        ("kappa", {"bins": {}, "samples": "9"}, r"status.state.memory.kappa.samples"),
    ):
        bad = dict(raw, **{field: value})
        with pytest.raises(serialize.StateError, match=message):
            serialize.decode_memory(bad)
