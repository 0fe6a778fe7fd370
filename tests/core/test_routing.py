"""The routing core's step protocol: reservation, q_w, in-flight prefixes, failures, drains, pending copies."""

from __future__ import annotations

import pytest

from vertumnus.core.costmodel import PrefillModel
from vertumnus.core.decision import RouteDecision
from vertumnus.core.policies.base import Policy, PoolView, decision_at
from vertumnus.core.policies.vertumnus import CostModelPolicy
from vertumnus.core.routing import RoutingCore, placement_order
from vertumnus.core.types import Request

# E_C(R, P) = R ms / C: easy to compute by hand
LINEAR = PrefillModel(
    name="linear", alpha=0.0, c=1e-3, b=0.0, d={1: 0.0, 2: 0.0, 4: 0.0}, a={1: 0.0, 2: 0.0, 4: 0.0}
)
BS = 10


class To(Policy):
    """Places every request at a fixed worker (or by a table), through decision_at."""

    name = "to"

    def __init__(self, worker: int = 0, table: dict[int, int] | None = None) -> None:
        self.worker, self.table = worker, table or {}
        self.placed: list[RouteDecision] = []
        self.done: list[tuple[int, int]] = []

    def decide(self, request: Request, pool: PoolView) -> RouteDecision | None:
        return decision_at(request, self.table.get(request.id, self.worker), pool)

    def observe_placed(self, request, decision, pool) -> None:
        self.placed.append(decision)

    def observe_completed(self, request, worker) -> None:
        self.done.append((request.id, worker))


def req(rid: int, keys=(), length: int = 1000) -> Request:
    return Request(rid, 0.0, length, tuple(keys))


def core_with(policy: Policy, *degrees: int) -> RoutingCore:
    core = RoutingCore(policy, LINEAR, BS)
    for i, d in enumerate(degrees):
        core.add_worker(i, d, cache_capacity_blocks=100)
    return core


def test_schedule_reserves_the_estimate_and_concurrent_arrivals_see_it():
    core = core_with(CostModelPolicy(), 2, 2)
    first = core.schedule(req(0), now=0.0)
    second = core.schedule(req(1), now=0.0)
    assert (first.worker, second.worker) == (0, 1)
    assert first.estimate_s == pytest.approx(0.5)  # 1000 tokens / 2 ranks at 1 ms
    w0 = core.worker(0)
    assert (w0.outstanding_s, w0.queued, w0.running) == (pytest.approx(0.5), 1, 0)
    assert first.queue_s == 0.0 and first.cost == pytest.approx(0.5)


def test_the_longest_idle_of_equally_good_workers_takes_the_next_request():
    """Three idle CP2 workers with nothing cached: each new request goes to the one
    whose last prefill ended longest ago (the end the core was told at start),
    never-used ones first, as the what-if replay orders them."""
    core = core_with(CostModelPolicy(), 2, 2, 2)
    order = []
    for rid, now in enumerate([0.0, 0.0, 0.0, 10.0, 10.0, 10.0]):
        d = core.schedule(req(rid), now=now)
        core.started(rid, now=now, until=now + d.estimate_s + 0.1 * (2 - d.worker))
        core.finished(rid)
        order.append(d.worker)
    # 0, then 1 and 2 (never used); then by the ends 0.7, 0.6, 0.5: 2, 1, 0.
    assert order == [0, 1, 2, 2, 1, 0]
    assert [core.worker(w).free_at for w in range(3)] == pytest.approx([10.7, 10.6, 10.5])


class FirstThen(CostModelPolicy):
    """Places the requests of ``table`` where it says, every other one by the cost model."""

    def __init__(self, table: dict[int, int]) -> None:
        super().__init__()
        self.table = table

    def decide(self, request: Request, pool: PoolView) -> RouteDecision | None:
        if request.id in self.table:
            return decision_at(request, self.table[request.id], pool)
        return super().decide(request, pool)


