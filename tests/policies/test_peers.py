"""Each peer's routing rule, pinned on hand-computed placements.

These tests exist so that a refactor cannot silently change what Vertumnus
is compared against. Every expected worker below is worked out by hand in the
comment next to it, from the rule cited in the peer's module docstring.
"""

from __future__ import annotations

import random

import pytest

from tests.policies.fakes import observe, pool, req
from vertumnus.core.policies.peers import (
    LLMD,
    AIBrixConductor,
    DynamoKV,
    LeastRequests,
    Preble,
    SGLangCacheAware,
    VLLMKvaware,
)
from vertumnus.core.policies.peers._index import GlobalTTLIndex, WorkerLRUIndex
from vertumnus.core.policies.peers.llmd import PRECISE
from vertumnus.core.types import Composition
from vertumnus.profiles import load_model
from vertumnus.sim.engine import PoolConfig, Simulation
from vertumnus.sim.traces import load_trace

# -- approximate indexes -------------------------------------------------------


def test_worker_lru_index_matches_leading_blocks_and_evicts_leaves_first():
    ix = WorkerLRUIndex(capacity=3)
    ix.insert(0, (1, 2, 3, 4, 5))  # capacity 3: the two deepest blocks go
    assert ix.size(0) == 3
    assert ix.matched((1, 2, 3, 4)) == {0: 3}
    ix.insert(1, (1, 2))
    assert ix.matched((1, 2, 3)) == {0: 3, 1: 2}
    assert ix.matched((9, 1)) == {}


def test_global_ttl_index_forgets_stale_entries():
    ix = GlobalTTLIndex(capacity=10, ttl_s=60)
    ix.insert(0, (1, 2), now=0.0)
    ix.insert(1, (1,), now=50.0)
    assert ix.matched((1, 2), now=55.0) == {0: 2, 1: 1}
    assert ix.matched((1, 2), now=100.0) == {1: 1}  # worker 0's entries are 100 s old
    ix.sweep(200.0)
    assert len(ix) == 0


# -- least-requests ---------------------------------------------------------------


def test_least_requests_counts_requests_not_work():
    p = pool(3)
    p.workers[0].queued, p.workers[1].queued, p.workers[2].queued = 2, 1, 1
    p.workers[1].outstanding_s = 100.0  # ignored: it counts requests
    assert LeastRequests().decide(req(0, (1,)), p).worker == 1


# -- SGLang -------------------------------------------------------------------------


def _sglang_with_prefix_on_w0(**kw) -> tuple[SGLangCacheAware, object]:
    p = pool(2)
    pol = SGLangCacheAware(**kw)
    observe(pol, req(0, (1, 2, 3, 4)), 0, p)
    return pol, p


@pytest.mark.parametrize(
    ("load0", "load1", "expected"),
    [
        (65, 0, 1),  # 65 − 0 > 64 and 65 > 1.5·0: imbalanced → least loaded
        (64, 0, 0),  # 64 − 0 is not > 64: balanced → the cache holder
        (300, 210, 0),  # 90 > 64 but 300 ≤ 1.5·210 = 315: balanced
        (300, 200, 0),  # 300 is not > 1.5·200 = 300 (strict): balanced
        (300, 199, 1),  # 101 > 64 and 300 > 298.5: imbalanced
    ],
)
def test_sglang_switches_to_shortest_queue_only_when_both_thresholds_are_exceeded(
    load0, load1, expected
):
    pol, p = _sglang_with_prefix_on_w0()
    p.workers[0].queued, p.workers[1].queued = load0, load1
    # The prompt extends w0's prefix: 16 of 20 tokens match (0.8 > 0.3).
    assert pol.decide(req(1, (1, 2, 3, 4, 5)), p).worker == expected


def test_sglang_match_ratio_threshold_is_strict_and_misses_go_to_the_smallest_tree():
    pol, p = _sglang_with_prefix_on_w0(cache_threshold=0.25)
    # 1 block of 4 matched out of 16 tokens = 0.25, not > 0.25: smallest tree (w1, empty).
    assert pol.decide(req(1, (1, 7, 8, 9)), p).worker == 1
    pol, p = _sglang_with_prefix_on_w0(cache_threshold=0.24)
    assert pol.decide(req(1, (1, 7, 8, 9)), p).worker == 0


