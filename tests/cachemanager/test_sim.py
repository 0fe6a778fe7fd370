"""The cache manager inside the real Simulation: operations, timing and safety."""

from __future__ import annotations

from vertumnus.core.cachemanager import CacheManager, CacheManagerSettings, Reclaim
from vertumnus.core.policies.vertumnus import CostModelPolicy
from vertumnus.core.types import Composition, Request
from vertumnus.sim.cachesim import (
    CacheManagerShell,
    attach_cache_manager,
    build_vertumnus,
    build_vertumnus_nocm,
)
from vertumnus.sim.engine import PoolConfig, Simulation
from vertumnus.sim.traces import load_trace

# Low thresholds so a short run replicates and reclaims plenty.
EAGER = CacheManagerSettings(
    scan_interval_s=0.5, decay=0.8, theta_inter=0.002, theta_intra=0.5, theta_reclaim=0.2
)


def index_matches_caches(sim: Simulation) -> None:
    store = sim.core.store
    for w in sim.sim_workers():
        held = set(store.worker_keys(w.id))
        assert held == set(w.cache.keys_lru_first()), f"worker {w.id}: index and cache disagree"


class CheckedShell(CacheManagerShell):
    """The simulator's shell, checking every deletion where the blocks actually go."""

    def __init__(self, sim: Simulation, manager: CacheManager) -> None:
        super().__init__(sim, manager)
        self.deleted: list[Reclaim] = []

    def delete(self, op: Reclaim) -> None:
        if not self.sim.has_worker(op.worker):
            super().delete(op)
            return
        worker = self.sim.worker(op.worker)
        before = set(worker.cache.keys_lru_first())
        jobs = list(worker.queue) + ([worker.running] if worker.running is not None else [])
        in_use = any(
            op.key in job.request.block_keys[: worker.cache.match(job.request.block_keys)]
            for job in jobs
        )
        super().delete(op)
        gone = before - set(worker.cache.keys_lru_first())
        if gone:
            assert gone == {op.key}, "reclaim stranded a retained descendant"
            assert not in_use, "reclaimed a prefix in use"
            self.deleted.append(op)


def test_every_request_once_replicas_visible_only_after_install(model) -> None:
    trace = load_trace("synthetic:duration_s=40,mean_rate=25", seed=3)
    pool = PoolConfig(Composition.parse("2xCP4+1xCP8"), model, cache_blocks_per_gpu=150)
    mgr = CacheManager(EAGER)
    sim = Simulation(pool, CostModelPolicy(), cache_manager=mgr)
    shell = CheckedShell(sim, mgr)
    shell.keep_plans = True
    placements = [0]

    def check(request, decision, first) -> None:  # type: ignore[no-untyped-def]
        # Every 25 placements: the index holds exactly what the caches hold, so a
        # copy in flight (in no cache yet) is invisible to placement.
        placements[0] += 1
        if placements[0] % 25 == 0:
            index_matches_caches(sim)
            for op in mgr.copies_in_flight:
                dst = sim.worker(op.destination)
                assert dst.cache.match(op.keys) < len(op.keys) or all(
                    dst.id in sim.core.store.holders(k) for k in op.keys
                )

    sim.placement_listeners.append(check)
    result = sim.run(trace.requests)
    ids = sorted(c.request_id for c in result.completions)
    assert ids == [r.id for r in trace.requests] and not result.rejected
    c = mgr.counts
    assert c["copies_installed"] > 0 and c["inter_started"] + c["intra_started"] > 0
    assert c["reclaims_done"] > 0 and len(shell.deleted) == c["reclaims_done"]
    # Each copy became visible exactly its transfer time after the scan that planned it.
    scan_time = {id(op): t for t, plan in shell.plans for op in plan.copies}
    for t, op in shell.installed:
        assert abs(t - (scan_time[id(op)] + op.transfer_s)) < 1e-9
    index_matches_caches(sim)
    assert not mgr.copies_in_flight and not mgr.reclaims_in_flight
    assert mgr.pinned == 0  # every request unpinned at completion


