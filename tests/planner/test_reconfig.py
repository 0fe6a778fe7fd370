"""Reconfiguration in the simulator: drain, switch, epochs, lazy KV reconciliation.

Tiny pools with 4-token blocks and a routing table instead of the cost
model, so every request's worker is known and every number can be checked.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vertumnus.core import planner
from vertumnus.core.costmodel import PrefillModel
from vertumnus.core.decision import RouteDecision
from vertumnus.core.policies.base import Policy, PoolView, decision_at
from vertumnus.core.transition import TransitionError
from vertumnus.core.types import Composition, Request
from vertumnus.sim.engine import PoolConfig, Simulation
from vertumnus.sim.reconfig import Executor, ExecutorSettings

BS = 4  # tokens per block


class Routed(Policy):
    """Sends request ids to fixed workers when available, else to the least loaded one."""

    name = "routed"

    def __init__(self, route: Mapping[int, int] | None = None) -> None:
        self.route = dict(route or {})

    def decide(self, request: Request, pool: PoolView) -> RouteDecision | None:
        avail = [w for w in pool.workers if w.available]
        if not avail:
            return None
        want = self.route.get(request.id)
        for w in avail:
            if w.id == want:
                return decision_at(request, w.id, pool)
        return decision_at(request, min(avail, key=lambda w: (w.outstanding_s, w.id)).id, pool)


def req(rid: int, t: float, keys: Sequence[int], extra: int = 0) -> Request:
    return Request(rid, t, len(keys) * BS + extra, tuple(keys))


def pool(comp: str, model: PrefillModel, blocks_per_gpu: int = 8) -> PoolConfig:
    return PoolConfig(
        Composition.parse(comp), model, block_size=BS, cache_blocks_per_gpu=blocks_per_gpu
    )


def test_merge_pending_prefix_is_copied_before_it_is_reused(model: PrefillModel) -> None:
    sim = Simulation(pool("2xCP4", model), Routed({0: 0, 1: 1, 2: 0, 3: 1}))
    ex = Executor(sim)
    sim.at(10.0, lambda: ex.execute(planner.Merge((0, 1))))
    reqs = [
        req(0, 0.0, [1, 2, 3]),  # only on worker 0
        req(1, 0.0, [9, 8]),  # only on worker 1
        req(2, 1.0, [7]),  # on both
        req(3, 1.0, [7]),
        req(4, 20.0, [1, 2, 3, 4]),  # reuses the pending prefix 1-2-3
        req(5, 30.0, [7, 5]),  # reuses block 7, held by both sources: not pending
    ]
    result = sim.run(reqs)
    assert result.reconfigurations == 1
    assert [c for _, c in result.composition_timeline] == ["2xCP4", "1xCP8"]
    merged = sim.worker(2)
    assert merged.degree == 8 and merged.epoch == 2  # epoch 1 is the initial grouping
    by_id = {c.request_id: c for c in result.completions}
    # Request 4: three pending blocks copied first, then a prefill with P = 12.
    transfer = (
        sim.pool.reconcile_latency_s
        + 3 * BS * sim.pool.kv_bytes_per_token * 0.5 / sim.pool.reconcile_bandwidth_Bps
    )
    assert sim.reconciliations[0].request_id == 4
    assert sim.reconciliations[0].copied_blocks == 3
    assert sim.reconciliations[0].transfer_s == pytest.approx(transfer)
    c4 = by_id[4]
    assert c4.cached_tokens == 12
    assert c4.ttft_s - sim.pool.t_ext_s == pytest.approx(transfer + model.predict(8, 4, 12))
    # Request 5 reuses block 7 with no copy (both sources had it).
    assert by_id[5].cached_tokens == 4
    assert [r.request_id for r in sim.reconciliations] == [4]
    # What is still pending: worker 1's blocks 9, 8 (never reused), from the
    # merged worker's own ranks.
    assert dict(sim.core.pending(2)) == {9: 2, 8: 2}


def test_split_deals_prefixes_to_children_and_drops_them_when_the_source_is_gone(
    model: PrefillModel,
) -> None:
    sim = Simulation(pool("CP8", model), Routed({3: 2, 4: 4}))
    ex = Executor(sim)
    sim.at(10.0, lambda: ex.execute(planner.Split(0)))
    sim.at(20.0, lambda: ex.execute(planner.Split(1)))  # child 1 -> 3, 4 (CP2)
    reqs = [
        req(0, 0.0, [1, 2, 3]),
        req(1, 1.0, [5, 6]),  # most recent prefix: dealt first, to child 1
        req(2, 15.0, [5, 6, 7]),  # reuses child 1's pending 5-6 (sibling 2 still there)
        req(3, 30.0, [1, 2, 3, 4]),  # child 2's pending 1-2-3: its source (child 1) is gone
    ]
    result = sim.run(reqs)
    assert result.reconfigurations == 2
    assert [c for _, c in result.composition_timeline] == ["1xCP8", "2xCP4", "2xCP2+1xCP4"]
    by_id = {c.request_id: c for c in result.completions}
    (r2,) = sim.reconciliations
    assert (r2.request_id, r2.worker, r2.copied_blocks, r2.dropped_blocks) == (2, 1, 2, 0)
    assert by_id[2].cached_tokens == 8
    # Once child 1 is split again no valid copy of 1-2-3 remains for child 2:
    # dropped there at that commit, and request 3 is served as a miss.
    second = ex.transitions[1]
    assert sim.invalidations == [(second.committed_s, 2, 3)]
    assert by_id[3].cached_tokens == 0
    assert by_id[3].ttft_s - sim.pool.t_ext_s == pytest.approx(model.predict(4, 16, 0))


def test_drain_replaces_queued_requests_and_waits_for_the_running_one(model: PrefillModel) -> None:
    sim = Simulation(pool("2xCP4", model), Routed({i: 0 for i in range(4)}))
    ex = Executor(sim, ExecutorSettings(switch_delay_s=0.5))
    sim.at(0.001, lambda: ex.execute(planner.Split(0)))
    reqs = [req(i, 0.0, [100 + i] * 1, extra=4000) for i in range(4)]
    result = sim.run(reqs)
    t = ex.transitions[0]
    running = model.predict(4, 4004, 0)
    assert t.drained_s == pytest.approx(running)  # request 0 finished where it ran
    assert t.committed_s == pytest.approx(running + 0.5)
    by_id = {c.request_id: c for c in result.completions}
    assert by_id[0].worker == 0
    assert {by_id[i].worker for i in (1, 2, 3)} == {1}  # re-placed on the other worker
    assert sorted(by_id) == [0, 1, 2, 3]


def test_the_commit_spreads_the_queue_built_meanwhile_over_the_new_workers(
    model: PrefillModel,
) -> None:
    # Worker 0 splits at once; for the 0.5 s switch worker 1 is the only one
    # available, so every arrival queues there (12 requests of 0.22 s each). At
    # the commit the queue is placed again, oldest first, and the two new CP2
    # workers take their share of it; without that it waits behind worker 1.
    runs, moves = {}, {}
    for rebalance in (True, False):
        sim = Simulation(pool("2xCP4", model), Routed())
        ex = Executor(sim, ExecutorSettings(switch_delay_s=0.5, rebalance=rebalance))
        sim.at(0.0, lambda ex=ex: ex.execute(planner.Split(0)))
        result = sim.run([req(i, 0.01 * (i + 1), [200 + i], extra=12000) for i in range(12)])
        assert ex.transitions[0].committed_s == pytest.approx(0.5)
        by_id = {c.request_id: c for c in result.completions}
        assert sorted(by_id) == list(range(12))  # none lost, none served twice
        runs[rebalance] = by_id
        moves[rebalance] = ex.transitions[0].moved
    # Every request arrived before the commit, at worker 1.
    assert {c.worker for c in runs[False].values()} == {1}
    moved = {i for i, c in runs[True].items() if c.worker in (2, 3)}
    assert len(moved) >= 4
    assert moves == {True: len(moved), False: 0}  # the transition's record counts them
    mean = {k: sum(c.ttft_s for c in v.values()) / 12 for k, v in runs.items()}
    assert mean[True] < 0.7 * mean[False]


def test_arrivals_are_held_while_no_worker_is_available(model: PrefillModel) -> None:
    sim = Simulation(pool("CP8", model), Routed())
    ex = Executor(sim, ExecutorSettings(switch_delay_s=0.5))
    sim.at(0.0, lambda: ex.execute(planner.Split(0)))
    reqs = [req(i, 0.05 + 0.1 * i, [i + 1]) for i in range(5)]
    result = sim.run(reqs)
    assert result.rejected == []
    assert sorted(c.request_id for c in result.completions) == [0, 1, 2, 3, 4]
    commit = ex.transitions[0].committed_s
    assert commit == pytest.approx(0.5)
    assert all(c.degree == 4 for c in result.completions)
    # Nothing started before the new workers were committed.
    for c in result.completions:
        assert c.arrival_s + c.ttft_s - sim.pool.t_ext_s >= commit


def test_new_workers_are_not_schedulable_before_commit(model: PrefillModel) -> None:
    sim = Simulation(pool("2xCP4", model), Routed())
    ex = Executor(sim, ExecutorSettings(switch_delay_s=2.0))
    seen: list[tuple[float, list[int]]] = []
    sim.at(1.0, lambda: ex.execute(planner.Merge((0, 1))))
    sim.at(2.0, lambda: seen.append((sim.now, [w.id for w in sim.core.workers if w.available])))
    sim.run([req(0, 0.0, [1]), req(1, 2.5, [2])])
    assert seen == [(2.0, [])]
    assert sim.epoch == 2 and [w.id for w in sim.core.workers] == [2]


# -- property: no request is lost or served twice ---------------------------


ops_strategy = st.lists(st.tuples(st.floats(0.0, 20.0), st.integers(0, 1000)), max_size=12)
reqs_strategy = st.lists(
    st.tuples(
        st.floats(0.0, 20.0),
        st.lists(st.integers(1, 6), min_size=1, max_size=6),
        st.integers(0, 3000),
    ),
    min_size=1,
    max_size=40,
)


def _requests(raw) -> list[Request]:
    """Requests from drawn (arrival, symbols, extra tokens); keys chained by
    hand, so a request's k-th key names its whole prefix."""
    requests = []
    for t, symbols, extra in sorted(raw, key=lambda x: x[0]):
        keys, prev = [], 0
        for s in symbols:
            prev = prev * 7 + s
            keys.append(prev)
        requests.append(Request(len(requests), t, len(keys) * BS + extra, tuple(keys)))
    return requests