def test_sglang_inserts_the_prompt_into_the_chosen_tree_even_when_balancing():
    pol, p = _sglang_with_prefix_on_w0()
    p.workers[0].queued = 100
    r = req(1, (1, 2, 3, 4, 5))
    assert pol.decide(r, p).worker == 1
    observe(pol, r, 1, p)
    assert pol.tree.matched(r.block_keys) == {0: 4, 1: 5}


def test_sglang_evicts_each_tree_to_max_size_on_its_interval():
    # max_tree_size = 3 blocks of 4 tokens at 4 chars/token = 48 chars.
    pol, p = _sglang_with_prefix_on_w0(max_tree_size_chars=48, eviction_interval_s=10.0)
    observe(pol, req(1, (1, 2, 3, 4, 5)), 0, p)
    pol.decide(req(2, (9,), t=5.0), p)
    assert pol.tree.size(0) == 5  # not yet: the sweep runs every 10 s
    pol.decide(req(3, (9,), t=10.0), p)
    assert pol.tree.size(0) == 3
    assert pol.tree.matched((1, 2, 3, 4, 5)) == {0: 3}  # leaves went first


# -- llm-d ----------------------------------------------------------------------------


def test_llmd_weighted_sum_of_prefix_queue_and_kv_cache():
    p = pool(2)
    pol = LLMD(rng=random.Random(0))
    observe(pol, req(0, (1, 2, 3, 4)), 0, p)
    p.workers[0].queued, p.workers[1].queued = 3, 1
    # Full prefix on w0: w0 = 3·1 + 2·0 (longest queue) + 2·1 = 5; w1 = 0 + 2·1 + 2·1 = 4.
    assert pol.totals(req(1, (1, 2, 3, 4)), p) == {0: 5.0, 1: 4.0}
    assert pol.decide(req(1, (1, 2, 3, 4)), p).worker == 0
    # Half the prefix: w0 = 3·0.5 + 0 + 2 = 3.5 < w1 = 4.
    assert pol.decide(req(2, (1, 2, 9, 10)), p).worker == 1


def test_llmd_kv_cache_scorer_reads_the_running_requests_blocks():
    p = pool(2)
    pol = LLMD()
    observe(pol, req(0, tuple(range(10))), 0, p)  # 10 blocks of a 100-block cache
    p.workers[0].running = 1
    # kv score w0 = 1 − 10/100 = 0.9; prefix of (50,) = 0 both; queues equal → 1 both.
    assert pol.totals(req(1, (50,)), p) == pytest.approx({0: 2 + 2 * 0.9, 1: 4.0})
    pol.observe_completed(req(0, tuple(range(10))), 0)
    p.workers[0].running = 0
    assert pol.totals(req(1, (50,)), p) == {0: 4.0, 1: 4.0}


def test_llmd_approximate_mode_hashes_at_most_4096_tokens():
    p = pool(2)
    p.block_size = 512
    pol = LLMD()
    keys = tuple(range(20))
    observe(pol, req(0, keys, length=20 * 512), 0, p)
    # Only the first 8 blocks (4096 tokens) are hashed: a request sharing
    # just those scores 1.0 at w0, the same as one sharing all 20.
    assert pol.approx is not None
    short = pol.approx.score(req(1, keys[:8] + (99,) * 12, length=20 * 512), p, p.workers)
    assert short[0] == 1.0


def test_llmd_precise_mode_min_max_normalises_exact_hits():
    p = pool(3)
    p.matched = {0: 4, 1: 2}
    pol = LLMD(mode=PRECISE)
    # prefix: w0 (4−2)/(4−2) = 1, w1 (2−2)/2 = 0, w2 no hit = 0; queues equal (1); kv idle (1).
    assert pol.totals(req(0, (1, 2, 3, 4)), p) == {0: 7.0, 1: 4.0, 2: 4.0}
    assert pol.decide(req(0, (1, 2, 3, 4)), p).worker == 0
    assert pol.name == "llm-d-precise" and LLMD().name == "llm-d"


# -- Dynamo -----------------------------------------------------------------------


