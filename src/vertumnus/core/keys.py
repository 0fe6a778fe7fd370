"""Block keys: how every part of Vertumnus names a cacheable prefix (one module, one definition).

A **block** is ``block_size`` consecutive tokens of a prompt. Its **content
hash** is BLAKE2b-64 of the token ids (little-endian int64), and the
**chained key** of block j folds in the key of block j−1:

    key_0 = mix(salt ⊕ mix(h_0)),   key_j = mix(key_{j−1} ⊕ mix(h_j))

(``mix`` is the SplitMix64 finalizer; ``salt`` is 0 unless a namespace is
asked for), so equal keys mean equal prefixes — as in vLLM's and SGLang's
block hashing — and a request's keys are its path in the implicit prefix
trie of :mod:`vertumnus.core.store`. Only full blocks get keys: a partial
tail block is never cached.

The **salt** separates key spaces that must never share cache entries: a
LoRA adapter, a tenant's cache salt (SGLang's ``extra_key``). Salt 0 is the
plain key space.

Deterministic across processes and platforms (no use of Python's ``hash``),
so keys can be stored in Redis and compared between the router, the workers
and the simulator. :func:`chain_many` is the vectorised twin the trace
loaders use (bit-identical, ~10x faster over many requests).
"""

from __future__ import annotations

import hashlib
import itertools
import struct
from collections.abc import Iterable, Sequence

import numpy as np

__all__ = [
    "block_content_hash",
    "chain_block_hashes",
    "chain_many",
    "mix64",
    "mix64_array",
    "remap_keys",
    "salt_of",
    "token_block_keys",
]

_MASK64 = (1 << 64) - 1


