"""The optimized hot path returns exactly what the naive reference does.

``place()`` (both its compiled C twin and the pure-Python fallback),
``InflightPrefixes.matched_blocks``, ``merge_matches`` and
``CostModelPolicy.decide`` were rewritten for speed (issue 4). These property
tests run them against the straightforward versions they replaced, on random
pools, tries and in-flight sets, and demand identical results — same worker,
same floats, same preferred degree. (``PrefixTrie.matched_blocks`` is held
against a naive reference by the store contract suite, ``tests/store/``.)
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vertumnus.core import placement
from vertumnus.core.costmodel import PrefillModel
from vertumnus.core.decision import RouteDecision
from vertumnus.core.inflight import InflightPrefixes, merge_matches
from vertumnus.core.placement import (
    PlacementParams,
    WorkerState,
    candidates,
    place,
    place_fields_py,
)
from vertumnus.core.policies.vertumnus import CostModelPolicy
from vertumnus.core.trie import PrefixTrie
from vertumnus.core.types import Request, cached_tokens

try:
    from vertumnus.core._placement import place_fields as compiled
except ImportError:
    compiled = None

MODEL = PrefillModel(
    name="t",
    alpha=1.5e-9,
    c=1.4e-5,
    b=1e-7,
    d={1: 0.015, 2: 0.019, 4: 0.027, 8: 0.043},
    a={1: 1e-5, 2: 1e-5, 4: 1e-5, 8: 1e-5},
    max_tokens_per_gpu=1000,
)

FLAT = PrefillModel(
    name="flat",
    alpha=0.0,
    c=0.0,
    b=0.0,
    d={1: 0.01, 2: 0.01, 4: 0.01, 8: 0.01},
    a={1: 1e-5, 2: 1e-5, 4: 1e-5, 8: 1e-5},
    max_tokens_per_gpu=1000,
)
"""E_C does not depend on C: with λ = 0, own() ties across degrees, so the
preferred degree is decided by the first-minimum rule alone."""


def naive_place(length, matched_blocks, workers, model, params, block_size):
    """The pre-optimization place(), verbatim (worker, Ê, cached, cost, C_pref), or None."""
    cands = candidates(workers, length, model)
    if not cands:
        return None
    c_min = min(w.degree for w in cands)
    beta, lam = params.beta, params.lam
    if params.beta_busy != beta:  # load-dependent beta (added after the optimization)
        beta += (params.beta_busy - beta) * sum(1 for w in cands if w.queued) / len(cands)
    best = None
    best_cost = float("inf")
    best_tie = None
    pref_degree = 0
    pref_cost = float("inf")
    for w in cands:
        p = cached_tokens(matched_blocks.get(w.id, 0), length, block_size)
        est = model.predict(w.degree, length - p, p)
        own = (beta + lam * (w.degree / c_min - 1.0)) * est
        cost = w.outstanding_s + own
        # Equal costs: idle before busy, the longest idle first, then the first in order.
        tie = (w.outstanding_s > 0, w.free_at if w.outstanding_s <= 0 else 0.0)
        if cost < best_cost or (cost == best_cost and tie < best_tie):
            best_cost = cost
            best_tie = tie
            best = (w.id, est, p, cost)
        if own < pref_cost:
            pref_cost = own
            pref_degree = w.degree
    assert best is not None
    return (*best, pref_degree)


def fields(d: RouteDecision | None):
    return (
        None if d is None else (d.worker, d.estimate_s, d.cached_tokens, d.cost, d.preferred_degree)
    )


def naive_holder_depths(trie: PrefixTrie, keys) -> dict[int, int]:
    """Per worker, the leading keys it holds."""
    depths: dict[int, int] = {}
    workers = {w for k in keys for w in trie.holders(k)}
    for w in workers:
        n = 0
        for k in keys:
            if w not in trie.holders(k):
                break
            n += 1
        if n:
            depths[w] = n
    return depths


workers_st = st.lists(
    st.tuples(
        st.sampled_from([1, 2, 4, 8, 3]),  # 3: a degree the model does not support
        st.sampled_from([0.0, 0.5, 1.0, 2.5]),  # few values, so ties happen
        st.booleans(),
        st.sampled_from([0, 0, 1, 3]),  # requests waiting: drives the load-dependent beta
        st.sampled_from([0.0, 0.0, 1.0, 2.0]),  # idle since: breaks ties among idle workers
    ),
    min_size=1,
    max_size=12,
)


@settings(max_examples=300, deadline=None)
@given(
    workers=workers_st,
    length=st.integers(1, 9000),
    matched=st.dictionaries(st.integers(0, 13), st.integers(-1, 30), max_size=8),
    lam=st.sampled_from([0.0, 0.1, 1.0]),
    block_size=st.sampled_from([1, 16, 512]),
    model=st.sampled_from([MODEL, FLAT]),
)
def test_place_matches_the_naive_reference(workers, length, matched, lam, block_size, model):
    ws = [
        WorkerState(i, d, available=a, outstanding_s=q, queued=n, free_at=s)
        for i, (d, q, a, n, s) in enumerate(workers)
    ]
    params = PlacementParams(lam=lam)
    want = naive_place(length, matched, ws, model, params, block_size)
    got = place(length, matched, ws, model, params, block_size)
    assert fields(got) == want
    if got is not None:
        assert got.queue_s == ws[got.worker].outstanding_s
    # Both implementations, whichever one place() runs here.
    assert place_fields_py(length, matched, ws, model, params, block_size) == want
    if compiled is not None:
        assert compiled(length, matched, ws, model, params, block_size) == want


def test_the_compiled_hot_path_is_built_and_in_use():
    """The C extension is optional at install time, but this project's build
    (and CI) has a compiler: a silent fall-back to Python would halve the
    router's decision rate."""
    assert placement.HOT_PATH == "c"
    assert placement.place_fields is compiled