def test_dynamo_picks_lowest_weighted_prefill_plus_decode_blocks():
    p = pool(2)
    p.matched = {0: 3}
    pol = DynamoKV()
    pol.active_blocks[0] = 10
    r = req(0, (1, 2, 3, 4))  # 16 tokens, 4 blocks
    # w0: 1·(0 + 16 − 3·4)/4 + (10 + 4) = 15; w1: 1·16/4 + (0 + 4) = 8 → w1.
    assert pol.logits(r, p) == {0: 15.0, 1: 8.0}
    assert pol.decide(r, p).worker == 1
    heavy = DynamoKV(overlap_score_weight=10.0)
    heavy.active_blocks[0] = 10
    # w0: 10·1 + 14 = 24; w1: 10·4 + 4 = 44 → w0.
    assert heavy.decide(r, p).worker == 0


def test_dynamo_books_active_load_at_placement_and_releases_it_on_completion():
    p = pool(2)
    p.matched = {0: 3}
    pol = DynamoKV()
    r = req(0, (1, 2, 3, 4))
    observe(pol, r, 1, p)  # w1 holds nothing: all 16 tokens are prefill
    assert (pol.prefill_tokens[1], pol.active_blocks[1]) == (16, 4)
    # Next identical request: w0 = 1 + 4 = 5; w1 = (16 + 16)/4 + (4 + 4) = 16.
    assert pol.logits(req(1, (1, 2, 3, 4)), p) == {0: 5.0, 1: 16.0}
    pol.observe_completed(r, 1)
    assert (pol.prefill_tokens[1], pol.active_blocks[1]) == (0, 0)


def test_dynamo_and_llmd_move_their_bookings_when_the_shell_re_places_a_request():
    p = pool(2)
    dyn, llmd = DynamoKV(), LLMD()
    r = req(0, (1, 2, 3, 4))
    for pol in (dyn, llmd):
        observe(pol, r, 1, p)
        observe(pol, r, 0, p)  # worker 1 drained: the request moved to 0
    assert (dyn.prefill_tokens[1], dyn.active_blocks[1]) == (0, 0)
    assert (dyn.prefill_tokens[0], dyn.active_blocks[0]) == (16, 4)
    assert dict(llmd.kv.inflight[1]) == {} and dict(llmd.kv.inflight[0]) == {0: 4}
    dyn.observe_completed(r, 0)
    assert (dyn.prefill_tokens[0], dyn.active_blocks[0]) == (0, 0)


def test_dynamo_temperature_zero_breaks_ties_with_the_seeded_rng():
    p = pool(3)
    picks = {DynamoKV(rng=random.Random(s)).decide(req(0, (1,)), p).worker for s in range(30)}
    assert picks == {0, 1, 2}
    a = [DynamoKV(rng=random.Random(7)).decide(req(0, (1,)), p).worker for _ in range(3)]
    assert len(set(a)) == 1


# -- AIBrix ---------------------------------------------------------------------------


def test_aibrix_conductor_estimated_ttft():
    p = pool(2)
    pol = AIBrixConductor()
    observe(pol, req(0, tuple(range(1000))), 0, p)
    r = req(1, tuple(range(500)) + tuple(range(5000, 5500)))  # 4000 tokens, 50 % on w0
    # w0: prefix 0.005·2000 + 1 = 11; prefill 0.001·2000^1.5 + 5 = 94.443 → 105.443
    # w1: prefill 0.001·4000^1.5 + 5 = 257.982
    scores = pol.scores(r, p)
    assert scores[0] == pytest.approx(105.4427, abs=1e-3)
    assert scores[1] == pytest.approx(257.9822, abs=1e-3)
    assert pol.decide(r, p).worker == 0
    # 10 requests in flight on w0 add 10 · estimatePrefill(512) = 10 · 16.585 ms → w1.
    p.workers[0].queued = 10
    assert pol.scores(r, p)[0] == pytest.approx(105.4427 + 165.8524, abs=1e-3)
    assert pol.decide(r, p).worker == 1


# -- vLLM production-stack kvaware --------------------------------------------------------


