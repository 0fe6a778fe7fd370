"""``scale_lengths``: the scaled trace that both ``simulate`` and ``load`` use."""

from __future__ import annotations

import pytest

from vertumnus.core.keys import token_block_keys
from vertumnus.core.types import Request
from vertumnus.loadgen import request_tokens
from vertumnus.sim.traces import Trace, scale_lengths


def _trace() -> Trace:
    shared = (11, 12, 13)
    reqs = [
        Request(0, 0.0, 1500, shared + (20,)),  # 3 full 512-blocks + a partial one
        Request(1, 1.0, 2048, shared + (21,)),  # shares 3 blocks with request 0
        Request(2, 2.0, 100, (30,)),  # shorter than one block
        Request(3, 3.0, 9000, tuple(range(40, 58))),
    ]
    return Trace("t", tuple(reqs), 512)


def test_lengths_blocks_and_full_block_keys() -> None:
    t = scale_lengths(_trace(), 1 / 32, max_tokens=256)
    assert t.block_size == 16
    assert [r.length for r in t.requests] == [47, 64, 3, 256]
    # Only full blocks keep keys: 47 tokens = 2 full 16-token blocks.
    assert [r.block_keys for r in t.requests] == [
        (11, 12),
        (11, 12, 13, 21),
        (),
        tuple(range(40, 56)),
    ]
    assert [r.arrival_s for r in t.requests] == [0.0, 1.0, 2.0, 3.0]


def test_the_tokens_sent_share_exactly_the_blocks_the_simulator_shares() -> None:
    t = scale_lengths(_trace(), 1 / 32)
    memo: dict[int, list[int]] = {}
    toks = [request_tokens(r, t.block_size, 1.0, 256, 8192, memo) for r in t.requests]
    assert [len(x) for x in toks] == [r.length for r in t.requests]
    engine_keys = [token_block_keys(x, t.block_size) for x in toks]
    for r, k in zip(t.requests, engine_keys, strict=True):
        assert len(k) == len(r.block_keys)  # the engine's full blocks = the keys kept
    for a in range(len(t.requests)):
        for b in range(len(t.requests)):
            ka, kb = t.requests[a].block_keys, t.requests[b].block_keys
            shared_trace = next(
                (i for i, (x, y) in enumerate(zip(ka, kb, strict=False)) if x != y),
                min(len(ka), len(kb)),
            )
            ea, eb = engine_keys[a], engine_keys[b]
            shared_engine = next(
                (i for i, (x, y) in enumerate(zip(ea, eb, strict=False)) if x != y),
                min(len(ea), len(eb)),
            )
            assert shared_trace == shared_engine, (a, b)


def test_identity_and_bad_values() -> None:
    tr = _trace()
    assert scale_lengths(tr, 1.0) is tr
    with pytest.raises(ValueError, match="length scale"):
        scale_lengths(tr, 0)
    with pytest.raises(ValueError, match="max_tokens"):
        scale_lengths(tr, 0.5, max_tokens=0)