def _assert_consistent(sim: Simulation, ex: Executor, result, n_requests: int) -> None:
    """Every request served exactly once, no transition left open, and the
    trie's metadata equal to the workers' caches."""
    ids = [c.request_id for c in result.completions]
    assert len(ids) == len(set(ids)), "a request was served twice"
    assert sorted(ids) == list(range(n_requests)), "a request was lost"
    assert result.rejected == []
    assert not ex.busy
    assert result.reconfigurations == len(ex.transitions) == sim.epoch - 1
    # Every reused block was installed: copies happen before the prefill, and
    # the cached tokens never exceed what the worker held at start.
    for c in result.completions:
        assert 0 <= c.cached_tokens < c.length
    store = sim.core.store
    for w in sim.sim_workers():
        assert set(store.worker_keys(w.id)) == set(w.cache.keys_lru_first())
        assert set(sim.core.pending(w.id)) <= set(w.cache.keys_lru_first())
        # A pending block's source is in the pool (itself, or a sibling).
        assert all(sim.has_worker(src) for src in sim.core.pending(w.id).values())
    assert store.workers() <= {w.id for w in sim.sim_workers()}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    raw=reqs_strategy,
    ops=ops_strategy,
    delay=st.sampled_from([0.0, 0.5]),
    rebalance=st.booleans(),
)
def test_no_request_lost_or_served_twice_across_random_reconfigurations(
    model: PrefillModel, raw, ops, delay, rebalance
) -> None:
    """Random requests (shared prefixes from a tiny alphabet) and random splits/merges."""
    requests = _requests(raw)
    sim = Simulation(pool("2xCP4+CP8", model, blocks_per_gpu=3), Routed())
    ex = Executor(sim, ExecutorSettings(switch_delay_s=delay, rebalance=rebalance))
    lattice = planner.PlannerSettings(degrees=(1, 2, 4, 8))
    box = {"state": planner.initial_state(planner.layout_for(sim.pool.composition))}

    def act(choice: int) -> None:
        if ex.busy:
            return
        state = box["state"]
        cands: list[planner.Split | planner.Merge] = [
            *planner.eligible_splits(state.layout, lattice),
            *planner.eligible_merges(state.layout, lattice),
        ]
        op = cands[choice % len(cands)]
        box["state"] = planner.ControllerState(
            layout=state.layout, epoch=state.epoch, pending=(op,)
        )

        def committed(commit) -> None:
            box["state"] = planner.commit(box["state"], commit.new_ids)

        ex.execute(op, committed)

    for t, choice in ops:
        sim.at(t, lambda c=choice: act(c))
    result = sim.run(requests)

    _assert_consistent(sim, ex, result, len(requests))
    assert sim.composition.gpus == 16
    assert box["state"].layout.composition == sim.composition


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    raw=reqs_strategy,
    ops=st.lists(
        st.tuples(st.floats(0.0, 20.0), st.integers(0, 1000), st.integers(1, 4)), max_size=8
    ),
    delay=st.sampled_from([0.0, 0.5]),
)
def test_no_request_lost_or_served_twice_across_concurrent_reconfigurations(
    model: PrefillModel, raw, ops, delay
) -> None:
    """As above, but each event starts up to ``k`` disjoint operations at once, next to any
    still in flight; each drains only its own workers and commits under its own epoch."""
    requests = _requests(raw)
    sim = Simulation(pool("4xCP2+2xCP4+CP8", model, blocks_per_gpu=3), Routed())
    ex = Executor(sim, ExecutorSettings(switch_delay_s=delay))
    lattice = planner.PlannerSettings(degrees=(1, 2, 4, 8))
    box = {"state": planner.initial_state(planner.layout_for(sim.pool.composition))}
    most = [0]

    def act(choice: int, k: int) -> None:
        state = box["state"]
        busy = {
            w
            for op in state.pending
            for w in ((op.worker,) if isinstance(op, planner.Split) else op.workers)
        }
        started: list[planner.Split | planner.Merge] = []
        for _ in range(k):
            cands = [
                op
                for op in (
                    *planner.eligible_splits(state.layout, lattice),
                    *planner.eligible_merges(state.layout, lattice),
                )
                if not busy.intersection(
                    (op.worker,) if isinstance(op, planner.Split) else op.workers
                )
            ]
            if not cands:
                break
            op = cands[(choice + len(started)) % len(cands)]
            busy.update((op.worker,) if isinstance(op, planner.Split) else op.workers)
            started.append(op)
        box["state"] = replace(state, pending=state.pending + tuple(started))
        for op in started:

            def committed(commit, op=op) -> None:
                box["state"] = planner.commit(box["state"], commit.new_ids, op)

            ex.execute(op, committed)
        most[0] = max(most[0], ex.in_flight)

    for t, choice, k in ops:
        sim.at(t, lambda c=choice, k=k: act(c, k))
    result = sim.run(requests)

    _assert_consistent(sim, ex, result, len(requests))
    assert box["state"].pending == ()
    assert sim.composition.gpus == 24
    assert box["state"].layout.composition == sim.composition
    assert ex.max_in_flight == most[0]


