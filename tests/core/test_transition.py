"""The epoch-transition state machine: phases, actions, ids, idempotence, resumption."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vertumnus.core import transition as tr
from vertumnus.core.lattice import Slot, check_grouping, layout_for
from vertumnus.core.planner import Merge, Split
from vertumnus.core.types import Composition


def pool(text: str = "2xCP4") -> tr.PoolState:
    return tr.initial_pool(layout_for(Composition.parse(text), 8))


def test_a_split_drains_switches_and_commits():
    p = pool("1xCP8")
    p, t, actions = tr.begin(p, Split(0, reason="load"))
    assert actions == [tr.Drain(t.id, (0,))]
    assert t.added == (Slot(1, 4, 0, 0), Slot(2, 4, 0, 4))
    assert p.next_worker == 3 and p.epoch == 1
    p, actions = tr.drained(p, t.id, 0)
    (switch,) = actions
    assert switch == tr.Switch(t.id, 2, 0, (Slot(1, 4, 0, 0), Slot(2, 4, 0, 4)), (0,), t.added)
    assert p.epoch == 2 and p.transition(t.id).phase is tr.Phase.SWITCHING
    p, actions = tr.switched(p, t.id)
    (commit,) = actions
    assert isinstance(commit, tr.Commit) and commit.new_ids == [1, 2] and commit.epoch == 2
    assert commit.op.reason == "load" and commit.kind == "split"
    assert p.transitions == () and str(p.layout.composition) == "2xCP4"


def test_a_merge_waits_for_both_buddies():
    p, t, _ = tr.begin(pool("2xCP4"), Merge((0, 1)))
    assert t.added == (Slot(2, 8, 0, 0),)
    p, actions = tr.drained(p, t.id, 1)
    assert actions == [] and p.transition(t.id).drained == {1}
    p, actions = tr.drained(p, t.id, 1)  # a repeated report changes nothing
    assert actions == []
    p, (switch,) = tr.drained(p, t.id, 0)
    assert switch.grouping == (Slot(2, 8, 0, 0),)


def test_a_replacement_gives_the_failed_workers_place_a_new_id():
    p = pool("2xCP2+1xCP4")  # workers 0, 1 (CP2 at 4, 6) and 2 (CP4 at 0)
    p, t, actions = tr.begin(p, tr.Replace(1, "worker failed: exit 7"))
    assert actions == [tr.Drain(t.id, (1,))] and t.kind == "replace"
    assert t.removed == (Slot(1, 2, 0, 6),) and t.added == (Slot(3, 2, 0, 6),)
    with pytest.raises(tr.TransitionError, match="already being reconfigured"):
        tr.begin(p, Merge((0, 1)))
    p, (switch,) = tr.drained(p, t.id, 1)
    assert switch.removed == (1,) and switch.added == (Slot(3, 2, 0, 6),)
    assert switch.grouping == (Slot(2, 4, 0, 0), Slot(0, 2, 0, 4), Slot(3, 2, 0, 6))
    p, (commit,) = tr.switched(p, t.id)
    assert commit.kind == "replace" and commit.new_ids == [3] and commit.epoch == 2
    assert str(p.layout.composition) == "2xCP2+1xCP4" and p.next_worker == 4
    with pytest.raises(tr.TransitionError, match="replace: worker 1 is not in the pool"):
        tr.begin(p, tr.Replace(1))


def test_bad_operations_are_refused_with_the_reason():
    p = pool("2xCP2+1xCP4")  # workers 0, 1 (CP2 at 4, 6) and 2 (CP4 at 0)
    with pytest.raises(tr.TransitionError, match="worker 9 is not in the pool"):
        tr.begin(p, Split(9))
    with pytest.raises(tr.TransitionError, match="not buddies"):
        tr.begin(p, Merge((0, 2)))
    p, t, _ = tr.begin(p, Merge((0, 1)))
    with pytest.raises(tr.TransitionError, match="already being reconfigured"):
        tr.begin(p, Split(1))
    with pytest.raises(tr.TransitionError, match="not part of transition"):
        tr.drained(p, t.id, 2)
    with pytest.raises(tr.TransitionError, match="is Draining, not Switching"):
        tr.switched(p, t.id)
    with pytest.raises(tr.TransitionError, match="no transition 99"):
        tr.drained(p, 99, 0)


def test_resume_reissues_the_actions_of_the_recorded_phase():
    p = pool("2xCP4")
    p, a, _ = tr.begin(p, Split(0))
    p, b, _ = tr.begin(p, Split(1))
    p, _ = tr.drained(p, b.id, 1)  # b is switching, a still draining
    actions = tr.resume(p)
    assert actions[0] == tr.Drain(a.id, (0,))
    assert isinstance(actions[1], tr.Switch) and actions[1].transition == b.id
    # The state is plain data: what the operator writes to status and reads back.
    again = tr.PoolState(p.layout, p.epoch, p.next_worker, p.next_transition, p.transitions)
    assert tr.resume(again) == actions


def test_concurrent_switches_in_one_domain_see_each_other():
    p = pool("4xCP2")
    p, a, _ = tr.begin(p, Merge((0, 1)))
    p, b, _ = tr.begin(p, Merge((2, 3)))
    p, _ = tr.drained(p, a.id, 0)
    p, (sa,) = tr.drained(p, a.id, 1)
    p, _ = tr.drained(p, b.id, 2)
    p, (sb,) = tr.drained(p, b.id, 3)
    assert (sa.epoch, sb.epoch) == (2, 3)
    assert sb.grouping == (Slot(4, 4, 0, 0), Slot(5, 4, 0, 4))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 2)), max_size=30))
def test_any_interleaving_keeps_a_valid_grouping_and_unique_ids(steps):
    """Random starts (splits, merges, replacements), drain reports and switch reports: every grouping handed out
    tiles the domains, and no worker id is ever reused."""
    p = tr.initial_pool(layout_for(Composition.parse("2xCP4+1xCP8"), 8))
    ids = {s.worker for s in p.layout.slots}
    for choice, kind in steps:
        if kind == 0:  # start an operation on idle workers
            busy = p.busy()
            slots = [s for s in p.layout.slots if s.worker not in busy]
            ops: list[tr.Op] = [Split(s.worker) for s in slots if s.degree > 1]
            ops += [tr.Replace(s.worker) for s in slots]
            by = {(s.domain, s.offset): s for s in slots}
            ops += [
                Merge((s.worker, o.worker))
                for s in slots
                if s.offset % (2 * s.degree) == 0
                and 2 * s.degree <= 8
                and (o := by.get((s.domain, s.offset + s.degree))) is not None
                and o.degree == s.degree
            ]
            if ops:
                p, t, _ = tr.begin(p, ops[choice % len(ops)])
                assert not ids & {s.worker for s in t.added}
                ids |= {s.worker for s in t.added}
        elif p.transitions:
            t = p.transitions[choice % len(p.transitions)]
            if t.phase is tr.Phase.DRAINING:
                p, actions = tr.drained(p, t.id, t.members[choice % len(t.members)])
            else:
                p, actions = tr.switched(p, t.id)
            for a in actions:
                if isinstance(a, tr.Switch):
                    check_grouping(a.grouping, 8)
        check_grouping(p.layout.slots, 8)
        assert p.layout.composition.gpus == 16