def test_compiled_hot_path_reads_any_mapping_without_changing_it():
    from collections import defaultdict
    from types import MappingProxyType

    ws = [WorkerState(i, d, outstanding_s=0.5 * i) for i, d in enumerate([1, 2, 4, 8])]
    params = PlacementParams()
    plain = {2: 3, 3: 1}
    want = place_fields_py(3000, plain, ws, MODEL, params, 512)
    counts: defaultdict[int, int] = defaultdict(int, plain)
    for m in (MappingProxyType(plain), counts):
        assert place_fields_py(3000, m, ws, MODEL, params, 512) == want
        if compiled is not None:
            assert compiled(3000, m, ws, MODEL, params, 512) == want
    assert dict(counts) == plain  # .get(), never [] on a defaulting mapping


def test_compiled_hot_path_rejects_bad_arguments_clearly():
    if compiled is None:
        pytest.skip("built without the C extension")
    ws = [WorkerState(0, 4)]
    params = PlacementParams()
    with pytest.raises(ValueError, match="block_size"):
        compiled(100, {}, ws, MODEL, params, 0)
    with pytest.raises(OverflowError, match="length"):
        compiled(1 << 40, {}, ws, MODEL, params, 512)
    with pytest.raises(TypeError, match="6 arguments"):
        compiled(100, {}, ws, MODEL)  # type: ignore[call-arg]
    with pytest.raises(AttributeError, match="outstanding_s"):
        compiled(100, {}, [object.__new__(_NoLoad)], MODEL, params, 512)


class _NoLoad:
    """A worker without outstanding_s: an AttributeError naming it, not a crash."""

    available = True
    degree = 4
    id = 0
    queued = 0


def test_place_prefers_the_first_of_tied_degrees():
    """Equal own() at every degree: C_pref is the first candidate's degree, in
    the caller's order, whichever keys the ties come from."""
    params = PlacementParams(lam=0.0)
    for degrees in ([8, 2, 4, 1], [2, 8, 8, 1], [4, 1]):
        ws = [WorkerState(i, d, outstanding_s=1.0) for i, d in enumerate(degrees)]
        for matched in ({}, {1: 3}, {0: 3, 1: 3}):
            got = place(2000, matched, ws, FLAT, params, 16)
            assert fields(got) == naive_place(2000, matched, ws, FLAT, params, 16)


