"""The cache manager inside the real Simulation: operations, timing and safety."""

from __future__ import annotations

from vertumnus.core.blockcache import BlockCache
from vertumnus.core.cachemanager import CacheManagerSettings, Reclaim
from vertumnus.core.types import Composition, Request
from vertumnus.sim.cachesim import CacheManagedPolicy, build_vertumnus, build_vertumnus_nocm
from vertumnus.sim.engine import PoolConfig, Simulation
from vertumnus.sim.traces import load_trace

# Low thresholds so a short run replicates and reclaims plenty.
EAGER = CacheManagerSettings(
    scan_interval_s=0.5, decay=0.8, theta_inter=0.002, theta_intra=0.5, theta_reclaim=0.2
)


def trie_matches_caches(sim: Simulation) -> None:
    for w in sim.sim_workers():
        held = {k for k, n in sim.trie.nodes.items() if w.id in n.holders}
        assert held == set(w.cache.keys_lru_first()), f"worker {w.id}: trie and cache disagree"


def test_every_request_once_replicas_visible_only_after_install(model, monkeypatch) -> None:
    trace = load_trace("synthetic:duration_s=40,mean_rate=25", seed=3)
    pool = PoolConfig(Composition.parse("2xCP4+1xCP8"), model, cache_blocks_per_gpu=150)
    sim = build_vertumnus(pool, cache=EAGER)
    policy = sim.policy
    assert isinstance(policy, CacheManagedPolicy)
    shell, mgr = policy.shell, policy.manager
    assert shell is not None

    planned: dict[int, float] = {}
    scan = mgr.scan

    def recording_scan(view):  # type: ignore[no-untyped-def]
        plan = scan(view)
        for op in plan.copies:
            planned[id(op)] = sim.now
        return plan

    mgr.scan = recording_scan  # type: ignore[method-assign]

    decide = policy.decide
    calls = [0]

    def checked_decide(request, pool_view):  # type: ignore[no-untyped-def]
        calls[0] += 1
        if calls[0] % 25 == 0:
            # Placement reads the trie; the trie holds exactly what the caches
            # hold, so an in-flight copy (not in any cache yet) is invisible.
            trie_matches_caches(sim)
            for op in mgr.copies_in_flight:
                dst = sim.worker(op.destination)
                assert dst.cache.match(op.keys) < len(op.keys) or all(
                    dst.id in sim.trie.nodes[k].holders for k in op.keys
                )
        return decide(request, pool_view)

    policy.decide = checked_decide  # type: ignore[method-assign]

    # Reclamation safety, checked where the blocks actually go (only
    # reclamation calls remove_subtree in this run).
    owner = {id(w.cache): w for w in sim.sim_workers()}
    remove = BlockCache.remove_subtree

    def checked_remove(cache, key):  # type: ignore[no-untyped-def]
        w = owner[id(cache)]
        jobs = list(w.queue) + ([w.running] if w.running is not None else [])
        for job in jobs:
            keys = job.request.block_keys
            assert key not in keys[: w.cache.match(keys)], "reclaimed a prefix in use"
        delta = remove(cache, key)
        assert delta.removed == [key], "reclaim stranded a retained descendant"
        return delta

    monkeypatch.setattr(BlockCache, "remove_subtree", checked_remove)

    result = sim.run(trace.requests)
    ids = sorted(c.request_id for c in result.completions)
    assert ids == [r.id for r in trace.requests] and not result.rejected
    c = mgr.counts
    assert c["copies_installed"] > 0 and c["inter_started"] + c["intra_started"] > 0
    assert c["reclaims_done"] > 0
    for t, op in shell.installed:
        assert abs(t - (planned[id(op)] + op.transfer_s)) < 1e-9
    trie_matches_caches(sim)
    assert not mgr.copies_in_flight and not mgr.reclaims_in_flight
    assert not mgr._pins  # every request unpinned at completion


def test_shell_refuses_a_reclaim_that_became_in_use(model) -> None:
    pool = PoolConfig(Composition.parse("2xCP4"), model, block_size=4)
    sim = build_vertumnus(pool)
    policy = sim.policy
    assert isinstance(policy, CacheManagedPolicy) and policy.shell is not None
    A, B = 11, 12
    for w in sim.sim_workers():
        sim.apply_cache_delta(w, w.cache.insert([A, B]))
    op = Reclaim(B, 4, 0)
    # Planned, then a request that reuses A-B is placed at worker 0 (lowest id
    # on a tie) before the deletion is carried out.
    assert sim.submit(Request(0, 0.0, 9, (A, B, 13)))
    assert sim.worker(0).running is not None
    policy.shell._delete(op)
    assert B in sim.worker(0).cache and 0 in sim.trie.nodes[B].holders
    assert policy.manager.counts["reclaims_aborted"] == 1
    # Idle worker 1: the same deletion goes through.
    policy.shell._delete(Reclaim(B, 4, 1))
    assert B not in sim.worker(1).cache and 1 not in sim.trie.nodes[B].holders


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
    assert build_vertumnus_nocm(pool).policy.name == "vertumnus-nocm"


def test_wraps_any_placement_policy(model) -> None:
    from vertumnus.core.cachemanager import CacheManager
    from vertumnus.core.policies.simple import LeastWork
    from vertumnus.sim.cachesim import attach_cache_manager

    trace = load_trace("synthetic:duration_s=20,mean_rate=20", seed=2)
    pool = PoolConfig(Composition.parse("2xCP4+1xCP8"), model, cache_blocks_per_gpu=150)
    policy = CacheManagedPolicy(CacheManager(EAGER), inner=LeastWork(), name="least-work+cm")
    sim = Simulation(pool, policy)
    shell = attach_cache_manager(sim)
    result = sim.run(trace.requests)
    assert sorted(c.request_id for c in result.completions) == [r.id for r in trace.requests]
    assert policy.manager.counts["scans"] > 0 and shell.sim is sim
    trie_matches_caches(sim)


def test_copies_and_reclaims_across_reconfigurations(model) -> None:
    from vertumnus.core import planner
    from vertumnus.core.cachemanager import CacheManager
    from vertumnus.sim.cachesim import attach_cache_manager
    from vertumnus.sim.reconfig import AdaptiveOptions, build_adaptive

    trace = load_trace("synthetic:duration_s=60,mean_rate=8", seed=4)
    opts = AdaptiveOptions(
        gpus=16,
        control=planner.PlannerSettings(window_s=5.0),
        initial=Composition.parse("2xCP8"),
    )
    literal = CacheManagerSettings(**{**EAGER.__dict__, "reclaim_for_room_only": False})
    policy = CacheManagedPolicy(CacheManager(literal), opts.placement, name="adaptive+cm")
    sim = build_adaptive(trace, model, opts, policy=policy)
    attach_cache_manager(sim)
    result = sim.run(trace.requests)
    assert sorted(c.request_id for c in result.completions) == [r.id for r in trace.requests]
    assert result.reconfigurations >= 1
    assert policy.manager.counts["copies_installed"] > 0
    assert policy.manager.counts["reclaims_done"] > 0
    trie_matches_caches(sim)
