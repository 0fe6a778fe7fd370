"""Block keys of a token sequence: how the engine names cacheable prefixes.

A block is ``block_size`` consecutive tokens. Its content hash is BLAKE2b-64
of the token ids (little-endian int64), and the chained key of block j
(:func:`vertumnus.core.types.chain_block_hashes`) identifies the whole prefix
up to and including it. Only full blocks get keys: a partial tail block is
never cached. The router must hash the same way to match what cache events
report; this module is the definition.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

from vertumnus.core.types import chain_block_hashes


def block_content_hash(tokens: Sequence[int]) -> int:
    data = struct.pack(f"<{len(tokens)}q", *tokens)
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def block_keys(tokens: Sequence[int], block_size: int) -> tuple[int, ...]:
    """Chained keys of the full blocks of ``tokens`` (a partial tail gets none)."""
    full = len(tokens) // block_size
    return chain_block_hashes(
        block_content_hash(tokens[j * block_size : (j + 1) * block_size]) for j in range(full)
    )


def block_owner(position: int, degree: int) -> int:
    """Rank (within its worker) that keeps block ``position`` of a prefix.

    The cached prefix is partitioned round-robin over the worker's ranks, so
    each rank holds ~1/C of every prefix and a split keeps half of each
    prefix on each child (see docs/worker.md, "KV layout").
    """
    return position % degree