def test_ties_go_to_the_longest_idle_worker_then_the_first():
    """Equal costs: an idle worker before a busy one, the longest idle first (the
    what-if replay's order), then the caller's order; both twins."""
    twins = [place_fields_py] + ([compiled] if compiled is not None else [])
    params = PlacementParams()
    for fn in twins:
        # Four idle CP4 workers, none holding the prefix: the one idle since 1.0 wins.
        ws = [WorkerState(i, 4, free_at=s) for i, s in enumerate([5.0, 1.0, 3.0, 1.0])]
        assert fn(2000, {}, ws, MODEL, params, 16)[0] == 1
        # The prefix at workers 0 and 2 only: the longer idle of those two.
        assert fn(2000, {0: 50, 2: 50}, ws, MODEL, params, 16)[0] == 2
        # Never idle yet (0.0) is the longest idle; among equals, the first.
        ws = [WorkerState(i, 4, free_at=s) for i, s in enumerate([2.0, 0.0, 0.0])]
        assert fn(2000, {}, ws, MODEL, params, 16)[0] == 1
        # Busy workers of equal cost: the first, whatever their free_at.
        ws = [WorkerState(i, 4, outstanding_s=1.0, free_at=s) for i, s in enumerate([9.0, 1.0])]
        assert fn(2000, {}, ws, MODEL, params, 16)[0] == 0


def naive_inflight_matched(
    by_request: dict[int, tuple[int, tuple[int, ...]]], keys
) -> dict[int, int]:
    """The pre-optimization InflightPrefixes.matched_blocks over a plain
    {request: (worker, keys)} record: every holder of every matched key,
    deeper keys overwriting, stopping at the first key nobody has in flight."""
    depths: dict[int, int] = {}
    for depth, k in enumerate(keys, start=1):
        holders = {w for w, ks in by_request.values() if k in ks}
        if not holders:
            break
        for w in holders:
            depths[w] = depth
    return depths


def naive_merge(cached, inflight) -> dict[int, int]:
    """The pre-optimization merge_matches."""
    if not inflight:
        return dict(cached) if cached else {}
    merged = dict(cached) if cached else {}
    for w, n in inflight.items():
        if n > merged.get(w, 0):
            merged[w] = n
    return merged


key_lists = st.lists(st.integers(0, 6), min_size=1, max_size=6).map(tuple)


@settings(max_examples=150, deadline=None)
@given(
    ops=st.lists(
        st.tuples(st.integers(0, 12), st.integers(0, 4), key_lists, st.booleans()), max_size=30
    ),
    query=key_lists,
)
def test_inflight_matches_the_naive_reference(ops, query):
    # Raw keys, not chained: repeated and shared keys in any position, which
    # splits and merges runs of holder maps in every way.
    idx = InflightPrefixes()
    live: dict[int, tuple[int, tuple[int, ...]]] = {}
    for rid, worker, keys, remove in ops:
        if remove:
            idx.remove(rid)
            live.pop(rid, None)
        else:
            idx.add(rid, worker, keys)
            live[rid] = (worker, keys)
        assert idx.matched_blocks(query) == naive_inflight_matched(live, query)
        assert idx.matched_blocks(keys) == naive_inflight_matched(live, keys)


@given(
    cached=st.one_of(st.none(), st.dictionaries(st.integers(0, 6), st.integers(-1, 9), max_size=6)),
    inflight=st.dictionaries(st.integers(0, 6), st.integers(-1, 9), max_size=6),
)
def test_merge_matches_the_naive_reference(cached, inflight):
    before = None if cached is None else dict(cached)
    assert merge_matches(cached, inflight) == naive_merge(cached, inflight)
    assert cached == before  # the cached matches are not modified


