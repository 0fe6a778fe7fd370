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

WORKERS = {0: [0, 1], 1: [2]}


def _next(r, outdated=(0, 1), all_ready=True, busy=False, routed=True):  # type: ignore[no-untyped-def]
    return rollout.next_action(r, list(outdated), WORKERS, all_ready, busy, routed)


def test_nothing_outdated_is_nothing_to_do():
    assert _next(rollout.Rollout(), outdated=()) is None


def test_a_domain_starts_only_on_a_whole_quiet_pool_with_a_router():
    r = rollout.Rollout()
    assert isinstance(_next(r, routed=False), rollout.Wait)
    assert isinstance(_next(r, busy=True), rollout.Wait)
    assert isinstance(_next(r, all_ready=False), rollout.Wait)
    assert _next(r, outdated=(1, 0)) == rollout.Drain(0, (0, 1))  # the lowest domain first


def test_one_domain_is_drained_deleted_and_resumed_before_the_next():
    r = rollout.Rollout()
    act = _next(r)
    assert act == rollout.Drain(0, (0, 1))
    r.begin(act.domain, act.workers)
    # Not drained yet: drained again (and the pod stays) whatever else happens.
    assert _next(r, all_ready=False, busy=True) == rollout.Drain(0, (0, 1))
    r.deleted = True
    # The new pod is starting (it is no longer outdated: it runs the current spec).
    assert _next(r, outdated=(1,), all_ready=False) == rollout.Wait(
        "the new pod of domain 0 is starting"
    )
    assert _next(r, outdated=(1,)) == rollout.Resume(0, (0, 1))
    r.finish()
    assert (r.domain, r.workers, r.replaced) == (None, (), 1)
    assert _next(r, outdated=(1,)) == rollout.Drain(1, (2,))


def test_a_new_pod_outdated_again_is_deleted_without_another_drain():
    r = rollout.Rollout()
    r.begin(0, (0, 1))
    r.deleted = True
    # The spec changed again while the new pod was starting (e.g. a bad image reverted).
    assert _next(r, outdated=(0, 1), all_ready=False) == rollout.Delete(0)


def test_orphans_are_the_draining_workers_no_transition_holds():
    assert rollout.orphans({3, 1, 5}, {5}) == [1, 3]
    assert rollout.orphans(set(), {2}) == []


def test_the_status_says_updating_and_which_workers():
    record = Record(tr.initial_pool(layout_for(Composition.parse("2xCP4+1xCP8"), 8)))
    obs = Observation(
        domains=2, pods=1, bound=1, ready=1, gang=GangStatus(True, "Scheduled", ""), generation=2
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
