"""Synthetic shared prefixes for traces without prefix information (sim/prefixes.py)."""

from __future__ import annotations

import pytest

from vertumnus.core.keys import chain_block_hashes
from vertumnus.core.types import Request
from vertumnus.sim.prefixes import PrefixOptions, parse_prefix_options, with_prefixes
from vertumnus.sim.synthetic import token_hit_rate
from vertumnus.sim.traces import Trace


def azure_like(n: int = 400) -> Trace:
    """Unique blocks per request, as load_azure makes them."""
    reqs, next_id = [], 0
    for i in range(n):
        length = 600 + (i * 977) % 6000
        nb = -(-length // 512)
        reqs.append(
            Request(i, 0.5 * i, length, chain_block_hashes(range(next_id, next_id + nb)), 7)
        )
        next_id += nb
    return Trace("azure-like", tuple(reqs), 512)


def test_prefixes_share_leading_blocks_and_keep_arrivals_and_lengths():
    src = azure_like()
    out = with_prefixes(src, PrefixOptions(n=4, median=1500, share=1.0), seed=3)
    assert token_hit_rate(src) == 0.0
    assert token_hit_rate(out) > 0.2
    for a, b in zip(src.requests, out.requests, strict=True):
        assert (a.id, a.arrival_s, a.length, a.output_length) == (
            b.id,
            b.arrival_s,
            b.length,
            b.output_length,
        )
        assert len(b.block_keys) == len(a.block_keys)
    firsts = {r.block_keys[0] for r in out.requests if len(r.block_keys) > 1}
    assert 1 <= len(firsts) <= 4  # every multi-block request starts with one of the 4 prompts
    # A request's last block is always its own: never two requests with the same whole key list.
    assert len({r.block_keys for r in out.requests}) == len(out.requests)


def test_prefixes_are_seeded_and_share_zero_changes_nothing_shared():
    src = azure_like()
    a = with_prefixes(src, PrefixOptions(), seed=1)
    assert a.requests == with_prefixes(src, PrefixOptions(), seed=1).requests
    assert a.requests != with_prefixes(src, PrefixOptions(), seed=2).requests
    none = with_prefixes(src, PrefixOptions(share=0.0), seed=1)
    assert token_hit_rate(none) == 0.0


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("n=0", "n must be >= 1"),
        ("share=2", "share must be in"),
        ("median=abc", "median='abc' is not a number"),
        ("colour=red", "bad item 'colour=red'"),
        ("n", "bad item 'n'"),
    ],
)
def test_bad_prefix_options_name_the_problem(text, message):
    with pytest.raises(ValueError, match=message):
        parse_prefix_options(text)


def test_empty_options_are_the_defaults():
    assert parse_prefix_options("") == PrefixOptions()
    assert parse_prefix_options("n=8, zipf=0.5") == PrefixOptions(n=8, zipf=0.5)
