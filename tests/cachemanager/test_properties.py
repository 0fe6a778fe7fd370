"""Property tests of the cache manager against naive references."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vertumnus.core.cachemanager import CacheManager, CacheManagerSettings, marginal_benefits
from vertumnus.core.trie import PrefixTrie
from vertumnus.core.types import cached_tokens

from .helpers import MODEL, View, all_keys, missing_blocks, workers

DEGREES = (4, 8)


@given(
    ops=st.lists(
        st.one_of(
            st.tuples(
                st.just("access"), st.integers(0, 2), st.sampled_from(DEGREES), st.floats(0, 10)
            ),
            st.tuples(
                st.just("missed"), st.integers(0, 2), st.sampled_from(DEGREES), st.floats(0, 1)
            ),
            st.tuples(st.just("scan"), st.just(0), st.just(0), st.just(0.0)),
        ),
        max_size=40,
    ),
    decay=st.floats(0.05, 0.95),
)
@settings(max_examples=80, deadline=None)
def test_lazy_decay_matches_eager_reference(ops: list, decay: float) -> None:
    trie = PrefixTrie()
    keys = (1, 2, 3)
    trie.apply(0, [(k, 0, None) for k in keys])
    view = View(workers(4, 8), trie)
    mgr = CacheManager(CacheManagerSettings(decay=decay), store=trie)
    ref: dict[tuple[str, int, int], float] = {}
    for kind, i, c, amount in ops:
        if kind == "scan":
            mgr.scan(view)
            ref = {k: v * decay for k, v in ref.items()}
        elif kind == "access":
            mgr.record(keys[i], c, access=amount)
            ref[(kind, i, c)] = ref.get((kind, i, c), 0.0) + amount
        else:
            mgr.record(keys[i], c, missed=amount)
            ref[(kind, i, c)] = ref.get((kind, i, c), 0.0) + amount
    for i, key in enumerate(keys):
        access, missed = mgr.counters(key)
        for c in DEGREES:
            assert access.get(c, 0.0) == pytest.approx(ref.get(("access", i, c), 0.0), abs=1e-9)
            assert missed.get(c, 0.0) == pytest.approx(ref.get(("missed", i, c), 0.0), abs=1e-9)


@given(length=st.integers(1, 200), blocks=st.integers(0, 60), degree=st.sampled_from(DEGREES))
def test_marginal_benefits_telescope(length: int, blocks: int, degree: int) -> None:
    gains = marginal_benefits(MODEL, degree, length, 4, 0, blocks)
    p = cached_tokens(blocks, length, 4)
    total = MODEL.predict(degree, length, 0) - MODEL.predict(degree, length - p, p)
    assert sum(gains) == pytest.approx(total, abs=1e-12)
    assert all(g >= -1e-15 for g in gains)


@st.composite
def pools(draw: st.DrawFn) -> tuple[View, dict[int, tuple[float, float, int]]]:
    """A random index of up to 12 blocks over workers CP4, CP4, CP8, CP8 with
    consistent holders (a holder of a block holds its ancestors) and counters."""
    n = draw(st.integers(1, 12))
    parents = [None] + [draw(st.integers(0, i - 1)) for i in range(1, n)]
    view = View(workers(4, 4, 8, 8, capacity=draw(st.integers(1, 12))))
    # Each worker holds a random set of leaves' paths.
    keys = [100 + i for i in range(n)]
    path_of = []
    for i in range(n):
        path, j = [], i
        while j is not None:
            path.append(keys[j])
            j = parents[j]
        path_of.append(path[::-1])
    for w in range(4):
        for i in draw(st.lists(st.integers(0, n - 1), max_size=3)):
            path = path_of[i]
            view.store.apply(w, [(k, d, path[d - 1] if d else None) for d, k in enumerate(path)])
    if not len(view.store):
        view.store.apply(0, [(keys[0], 0, None)])
    counters = {}
    for key in all_keys(view.store):
        if draw(st.booleans()):
            counters[key] = (
                draw(st.floats(0, 12)),
                draw(st.floats(0, 3)),
                draw(st.sampled_from(DEGREES)),
            )
    return view, counters


@given(pool=pools())
@settings(max_examples=80, deadline=None)
def test_candidates_match_naive_reference(pool: tuple) -> None:
    view, counters = pool
    s = CacheManagerSettings(
        theta_inter=1.0, theta_intra=4.0, theta_reclaim=1.0, max_copy_fraction=0.5
    )
    mgr = CacheManager(s, store=view.store)
    for key, (access, missed, c) in counters.items():
        mgr.record(key, c, access=access, missed=missed)
    plan = mgr.candidates(view)
    got = {
        (x.kind, x.key, x.degree): (x.score, x.footprint)
        for x in plan.inter + plan.intra + plan.reclaim
    }
    want = {}
    for key in counters:
        holders = view.store.holders(key)
        access, missed = mgr.counters(key)
        for c in DEGREES:
            peers = [w for w in view.workers if w.degree == c]
            r = sum(1 for w in peers if w.id in holders)
            # naive footprint: walk the path for every destination
            fps = []
            for w in peers:
                if w.id in holders:
                    continue
                missing = missing_blocks(view.store, key, w.id)
                if missing <= s.max_copy_fraction * w.cache_capacity_blocks:
                    fps.append(missing)
            a, m_ = access.get(c, 0.0), missed.get(c, 0.0)
            if r == 0 and m_ > s.theta_inter and fps:
                want[("inter", key, c)] = (m_ / min(fps), min(fps))
            if r > 0 and a > r * s.theta_intra and fps:
                want[("intra", key, c)] = (a / r, min(fps))
            if r >= s.reclaim_min_replicas and a < r * s.theta_reclaim:
                want[("reclaim", key, c)] = (a / r, 0)
    assert got.keys() == want.keys()
    for k, (score, fp) in want.items():
        assert got[k][0] == pytest.approx(score) and got[k][1] == fp
