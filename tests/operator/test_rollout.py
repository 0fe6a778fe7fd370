"""The rolling update's decisions (:mod:`vertumnus.operator.rollout`) and its status.

The whole update runs in the e2e against a real API server (the stand-in router, and a
real router and engine in ``e2e/test_operator_real_pool.py``); these pin each decision.
"""

from __future__ import annotations

import json

import pytest

from vertumnus.core import transition as tr
from vertumnus.core.lattice import layout_for
from vertumnus.core.types import Composition
from vertumnus.operator import rollout
from vertumnus.operator.gang import GangStatus
from vertumnus.operator.record import Record, decode_record, encode_record
from vertumnus.operator.serialize import StateError
from vertumnus.operator.status import Observation, Problem, build_status

WORKERS = {0: [0, 1], 1: [2], 2: [3]}
ALL = {0, 1, 2}


def _next(r, outdated=(0, 1, 2), ready=ALL, at_once=1, busy=False, routed=True, partition=0):  # type: ignore[no-untyped-def]
    return rollout.next_actions(
        r, list(outdated), WORKERS, set(ready), 3, at_once, busy, routed, partition
    )


def test_nothing_outdated_is_nothing_to_do():
    assert _next(rollout.Rollout(), outdated=()) == []


def test_a_domain_starts_only_on_a_quiet_pool_with_a_router_and_the_others_ready():
    r = rollout.Rollout()
    for kwargs in ({"routed": False}, {"busy": True}, {"ready": {0, 1}}):
        (act,) = _next(r, **kwargs)
        assert isinstance(act, rollout.Wait), kwargs
    assert _next(r, outdated=(2, 0)) == [rollout.Drain(0, (0, 1))]  # the lowest first


def test_one_domain_is_drained_deleted_and_resumed_before_the_next():
    r = rollout.Rollout()
    (act,) = _next(r)
    r.begin(act.domain, act.workers)
    # Not drained yet: drained again (the pod stays), and no second domain starts.
    assert _next(r, busy=True) == [rollout.Drain(0, (0, 1))]
    assert _next(r) == [rollout.Drain(0, (0, 1))]
    r.domains[0].deleted = True
    # The new pod is starting (it runs the current spec: no longer outdated).
    (wait,) = _next(r, outdated=(1, 2), ready={1, 2})
    assert isinstance(wait, rollout.Wait)
    assert _next(r, outdated=(1, 2)) == [rollout.Resume(0, (0, 1))]
    r.finish(0)
    assert (r.domains, r.workers, r.replaced) == ({}, (), 1)
    assert _next(r, outdated=(1, 2)) == [rollout.Drain(1, (2,))]


def test_max_unavailable_domains_are_replaced_at_once():
    r = rollout.Rollout()
    assert _next(r, at_once=2) == [rollout.Drain(0, (0, 1)), rollout.Drain(1, (2,))]
    r.begin(0, (0, 1))
    r.begin(1, (2,))
    r.domains[0].deleted = r.domains[1].deleted = True
    # Domain 0's new pod is ready first: it resumes while domain 1's starts.
    assert _next(r, outdated=(2,), ready={0, 2}, at_once=2) == [rollout.Resume(0, (0, 1))]
    r.finish(0)
    # A place is free: the next domain starts while domain 1 is still starting, the
    # pods outside the update being ready.
    assert _next(r, outdated=(2,), ready={0, 2}, at_once=2) == [rollout.Drain(2, (3,))]
    # A pod lost outside the update holds the next start.
    (wait,) = _next(r, outdated=(2,), ready={2}, at_once=2)
    assert isinstance(wait, rollout.Wait) and "ready" in wait.why


def test_a_new_pod_outdated_again_is_deleted_without_another_drain():
    r = rollout.Rollout()
    r.begin(0, (0, 1))
    r.domains[0].deleted = True
    # The spec changed again while the new pod was starting (e.g. a bad image reverted).
    assert _next(r, outdated=(0, 1, 2), ready={1, 2}) == [rollout.Delete(0)]


def test_orphans_are_the_draining_workers_no_transition_holds():
    assert rollout.orphans({3, 1, 5}, {5}) == [1, 3]
    assert rollout.orphans(set(), {2}) == []