@dataclass
class TriePool:
    """A PoolView over fixed worker states, a trie and an in-flight index."""

    workers: list[WorkerState]
    store: PrefixTrie
    inflight: InflightPrefixes
    model: PrefillModel = MODEL
    block_size: int = 16

    def worker(self, worker_id: int) -> WorkerState:
        return next(w for w in self.workers if w.id == worker_id)

    def matched_blocks(self, request: Request):
        return self.store.matched_blocks(request.block_keys)

    def inflight_blocks(self, request: Request):
        return self.inflight.matched_blocks(request.block_keys)


def naive_decide(policy: CostModelPolicy, request: Request, pool: TriePool, live):
    matched = naive_holder_depths(pool.store, request.block_keys)
    if live:
        matched = naive_merge(dict(matched), naive_inflight_matched(live, request.block_keys))
    return naive_place(
        request.length, matched, pool.workers, pool.model, policy.params, pool.block_size
    )


@settings(max_examples=100, deadline=None)
@given(
    workers=workers_st,
    cached=st.lists(
        st.tuples(st.integers(0, 11), st.lists(st.integers(0, 2), min_size=1, max_size=6)),
        max_size=12,
    ),
    arrivals=st.lists(
        st.tuples(
            st.lists(st.integers(0, 2), min_size=1, max_size=8), st.integers(1, 200), st.booleans()
        ),
        min_size=1,
        max_size=15,
    ),
)
def test_decide_matches_the_naive_reference(workers, cached, arrivals):
    """The whole decision — trie lookup, in-flight lookup and merge, place() —
    against the naive pieces, with requests placed and finishing in between."""
    ws = [
        WorkerState(i, d, available=a, outstanding_s=q, queued=n, free_at=s)
        for i, (d, q, a, n, s) in enumerate(workers)
    ]
    trie = PrefixTrie()

    def chain(xs: list[int]) -> tuple[int, ...]:
        out, prev = [], 0
        for x in xs:
            prev = prev * 7 + x + 1
            out.append(prev)
        return tuple(out)

    for worker, xs in cached:
        keys = chain(xs)
        trie.apply(worker, [(k, i, keys[i - 1] if i else None) for i, k in enumerate(keys)])
    pool = TriePool(ws, trie, InflightPrefixes())
    policy = CostModelPolicy(PlacementParams(lam=0.1))
    live: dict[int, tuple[int, tuple[int, ...]]] = {}
    for rid, (xs, tokens_per_block, finish_oldest) in enumerate(arrivals):
        keys = chain(xs)
        request = Request(rid, 0.0, len(keys) * tokens_per_block, keys)
        got = policy.decide(request, pool)
        assert fields(got) == naive_decide(policy, request, pool, live)
        if got is not None:
            pool.inflight.add(rid, got.worker, keys)
            live[rid] = (got.worker, keys)
        if finish_oldest and live:
            oldest = min(live)
            pool.inflight.remove(oldest)
            live.pop(oldest)


def test_compiled_hot_path_matches_python_on_large_pools_and_the_shipped_profile():
    """64 workers, long requests, deep matches, the shipped H200 profile: the
    two implementations agree to the last bit on every decision."""
    import random

    from vertumnus.profiles import load_model

    model = load_model()
    rng = random.Random(7)
    for _ in range(2000):
        ws = [
            WorkerState(
                i,
                rng.choice([1, 2, 4, 8]),
                available=rng.random() > 0.1,
                outstanding_s=rng.choice([0.0, rng.uniform(0, 30)]),
                queued=rng.choice([0, 0, 1, 5]),
                free_at=rng.choice([0.0, 0.0, 3.0, rng.uniform(0, 9)]),
            )
            for i in rng.sample(range(1000), 64)
        ]
        length = rng.randint(1, 1_100_000)
        holders = rng.sample(ws, rng.randint(0, 40))
        matched = {w.id: rng.randint(0, length // 512 + 2) for w in holders}
        params = PlacementParams(
            beta=rng.choice([1.0, 2.0]), lam=rng.choice([0.0, 0.1]), beta_busy=10.0
        )
        want = place_fields_py(length, matched, ws, model, params, 512)
        assert placement.place_fields(length, matched, ws, model, params, 512) == want