def test_vllm_kvaware_longest_match_within_threshold_else_lowest_qps():
    p = pool(2)
    pol = VLLMKvaware(kv_aware_threshold=8)
    r = req(0, tuple(range(10)))  # 40 tokens
    p.matched = {1: 8}  # 32 tokens ≥ 40 − 8: the holder, however busy
    p.workers[1].queued = 50
    assert pol.decide(r, p).worker == 1
    p.matched = {1: 7}  # 28 < 32: fall back; w0 was never sent a request → w0
    assert pol.decide(r, p).worker == 0
    observe(pol, req(1, (1,), t=0.0), 0, p)
    observe(pol, req(2, (1,), t=1.0), 0, p)
    observe(pol, req(3, (1,), t=2.0), 1, p)
    # Both seen: w0 routed 2 in the last 60 s, w1 1 → w1.
    assert pol.decide(req(4, tuple(range(10)), t=3.0), p).worker == 1
    # 100 s later w0's two have left the window, w1's one too: tie → lowest id.
    assert pol.decide(req(5, tuple(range(10)), t=103.0), p).worker == 0


# -- Preble ---------------------------------------------------------------------------


def _place(pol, p, r):
    d = pol.decide(r, p)
    pol.observe_placed(r, d, p)
    return d.worker


def test_preble_explores_new_prefixes_and_exploits_known_ones():
    p = pool(2)
    pol = Preble()
    a = tuple(range(1, 9))
    # New prompt, all 8 blocks unknown → explore; both loads 0 → w0.
    assert _place(pol, p, req(0, a)) == 0
    assert pol.load[0] > 0
    # 8 known blocks + 2 new: 2 < 8 → exploit → w0's allocation, though w1 is idle.
    assert _place(pol, p, req(1, a + (9, 10), t=1.0)) == 0
    # A fresh prefix → explore → the least loaded worker, w1.
    assert _place(pol, p, req(2, tuple(range(50, 58)), t=2.0)) == 1


def test_preble_splits_nodes_and_moves_the_histogram_to_the_important_node():
    p = pool(2)
    pol = Preble()
    _place(pol, p, req(0, tuple(range(1, 9))))
    # Diverges after 4 blocks: (1..8) splits into (1..4) + (5..8). (5..8) is no
    # longer larger than its prefix, so r0's histogram entry moves to (1..4).
    r = req(1, (1, 2, 3, 4, 60, 61, 62, 63), t=1.0)
    d = pol.decide(r, p)
    up = pol.root.children[1]
    assert up.keys == [1, 2, 3, 4] and up.stats is not None and up.children[5].stats is None
    # 4 new blocks vs 4 known: not fewer → explore → least windowed load.
    assert d.worker == min((0, 1), key=lambda g: (pol.load.get(g, 0.0), g))


def test_preble_window_expiry_resets_allocation_and_load():
    p = pool(2)
    pol = Preble(window_s=180.0)
    _place(pol, p, req(0, tuple(range(1, 9))))
    node = pol.root.children[1]
    assert node.gpus == {0}
    pol.decide(req(1, (99,), t=200.0), p)  # r0 has left the 180 s window
    assert node.gpus == set() and node.stats is None
    assert pol.load[0] == pytest.approx(0.0)


# -- every peer through the real simulator ----------------------------------------------

PEERS = {
    "sglang-cache-aware": SGLangCacheAware,
    "llm-d": LLMD,
    "llm-d-precise": lambda: LLMD(mode=PRECISE),
    "dynamo-kv": DynamoKV,
    "preble": Preble,
    "aibrix-conductor": AIBrixConductor,
    "vllm-kvaware": VLLMKvaware,
    "least-requests": LeastRequests,
}


@pytest.fixture(scope="module")
def short_trace():
    return load_trace("synthetic:duration_s=60,mean_rate=6", seed=3)


@pytest.mark.parametrize("name", sorted(PEERS))
def test_every_request_completes_exactly_once_in_the_simulator(name, short_trace):
    cfg = PoolConfig(
        Composition.parse("2xCP4+1xCP8"), load_model(), block_size=short_trace.block_size
    )
    policy = PEERS[name]()
    assert policy.name == name
    result = Simulation(cfg, policy).run(short_trace.requests)
    assert result.rejected == []
    ids = sorted(c.request_id for c in result.completions)
    assert ids == [r.id for r in short_trace.requests]


def test_peers_never_read_worker_degrees():
    # None of the peers may weigh a worker by its CP degree.
    import inspect
    import re

    from vertumnus.core.policies.peers import (
        aibrix,
        dynamo,
        least_requests,
        llmd,
        preble,
        sglang,
        vllm_kvaware,
    )

    for mod in (aibrix, dynamo, least_requests, llmd, preble, sglang, vllm_kvaware):
        assert not re.search(r"\.degree\b", inspect.getsource(mod)), mod.__name__
