"""The prefix index's node in pure Python: the twin of the compiled ``_trienode``.

:mod:`vertumnus.core.trie` uses the compiled node where the build produced it
(``trie.UNTRACKED``): that one is kept out of Python's cyclic garbage
collector, which this class cannot be (``_trienode.c`` says why it matters).
Same attributes, constructor and repr; ``tests/store/`` runs the index on both.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TypeVar

__all__ = ["TrieNode", "python_nodes", "untrack"]

_T = TypeVar("_T")


class TrieNode:
    """One block of the index (a :class:`~vertumnus.core.store.BlockInfo`).

    Read-only outside :mod:`vertumnus.core.trie`: the store changes it only
    through :meth:`~vertumnus.core.trie.PrefixTrie.apply` and
    :meth:`~vertumnus.core.trie.PrefixTrie.drop_worker`.
    """

    __slots__ = ("key", "depth", "parent", "children", "holders", "generation")

    def __init__(self, key: int, depth: int, parent: int | None, generation: int) -> None:
        self.key = key
        self.depth = depth
        """Blocks on the root→z path, z included (the prefix length in blocks)."""
        self.parent = parent
        """The parent's key; None for a first block or while not known."""
        self.children: int | set[int] | None = None
        """The children's keys: None for none, the key alone for one (most blocks: a
        conversation's chain), a set from the second on (one object less per block for
        the collector where it walks the index); read through
        :meth:`~vertumnus.core.trie.PrefixTrie.children`."""
        self.holders: set[int] = set()
        self.generation = generation

    def __repr__(self) -> str:
        return f"TrieNode(depth={self.depth}, holders={sorted(self.holders)})"


def untrack(obj: _T) -> _T:
    """``obj`` itself: pure Python cannot take an object out of the collector."""
    return obj


@contextlib.contextmanager
def python_nodes() -> Iterator[None]:
    """Indexes built meanwhile use this module's node, as a build without a C compiler
    does: to compare the two (``bench/gc_pause.py --node python``, ``tests/store/``).
    Not for serving; not thread-safe."""
    from vertumnus.core import trie

    saved = trie.TrieNode, trie._untrack
    trie.TrieNode, trie._untrack = TrieNode, untrack  # type: ignore[assignment,misc]
    try:
        yield
    finally:
        trie.TrieNode, trie._untrack = saved  # type: ignore[misc]