def test_the_status_says_updating_and_which_workers():
    record = Record(tr.initial_pool(layout_for(Composition.parse("2xCP4+1xCP8"), 8)))
    obs = Observation(
        domains=2,
        pods=1,
        bound=1,
        ready_domains={1},
        gang=GangStatus(True, "Scheduled", ""),
        generation=2,
    )
    obs.updating = (0, 1)
    obs.problems = [Problem("Progressing", "RollingUpdate", "2 domain pod(s) run an older spec")]
    st = build_status(record, obs, [], 0.0)
    assert st["phase"] == "Updating"
    progressing = next(c for c in st["conditions"] if c["type"] == "Progressing")
    assert (progressing["status"], progressing["reason"]) == ("True", "RollingUpdate")
    degraded = next(c for c in st["conditions"] if c["type"] == "Degraded")
    assert degraded["status"] == "False"
    states = {w["id"]: w["state"] for w in st["workers"]}
    assert [states[w] for w in (0, 1)] == ["Updating", "Updating"]
    assert set(states.values()) == {"Updating", "Serving"}


def test_a_domain_still_draining_when_the_spec_reverts_is_resumed_not_replaced():
    r = rollout.Rollout()
    r.begin(0, (0, 1))
    assert _next(r, outdated=(1, 2)) == [rollout.Resume(0, (0, 1))]


def test_an_update_restored_from_the_record_carries_on_where_it_was():
    """An operator restarted mid-update reads ``status.state.rolling``: a domain whose new
    pod is starting waits (it is not lost), one whose pod was never deleted is drained
    again, and the record round-trips through the status as JSON."""
    r = rollout.Rollout()
    r.begin(0, (0, 1), now=5.0)
    r.domains[0].deleted = True
    r.begin(1, (2,), now=7.0)
    layout = layout_for(Composition.parse("2xCP4+2xCP8"), 8)
    record = Record(tr.initial_pool(layout), rolling=r.recorded())
    raw = json.loads(json.dumps(encode_record(record)))
    assert raw["rolling"] == [
        {"domain": 0, "workers": [0, 1], "deleted": True},
        {"domain": 1, "workers": [2], "deleted": False},
    ]
    back = decode_record(raw)
    assert back.rolling == record.rolling

    again = rollout.Rollout()
    again.restore(back.rolling, now=100.0)
    assert again.recorded() == r.recorded() and again.domains[1].began == 100.0
    # Domain 0's new pod is not ready yet, domain 1's pod is still outdated.
    acts = _next(again, outdated=(1, 2), ready={1, 2}, at_once=2)
    assert acts == [rollout.Drain(1, (2,))]
    assert _next(again, outdated=(1, 2), ready=ALL, at_once=2) == [
        rollout.Resume(0, (0, 1)),
        rollout.Drain(1, (2,)),
    ]
    # A reload in the same operator keeps when each domain began.
    again.restore(back.rolling, now=200.0)
    assert again.domains[1].began == 100.0


def test_a_record_without_an_update_or_with_a_bad_one():
    layout = layout_for(Composition.parse("2xCP8"), 8)
    raw = encode_record(Record(tr.initial_pool(layout)))
    assert raw["rolling"] == []
    del raw["rolling"]  # written before updates were recorded
    assert decode_record(raw).rolling == ()
    raw["rolling"] = [{"domain": 0, "workers": "all"}]
    with pytest.raises(StateError, match=r"status.state.rolling\[0\]: expected"):
        decode_record(raw)


def test_a_partition_keeps_the_domains_below_it_on_the_older_spec():
    """A canary: partition 2 of 3 domains replaces domain 2 alone; lowered to 0, the rest
    roll; raised while a domain below it is still draining, that domain is resumed."""
    r = rollout.Rollout()
    assert _next(r, partition=2) == [rollout.Drain(2, (3,))]
    assert _next(r, partition=3) == []  # nothing at or above it: nothing to do
    assert _next(r, partition=0) == [rollout.Drain(0, (0, 1))]
    r.begin(0, (0, 1))
    assert _next(r, partition=1) == [rollout.Resume(0, (0, 1))]  # then domain 1 starts