def test_concurrent_operations_drain_only_their_own_workers(model: PrefillModel) -> None:
    # Two merges at t = 1 on disjoint pairs; worker 2 runs a 2.4 s prefill, so
    # merge (2, 3) waits for it while merge (0, 1) commits after the switch alone.
    sim = Simulation(pool("4xCP2", model), Routed({0: 2}))
    ex = Executor(sim, ExecutorSettings(switch_delay_s=0.5))
    sim.at(1.0, lambda: [ex.execute(planner.Merge((0, 1))), ex.execute(planner.Merge((2, 3)))])
    with pytest.raises(TransitionError, match="already being reconfigured"):
        sim.at(1.1, lambda: ex.execute(planner.Split(2)))
        sim.run([req(0, 0.9, [1, 2], 60000)])
    sim2 = Simulation(pool("4xCP2", model), Routed({0: 2}))
    ex2 = Executor(sim2, ExecutorSettings(switch_delay_s=0.5))
    sim2.at(1.0, lambda: [ex2.execute(planner.Merge((0, 1))), ex2.execute(planner.Merge((2, 3)))])
    sim2.run([req(0, 0.9, [1, 2], 60000)])
    first, second = ex2.transitions
    assert ex2.max_in_flight == 2
    assert first.removed == (0, 1) and first.committed_s == pytest.approx(1.5)
    assert second.removed == (2, 3) and second.drained_s > 3.0  # the 60K-token prefill
    assert sim2.epoch == 3 and str(sim2.composition) == "2xCP4"
