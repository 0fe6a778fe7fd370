"""Block keys: the fast token path equals the definition (chained content hashes)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from vertumnus.core.keys import (
    block_content_hash,
    chain_block_hashes,
    mix64,
    remap_keys,
    salt_of,
    token_block_keys,
)


def _definition(tokens: list[int], block_size: int, salt: int = 0) -> tuple[int, ...]:
    blocks = [
        tokens[j : j + block_size] for j in range(0, len(tokens) - block_size + 1, block_size)
    ]
    return chain_block_hashes((block_content_hash(b) for b in blocks), salt)


@pytest.mark.parametrize("length", [0, 1, 15, 16, 17, 100, 511, 512, 513, 528, 529, 4096])
@pytest.mark.parametrize("salt", [0, salt_of("tenant-a")])
def test_token_block_keys_is_the_chain_of_content_hashes(length: int, salt: int) -> None:
    rng = random.Random(length)
    tokens = [rng.randrange(1 << 31) for _ in range(length)]
    want = _definition(tokens, 16, salt)
    assert len(want) == length // 16
    assert token_block_keys(tokens, 16, salt) == want
    # The router hashes an int array of the ids (int64 or a narrower type).
    assert token_block_keys(np.array(tokens, dtype=np.int64), 16, salt) == want
    if length:
        narrow = [t % 30000 for t in tokens]
        assert token_block_keys(np.array(narrow, dtype=np.int32), 16, salt) == _definition(
            narrow, 16, salt
        )


def test_keys_chain_the_whole_prefix() -> None:
    a = list(range(64))
    b = [999] + a[1:]  # differs in the first block only
    ka, kb = token_block_keys(a, 16), token_block_keys(b, 16)
    assert all(x != y for x, y in zip(ka, kb, strict=True))
    assert token_block_keys(a[:32], 16) == ka[:2]
    assert token_block_keys(a, 16, salt_of("x")) != ka


def test_block_size_must_be_positive() -> None:
    with pytest.raises(ValueError, match="block size"):
        token_block_keys([1, 2, 3], 0)


def test_remapped_keys_keep_their_equalities_in_a_space_of_their_own() -> None:
    chains = [chain_block_hashes(range(k)) for k in (3, 5, 8)]  # prefixes of one chain
    salt = salt_of("another key space")
    moved = [remap_keys(c, salt) for c in chains]
    assert [m[:3] for m in moved] == [moved[0]] * 3  # shared prefixes stay shared
    assert len(set(moved[2])) == len(set(chains[2]))
    assert not set(moved[2]) & set(chains[2])
    assert moved[2] == tuple(mix64(k ^ salt) for k in chains[2])
    assert remap_keys((), salt) == ()
