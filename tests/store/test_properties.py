"""Every store against the naive reference, on random event streams.

The streams have what real ones have: per-rank batches (a worker's blocks
split by position), children before parents, events without parents,
duplicates, removals, clears, dropped workers, and now and then a batch that
contradicts the index (which must be refused whole). Every store but the
in-process one is also held against that one, op by op: the same answers,
refusals, generations (up to where each counts from) and change log.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.store.conftest import STORES, store_factory
from tests.store.reference import NaiveStore
from vertumnus.core.keys import chain_block_hashes
from vertumnus.core.store import StoreError
from vertumnus.core.trie import PrefixTrie
from vertumnus.core.trienode import python_nodes

# A small universe of prefixes that share heads, so chains overlap.
CHAINS = [
    chain_block_hashes(h)
    for h in ([1, 2, 3, 4, 5], [1, 2, 6], [1, 7, 8, 9], [10, 11], [1, 2, 3, 12])
]
KEYS = sorted({k for c in CHAINS for k in c})

op = st.one_of(
    st.tuples(
        st.just("store"),
        st.integers(0, 3),  # worker
        st.integers(0, len(CHAINS) - 1),  # chain
        st.integers(1, 5),  # how many blocks
        st.sampled_from(["all", "even", "odd", "reversed"]),
        st.booleans(),  # report parents
        st.booleans(),  # cleared first
    ),
    st.tuples(st.just("remove"), st.integers(0, 3), st.lists(st.sampled_from(KEYS), max_size=4)),
    st.tuples(st.just("drop"), st.integers(0, 3)),
    st.tuples(st.just("bad"), st.integers(0, 3), st.sampled_from(KEYS), st.integers(0, 7)),
)


def items_of(chain, n, which, with_parents):
    keys = chain[:n]
    items = [(k, i, (keys[i - 1] if i and with_parents else None)) for i, k in enumerate(keys)]
    if which == "even":
        items = items[::2]
    elif which == "odd":
        items = items[1::2]
    elif which == "reversed":
        items = items[::-1]
    return items


def check_same(store, ref):
    assert len(store) == len(ref.present())
    for k in KEYS:
        assert set(store.holders(k)) == ref.holders(k), k
        b = store.block(k)
        assert (b is not None) == (k in ref.present()), k
        if b is not None:
            assert b.depth == ref.depth[k]
            assert b.parent == ref.parent[k]
            assert set(store.children(k)) == ref.children(k)
    for c in CHAINS:
        assert dict(store.matched_blocks(c)) == ref.matched_blocks(c)
        assert [b.key for b in store.path(c)] == ref.path_keys(c)
    for w in range(4):
        held = {k for k in KEYS if w in ref.holders(k)}
        assert set(store.worker_keys(w)) == held
        assert store.worker_block_count(w) == len(held)  # kept, not counted by a scan


def generations(store):
    return {k: store.block(k).generation for k in KEYS if store.block(k) is not None}


def run(store, ops):
    ref = NaiveStore()
    seen: dict[int, set[int]] = {}  # every generation each key had
    for o in ops:
        before = generations(store)
        if o[0] == "drop":
            store.drop_worker(o[1])
            ref.drop_worker(o[1])
        else:
            apply_both(store, ref, o)
        check_same(store, ref)
        # A generation is never reused for a key that was gone, and a store
        # without a clear keeps the generation of every key it did not remove.
        after = generations(store)
        for k, g in after.items():
            if k not in before:
                assert g not in seen.get(k, set()), k
            elif o[0] == "store" and not o[6]:
                assert g == before[k], k
            seen.setdefault(k, set()).add(g)


def apply_both(store, ref, o):
    if o[0] == "store":
        _, w, ci, n, which, with_parents, cleared = o
        args = dict(stored=items_of(CHAINS[ci], n, which, with_parents), cleared=cleared)
    elif o[0] == "remove":
        w, args = o[1], dict(removed=o[2])
    else:
        _, w, key, pos = o
        args = dict(stored=[(key, pos, None)])
    try:
        ref.apply(w, **args)
    except StoreError:
        cursor = store.cursor
        before = {
            k: (sorted(store.holders(k)), store.block(k) and store.block(k).depth) for k in KEYS
        }
        try:
            store.apply(w, **args)
        except StoreError:
            pass
        else:
            raise AssertionError(f"store accepted what the reference refused: {o}") from None
        assert store.cursor == cursor
        after = {
            k: (sorted(store.holders(k)), store.block(k) and store.block(k).depth) for k in KEYS
        }
        assert before == after
    else:
        store.apply(w, **args)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(op, max_size=40))
def test_memory_store_matches_the_reference(ops):
    run(PrefixTrie(), ops)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(op, max_size=40))
def test_memory_store_with_the_python_node_matches_the_reference(ops):
    """The index as a build without a C compiler runs it (``vertumnus.core.trienode``)."""
    with python_nodes():
        run(PrefixTrie(), ops)


# -- every other store: the same reference, and the memory store side by side ----------

OTHER_STORES = sorted(set(STORES) - {"memory"})
EXAMPLES = {"redis": int(os.environ.get("VERTUMNUS_STORE_EXAMPLES", "100"))}
"""Examples per store: a Redis round trip costs ~100 µs and a checked op makes ~80 of them
(``VERTUMNUS_STORE_EXAMPLES=2000`` for a deeper run)."""


@pytest.mark.parametrize("name", OTHER_STORES)
def test_store_matches_the_reference(name, request):
    make = store_factory(name, request)

    @settings(
        max_examples=EXAMPLES.get(name, 100),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(st.lists(op, max_size=40))
    def check(ops):
        run(make(), ops)

    check()


# Batches of arbitrary items, many of them contradicting the index or each
# other: positions that disagree, first blocks with parents, a key twice, a key
# as its own parent, under clears too.
wild = st.tuples(
    st.just("wild"),
    st.integers(0, 3),  # worker
    st.lists(
        st.tuples(
            st.sampled_from(KEYS), st.integers(0, 5), st.one_of(st.none(), st.sampled_from(KEYS))
        ),
        max_size=5,
    ),
    st.lists(st.sampled_from(KEYS), max_size=3),  # removed
    st.booleans(),  # cleared
)


def state(store, base):
    """Everything the store answers about the small universe; generations are
    taken relative to ``base`` (stores may count from different origins)."""
    blocks = {}
    for k in KEYS:
        b = store.block(k)
        if b is not None:
            blocks[k] = (b.depth, b.parent, b.generation - base, sorted(b.holders))
        else:
            blocks[k] = None
        assert sorted(store.holders(k)) == (blocks[k][3] if b else [])
    return (
        len(store),
        store.cursor,
        blocks,
        {k: sorted(store.children(k)) for k in KEYS},
        sorted(store.workers()),
        {w: sorted(store.worker_keys(w)) for w in range(4)},
        {w: store.worker_block_count(w) for w in range(4)},
        [dict(store.matched_blocks(c)) for c in CHAINS],
        [
            [
                (b.key, b.depth, b.parent, b.generation - base, sorted(b.holders))
                for b in store.path(c)
            ]
            for c in CHAINS
        ],
    )


def origin(store, log):
    """The smallest generation in sight — blocks in the index, blocks gone in
    ``log`` — or None: both stores see the same blocks, so their origins differ
    by exactly the difference between where they count generations from."""
    gens = [b.generation for k in KEYS if (b := store.block(k)) is not None]
    gens += [g for c in log or () for _, g in c.gone]
    return min(gens, default=None)


def logged(changes, base):
    """A change log, with generations relative to ``base`` and the order a drop
    happens to visit blocks in left out."""
    out = []
    for c in changes:
        gone = [(k, g - base) for k, g in c.gone]
        if c.dropped:
            out.append((c.cursor, c.worker, c.stored, sorted(c.removed), sorted(gone), True))
        else:
            out.append((c.cursor, c.worker, c.stored, c.removed, gone, False))
    return out


def apply_op(store, o):
    if o[0] == "drop":
        return store.drop_worker(o[1])
    if o[0] == "wild":
        _, w, items, removed, cleared = o
        return store.apply(w, items, removed, cleared=cleared)
    if o[0] == "store":
        _, w, ci, n, which, with_parents, cleared = o
        return store.apply(w, items_of(CHAINS[ci], n, which, with_parents), cleared=cleared)
    if o[0] == "remove":
        return store.apply(o[1], removed=o[2])
    _, w, key, pos = o
    return store.apply(w, [(key, pos, None)])


def outcome(store, o):
    try:
        return apply_op(store, o)
    except StoreError:
        return "refused"


@pytest.mark.parametrize("name", OTHER_STORES)
def test_store_answers_exactly_like_the_memory_store(name, request):
    """Same answers, generations (up to their origin) and change log as PrefixTrie,
    op by op (log_limit 8, so truncation is compared too)."""
    make = store_factory(name, request)

    @settings(
        max_examples=EXAMPLES.get(name, 100),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(st.lists(st.one_of(op, wild), max_size=30), st.integers(0, 12))
    def check(ops, lag):
        mem, other = PrefixTrie(log_limit=8), make(log_limit=8)
        bases = None  # where each store counts generations from, once one is seen
        for o in ops:
            cursor = mem.cursor
            assert outcome(other, o) == outcome(mem, o), o
            c_mem, log_mem = mem.changes(cursor)
            c_other, log_other = other.changes(cursor)
            if bases is None and origin(mem, log_mem) is not None:
                bases = origin(mem, log_mem), origin(other, log_other)
            b_mem, b_other = bases or (0, 0)
            assert state(other, b_other) == state(mem, b_mem), o
            assert c_other == c_mem and logged(log_other, b_other) == logged(log_mem, b_mem), o
            # A follower further behind: the same truncation point.
            since = max(0, mem.cursor - lag)
            assert (other.changes(since)[1] is None) == (mem.changes(since)[1] is None)

    check()
