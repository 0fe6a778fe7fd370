"""In-flight prefixes: placement sees what queued requests will leave cached."""

from hypothesis import given
from hypothesis import strategies as st

from vertumnus.core.inflight import InflightPrefixes, merge_matches
from vertumnus.core.keys import chain_block_hashes
from vertumnus.core.policies.vertumnus import CostModelPolicy
from vertumnus.core.types import Composition, Request
from vertumnus.sim.engine import PoolConfig, Simulation


def test_matched_blocks_per_worker_and_refcounts():
    idx = InflightPrefixes()
    idx.add(1, 0, (10, 11, 12))
    idx.add(2, 0, (10, 11))
    idx.add(3, 1, (10,))
    assert idx.matched_blocks((10, 11, 12, 13)) == {0: 3, 1: 1}
    idx.remove(1)
    assert idx.matched_blocks((10, 11, 12)) == {0: 2, 1: 1}
    idx.remove(2)
    idx.remove(3)
    assert idx.matched_blocks((10,)) == {} and len(idx) == 0
    idx.remove(99)  # unknown ids are ignored


def test_replacing_a_request_moves_it():
    idx = InflightPrefixes()
    idx.add(1, 0, (10, 11))
    idx.add(1, 2, (10, 11))  # drained and re-placed on worker 2
    assert idx.matched_blocks((10, 11)) == {2: 2}


def test_merge_takes_the_longer_match():
    assert merge_matches({0: 2, 1: 5}, {0: 4, 2: 1}) == {0: 4, 1: 5, 2: 1}
    assert merge_matches(None, {}) == {}


@given(
    st.lists(
        st.tuples(
            st.integers(0, 30),
            st.integers(0, 3),
            st.lists(st.integers(0, 4), min_size=1, max_size=5),
        ),
        max_size=40,
    )
)
def test_matches_a_naive_reference(ops):
    idx = InflightPrefixes()
    live: dict[int, tuple[int, tuple[int, ...]]] = {}
    for rid, worker, raw in ops:
        keys = chain_block_hashes(raw)
        if rid in live and rid % 2:
            idx.remove(rid)
            del live[rid]
        else:
            idx.add(rid, worker, keys)
            live[rid] = (worker, keys)
        probe = keys
        expect: dict[int, int] = {}
        for w, ks in live.values():
            n = 0
            while n < min(len(ks), len(probe)) and ks[n] == probe[n]:
                n += 1
            if n:
                expect[w] = max(expect.get(w, 0), n)
        assert idx.matched_blocks(probe) == expect


def test_next_turn_follows_its_queued_predecessor(model):
    """Turn 2 arrives while turn 1 is still queued: it must join turn 1's worker
    and reuse its prefix, not recompute it on an idle worker."""
    busy = Request(0, 0.0, 60000, chain_block_hashes(range(1000, 1118)))
    busy2 = Request(1, 0.0, 60000, chain_block_hashes(range(2000, 2118)))
    turn1 = Request(2, 0.01, 30000, chain_block_hashes(range(59)))
    turn2 = Request(3, 0.02, 30720, chain_block_hashes(list(range(59)) + [7777]))
    pool = PoolConfig(Composition.parse("2xCP2"), model, t_ext_s=0.0)
    sim = Simulation(pool, CostModelPolicy())
    res = sim.run([busy, busy2, turn1, turn2])
    by_id = {c.request_id: c for c in res.completions}
    assert by_id[3].worker == by_id[2].worker
    assert by_id[3].cached_tokens == min(59 * 512, 30720 - 1)
    assert len(sim.core.inflight) == 0
