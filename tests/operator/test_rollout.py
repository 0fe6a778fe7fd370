"""The rolling update's decisions (:mod:`vertumnus.operator.rollout`) and its status.

The whole update runs in the e2e against a real API server (the stand-in router, and a
real router and engine in ``e2e/test_operator_real_pool.py``); these pin each decision.
"""

from __future__ import annotations

from vertumnus.core import transition as tr
from vertumnus.core.lattice import layout_for
from vertumnus.core.types import Composition
from vertumnus.operator import rollout
from vertumnus.operator.gang import GangStatus
from vertumnus.operator.record import Record
from vertumnus.operator.status import Observation, Problem, build_status

WORKERS = {0: [0, 1], 1: [2], 2: [3]}
ALL = {0, 1, 2}


def _next(r, outdated=(0, 1, 2), ready=ALL, at_once=1, busy=False, routed=True):  # type: ignore[no-untyped-def]
    return rollout.next_actions(r, list(outdated), WORKERS, set(ready), 3, at_once, busy, routed)


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