def test_a_worker_whose_queue_emptied_is_idle_exactly():
    """Ê added and subtracted in queue order leave a rounding residue (here +1.1e-16 s
    after 1.1, 0.7, 0.3 and 0.43 s): an emptied queue must hold exactly no work, or
    the idle worker counts as busy to the tie-break and loses the next request to
    one idle for less time (it did, until 2026-12-04)."""
    core = core_with(FirstThen({0: 0, 1: 0, 2: 0, 3: 0, 4: 1}), 1, 1)
    for rid, length in enumerate([1100, 700, 300, 430]):
        core.schedule(req(rid, length=length), now=0.0)
    t = 0.0
    for rid, length in enumerate([1100, 700, 300, 430]):
        core.started(rid, now=t, until=t + length * 1e-3)
        t += length * 1e-3
        core.finished(rid)
    core.schedule(req(4, length=500), now=3.0)  # worker 1: idle since 3.5 s
    core.started(4, now=3.0, until=3.5)
    core.finished(4)
    core.refresh(now=10.0)
    assert (core.worker(0).outstanding_s, core.worker(0).queued) == (0.0, 0)
    # Both idle, equal cost: worker 0 has been idle longest (since 2.53 s).
    assert core.schedule(req(5), now=10.0).worker == 0


def test_outstanding_work_follows_started_and_finished():
    core = core_with(To(0), 1)
    a = core.schedule(req(0), now=0.0)
    core.schedule(req(1), now=0.0)
    assert core.worker(0).outstanding_s == pytest.approx(2.0)
    core.started(0, now=1.0, until=1.0 + a.estimate_s)
    core.refresh(now=1.25)
    # q_w = queued Ê (request 1) + what is left of the running one.
    assert core.worker(0).outstanding_s == pytest.approx(1.0 + 0.75)
    assert (core.worker(0).queued, core.worker(0).running) == (1, 1)
    core.refresh(now=5.0)  # overran its estimate: nothing negative is left
    assert core.worker(0).outstanding_s == pytest.approx(1.0)
    assert core.finished(0) is a
    assert core.worker(0).running == 0
    with pytest.raises(ValueError, match="already placed"):
        core.schedule(req(1), now=5.0)


def test_the_policy_sees_the_decision_it_made_and_every_departure():
    pol = To(0)
    core = core_with(pol, 1, 1)
    d = core.schedule(req(0, keys=(5, 6)), now=0.0)
    assert pol.placed == [d]
    core.started(0, 0.0, 1.0)
    core.finished(0)
    core.schedule(req(1), now=2.0)
    back = core.failed(1)
    assert back.id == 1 and pol.done == [(0, 0), (1, 0)]
    assert core.worker(0).queued == 0 and core.worker(0).outstanding_s == pytest.approx(1.0)
    core.refresh(3.0)
    assert core.worker(0).outstanding_s == 0.0


def test_in_flight_prefixes_count_until_the_request_leaves():
    core = core_with(To(1), 1, 1)
    core.schedule(req(0, keys=(1, 2, 3)), now=0.0)
    assert dict(core.inflight_blocks(req(9, keys=(1, 2, 7)))) == {1: 2}
    core.started(0, 0.0, 1.0)
    core.failed(0)
    assert dict(core.inflight_blocks(req(9, keys=(1, 2, 7)))) == {}


def test_withdraw_takes_every_queued_request_and_resets_the_reservation():
    core = core_with(To(0), 2, 2)
    for i in range(3):
        core.schedule(req(i, length=1000 + i), now=0.0)
    core.started(0, 0.0, 0.5)
    with pytest.raises(ValueError, match="every queued request"):
        core.withdraw(0, [1])
    out = core.withdraw(0, [1, 2])
    assert [r.id for r in out] == [1, 2]
    w = core.worker(0)
    assert (w.queued, w.running) == (0, 1)
    core.refresh(0.25)
    assert w.outstanding_s == pytest.approx(0.25)  # only the running one is left


def test_queues_withdrawn_together_are_placed_again_oldest_first_on_the_whole_pool():
    # Two workers with queues and one new, empty worker (a commit): taken back
    # together and placed oldest first, the queues spread over all three.
    core = core_with(To(0, table={2: 1, 3: 1}), 2, 2)
    early = [Request(i, t, 1000, ()) for i, t in ((0, 0.0), (1, 0.3), (2, 0.1), (3, 0.2))]
    for r in early:
        core.schedule(r, now=r.arrival_s)
    core.started(0, 0.3, 0.55)
    core.started(2, 0.3, 0.8)
    core.add_worker(2, 2, cache_capacity_blocks=100)
    with pytest.raises(ValueError, match=r"withdraw\(1\) must name every queued request"):
        core.withdraw_queues({0: [1], 1: []})
    assert core.worker(1).queued == 1  # a refused withdrawal takes nothing back
    back = core.withdraw_queues({0: [1], 1: [3]})
    assert [r.id for r in back] == [1, 3]  # queue order, worker by worker
    assert [(w.queued, w.running) for w in core.workers] == [(0, 1), (0, 1), (0, 0)]
    assert [r.id for r in placement_order(back)] == [3, 1]  # by arrival
    core.policy = CostModelPolicy()
    placed = {r.id: core.schedule(r, now=0.3).worker for r in placement_order(back)}
    # The oldest goes to the idle new worker; the next where the least is left
    # (0.25 s at worker 0, against 0.5 s at worker 1 and behind request 3).
    assert placed == {3: 2, 1: 0}