def test_shell_refuses_a_reclaim_that_became_in_use(model) -> None:
    pool = PoolConfig(Composition.parse("2xCP4"), model, block_size=4)
    sim = build_vertumnus(pool)
    shell, mgr = sim.attachments["cache_manager"], sim.core.cache_manager
    A, B = 11, 12
    for w in sim.sim_workers():
        sim.apply_cache_delta(w, w.cache.insert([A, B]))
    # Planned (a reclamation in flight at each worker), then a request that reuses
    # A-B is placed at worker 0 (lowest id on a tie) before the deletions run.
    ops = []
    for w in (0, 1):
        op = Reclaim(B, 4, w)
        mgr.start_reclaim(op)
        ops.append(op)
    assert sim.submit(Request(0, 0.0, 9, (A, B, 13)))
    assert sim.worker(0).running is not None
    shell.delete(ops[0])
    assert B in sim.worker(0).cache and 0 in sim.core.store.holders(B)
    assert mgr.counts["reclaims_aborted"] == 1
    # Idle worker 1: the same deletion goes through.
    shell.delete(ops[1])
    assert B not in sim.worker(1).cache and 1 not in sim.core.store.holders(B)
    assert mgr.counts["reclaims_done"] == 1 and not mgr.reclaims_in_flight


def test_nocm_is_plain_cost_model_placement(model) -> None:
    trace = load_trace("synthetic:duration_s=20,mean_rate=10", seed=1)
    pool = PoolConfig(Composition.parse("2xCP4+1xCP8"), model)
    a = build_vertumnus_nocm(pool).run(trace.requests)
    # A manager that can never act (thresholds out of reach) changes nothing.
    inert = CacheManagerSettings(theta_inter=1e9, theta_intra=1e9, theta_reclaim=0.0)
    b = build_vertumnus(pool, cache=inert).run(trace.requests)
    assert [(c.request_id, c.worker, c.ttft_s) for c in a.completions] == [
        (c.request_id, c.worker, c.ttft_s) for c in b.completions
    ]
    assert build_vertumnus_nocm(pool).core.cache_manager is None


def test_any_placement_policy_can_feed_the_manager(model) -> None:
    from vertumnus.core.policies.simple import LeastWork

    trace = load_trace("synthetic:duration_s=20,mean_rate=20", seed=2)
    pool = PoolConfig(Composition.parse("2xCP4+1xCP8"), model, cache_blocks_per_gpu=150)
    mgr = CacheManager(EAGER)
    sim = Simulation(pool, LeastWork(), cache_manager=mgr)
    shell = attach_cache_manager(sim)
    result = sim.run(trace.requests)
    assert sorted(c.request_id for c in result.completions) == [r.id for r in trace.requests]
    assert mgr.counts["scans"] > 0 and shell.sim is sim
    index_matches_caches(sim)


def test_copies_and_reclaims_across_reconfigurations(model) -> None:
    from vertumnus.core import planner
    from vertumnus.sim.reconfig import AdaptiveOptions, build_adaptive

    trace = load_trace("synthetic:duration_s=60,mean_rate=8", seed=4)
    opts = AdaptiveOptions(
        gpus=16,
        control=planner.PlannerSettings(window_s=5.0),
        initial=Composition.parse("2xCP8"),
    )
    literal = CacheManagerSettings(**{**EAGER.__dict__, "reclaim_for_room_only": False})
    mgr = CacheManager(literal)
    sim = build_adaptive(
        trace,
        model,
        opts,
        lambda pool: Simulation(pool, CostModelPolicy(opts.placement), cache_manager=mgr),
    )
    attach_cache_manager(sim)
    result = sim.run(trace.requests)
    assert sorted(c.request_id for c in result.completions) == [r.id for r in trace.requests]
    assert result.reconfigurations >= 1
    assert mgr.counts["copies_installed"] > 0
    assert mgr.counts["reclaims_done"] > 0
    index_matches_caches(sim)