def mix64(x: int) -> int:
    """SplitMix64 finalizer: a cheap, well-spread, platform-independent hash."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def _seed(salt: int) -> int:
    return mix64(salt & _MASK64) if salt else 0


def chain_block_hashes(block_hashes: Iterable[int], salt: int = 0) -> tuple[int, ...]:
    """Turn per-block content hashes into chained prefix keys.

    Key k identifies the whole prefix h_1..h_k (in the key space of
    ``salt``), so two requests share a cached block only if they share
    everything before it too.
    """
    keys = []
    prev = _seed(salt)
    for h in block_hashes:
        prev = mix64(prev ^ mix64(h & _MASK64))
        keys.append(prev)
    return tuple(keys)


def block_content_hash(tokens: Sequence[int]) -> int:
    """BLAKE2b-64 of the token ids of one block (little-endian int64)."""
    data = struct.pack(f"<{len(tokens)}q", *tokens)
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def token_block_keys(
    tokens: Sequence[int] | np.ndarray, block_size: int, salt: int = 0
) -> tuple[int, ...]:
    """Chained keys of the full blocks of ``tokens`` (a partial tail gets none).

    The same keys as chaining :func:`block_content_hash` of each block, computed
    the way a router on the request path can afford for long prompts: the ids
    are packed once (not once per block; an int64 array without a copy), the
    content hashes' first mix runs as one array operation, and only the chain
    itself stays a Python loop — about 3.7x faster at 8K tokens.
    """
    if block_size < 1:
        raise ValueError(f"block size must be >= 1, got {block_size}")
    full = len(tokens) // block_size
    if full == 0:
        return ()
    n = full * block_size
    if isinstance(tokens, np.ndarray):
        data = memoryview(tokens[:n].astype("<i8", copy=False).tobytes())
    else:
        data = memoryview(struct.pack(f"<{n}q", *tokens[:n]))
    step = 8 * block_size
    blake, from_bytes = hashlib.blake2b, int.from_bytes
    hashes = [
        from_bytes(blake(data[o : o + step], digest_size=8).digest(), "little")
        for o in range(0, n * 8, step)
    ]
    # The hashes' first mix as one array operation pays off from a few dozen blocks.
    mixed = mix64_array(np.array(hashes, dtype=np.uint64)).tolist() if full > 32 else None
    keys = []
    prev = _seed(salt)
    for j, h in enumerate(hashes):
        prev = mix64(prev ^ (mixed[j] if mixed is not None else mix64(h)))
        keys.append(prev)
    return tuple(keys)


def salt_of(namespace: str) -> int:
    """A 64-bit salt for a key-space name (a LoRA adapter, a cache salt); "" → 0."""
    if not namespace:
        return 0
    return int.from_bytes(hashlib.blake2b(namespace.encode(), digest_size=8).digest(), "little")


# -- vectorised ----------------------------------------------------------------

_C_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_C_MUL1 = np.uint64(0xBF58476D1CE4E5B9)
_C_MUL2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)


def mix64_array(x: np.ndarray) -> np.ndarray:
    """:func:`mix64` on a uint64 array, bit-identical.

    Array arithmetic on uint64 wraps modulo 2**64 without warnings, which is
    exactly the ``& _MASK64`` the scalar version does.
    """
    x = x + _C_GOLDEN
    x = (x ^ (x >> _S30)) * _C_MUL1
    x = (x ^ (x >> _S27)) * _C_MUL2
    return x ^ (x >> _S31)


def remap_keys(keys: tuple[int, ...], salt: int) -> tuple[int, ...]:
    """``keys`` moved into another key space: ``mix64(key ^ salt)``, a bijection, so
    equal keys stay equal and distinct ones distinct (a trace's prefix reuse survives
    the move, and none of it is shared with the keys it came from).

    Take ``salt`` from :func:`salt_of` (a hash of a name), not from ``mix64`` of a
    small number: a chained key is ``mix64(parent ^ mix64(block))``, so with the salt
    ``mix64(c)`` a key became the key of its own child wherever a block id equalled
    ``c`` (traces number their blocks 0, 1, 2, ...) and one key stood at two positions.
    """
    if not keys:
        return keys
    return tuple(mix64_array(np.array(keys, dtype=np.uint64) ^ np.uint64(salt)).tolist())


def chain_many(hash_lists: Sequence[Sequence[int]], salt: int = 0) -> list[tuple[int, ...]]:
    """``[chain_block_hashes(h, salt) for h in hash_lists]``, about 10x faster.

    The chain is sequential within a request, but independent across
    requests, so all requests advance one block position at a time with
    numpy. The Mooncake conversation trace has ~290K blocks; the scalar
    version spends half a second on them, this one a few tens of ms.
    """
    n = len(hash_lists)
    if n == 0:
        return []
    lens = np.fromiter((len(h) for h in hash_lists), dtype=np.int64, count=n)
    total = int(lens.sum())
    try:
        flat = np.fromiter(itertools.chain.from_iterable(hash_lists), dtype=np.uint64, count=total)
    except (OverflowError, ValueError):
        # Negative or > 64-bit ids: reduce them as chain_block_hashes does.
        flat = np.fromiter(
            (h & _MASK64 for h in itertools.chain.from_iterable(hash_lists)),
            dtype=np.uint64,
            count=total,
        )
    mixed = mix64_array(flat)
    starts = np.zeros(n, dtype=np.int64)
    np.cumsum(lens[:-1], out=starts[1:])
    # Longest first, so the requests still active at position k are a prefix.
    order = np.argsort(-lens, kind="stable")
    sorted_lens = lens[order]
    sorted_starts = starts[order]
    prev = np.full(n, _seed(salt), dtype=np.uint64)
    keys = np.empty(total, dtype=np.uint64)
    max_len = int(sorted_lens[0])
    # active[k] = number of requests with more than k blocks.
    active = np.searchsorted(-sorted_lens, -np.arange(max_len), side="left")
    for k in range(max_len):
        m = int(active[k])
        pos = sorted_starts[:m] + k
        cur = mix64_array(prev[:m] ^ mixed[pos])
        prev[:m] = cur
        keys[pos] = cur
    key_list = keys.tolist()
    return [
        tuple(key_list[s : s + ln]) for s, ln in zip(starts.tolist(), lens.tolist(), strict=True)
    ]
