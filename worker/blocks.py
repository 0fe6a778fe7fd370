"""Block keys of a token sequence: how the engine names cacheable prefixes.

A block is ``block_size`` consecutive tokens. Its content hash is BLAKE2b-64
of the token ids (little-endian int64), and the chained key of block j
(:mod:`vertumnus.core.keys`) identifies the whole prefix
up to and including it. Only full blocks get keys: a partial tail block is
never cached. The router must hash the same way to match what cache events
report: the definition lives in :mod:`vertumnus.core.keys`, which the
router and the simulator use too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from vertumnus.core.keys import block_content_hash, token_block_keys

__all__ = ["Block", "block_content_hash", "block_keys", "block_owner"]


class Block(NamedTuple):
    """A cached block: its chained key, its position in the prefix, its parent's key.

    ``parent`` is the key at ``position - 1`` of the same prefix, None at
    position 0 (a root block has no parent): what a router needs to hang the
    block in its trie.
    """

    key: int
    position: int
    parent: int | None


def block_keys(tokens: Sequence[int], block_size: int) -> tuple[int, ...]:
    """Chained keys of the full blocks of ``tokens`` (a partial tail gets none)."""
    return token_block_keys(tokens, block_size)


def block_owner(position: int, degree: int) -> int:
    """Rank (within its worker) that keeps block ``position`` of a prefix.

    The cached prefix is partitioned round-robin over the worker's ranks, so
    each rank holds ~1/C of every prefix and a split keeps half of each
    prefix on each child (see docs/worker.md, "KV layout").
    """
    return position % degree