def test_a_forwarded_request_stays_queued_but_cannot_be_withdrawn():
    core = core_with(To(0), 1)
    for i in range(3):
        core.schedule(req(i), now=0.0)
    core.started(0, 0.0, 1.0)
    core.forwarded(1)  # handed to the worker, waiting there behind request 0
    w = core.worker(0)
    assert (w.queued, w.running) == (2, 1)
    with pytest.raises(ValueError, match="every queued request"):
        core.withdraw(0, [1, 2])
    assert [r.id for r in core.withdraw(0, [2])] == [2]
    core.refresh(0.5)
    # What is left: half of the running one and all of the forwarded one.
    assert (w.queued, w.outstanding_s) == (1, pytest.approx(0.5 + 1.0))
    with pytest.raises(ValueError, match="already started"):
        core.forwarded(0)
    core.finished(0)
    core.started(1, 1.0, 2.0)  # the worker gets to it
    assert (w.queued, w.running) == (0, 1)
    core.finished(1)
    core.refresh(2.0)
    assert (w.queued, w.running, w.outstanding_s) == (0, 0, 0.0)


def test_shared_outstanding_work_is_never_below_zero():
    """Estimates added and subtracted leave rounding residue (this sequence left
    -5.6e-17 after the last one, until an emptied queue was set to exactly 0); what a
    replica shares with the others must be >= 0, and 0 once the queue is empty."""
    core = core_with(To(0), 1)
    for i, length in enumerate([1100, 700, 700, 300]):
        core.schedule(req(i, length=length), now=0.0)
    for i in range(4):
        core.failed(i)
        assert core.own_outstanding(0.0)[0] >= 0.0
    assert core.own_outstanding(0.0) == {0: 0.0}


def test_a_policy_choosing_an_unavailable_worker_is_a_bug():
    core = core_with(To(1), 1, 1)
    core.set_available([1], False)
    with pytest.raises(RuntimeError, match="chose worker 1, which is not available"):
        core.schedule(req(0), now=0.0)


def test_cache_events_update_the_index_and_pending_blocks():
    core = core_with(To(0), 2, 2)
    core.apply_cache_events(0, [(1, 0, None), (2, 1, 1), (3, 2, 2)], used_blocks=3)
    assert dict(core.matched_blocks(req(0, keys=(1, 2, 3, 4)))) == {0: 3}
    assert core.worker(0).cache_used_blocks == 3
    core.set_pending(0, {2: 1, 3: 1})
    core.apply_cache_events(0, removed=[3])
    assert dict(core.pending(0)) == {2: 1}


def test_reusing_pending_blocks_asks_for_their_copy_once():
    core = core_with(To(0), 2, 2)
    core.apply_cache_events(0, [(1, 0, None), (2, 1, 1), (3, 2, 2)])
    core.set_pending(0, {2: 1, 3: 0})  # 2: from worker 1's ranks; 3: from its own
    d = core.schedule(req(0, keys=(1, 2, 9)), now=0.0)
    assert [(c.source, c.blocks) for c in d.copies] == [(1, (2,))]
    assert d.copies[0].keys == (1, 2) and d.copies[0].worker == 0
    again = core.schedule(req(1, keys=(1, 2, 3)), now=0.0)
    assert [(c.source, c.blocks) for c in again.copies] == [(0, (3,))]  # 2 is no longer pending
    assert dict(core.pending(0)) == {}


def test_removing_a_copy_source_invalidates_what_only_it_could_reconcile():
    core = core_with(To(0), 2, 2, 2)
    core.set_pending(0, {7: 1, 8: 0, 9: 2})
    removal = core.remove_workers([1])
    assert [(i.worker, i.keys) for i in removal.invalidations] == [(0, (7,))]
    assert dict(core.pending(0)) == {8: 0, 9: 2}
    with pytest.raises(KeyError, match="not in the pool"):
        core.worker(1)
    core.schedule(req(0), now=0.0)
    with pytest.raises(RuntimeError, match="still has work"):
        core.remove_workers([0])
