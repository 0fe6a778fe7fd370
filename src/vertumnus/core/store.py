"""The global prefix index as a store: the small protocol every implementation keeps (design.md section 6).

Workers cache prefixes in blocks; each block has a **chained key** (see
:mod:`vertumnus.core.keys`), so a key names its whole prefix and a request's
block chain ``k_1..k_n`` is its path from the root of an implicit trie. The
store answers, per worker, how many leading blocks of a chain it holds, and
keeps what placement and the cache manager need about each block:

- **apply** one worker's event batch — blocks stored (key, position in the
  prefix, parent key when the event carries it) and blocks removed — as one
  atomic step. Events may come per rank, out of order (a child before its
  parent) or twice: the position gives a block's depth, so nothing has to
  arrive parent first, and applying a batch again changes nothing. A batch
  that contradicts the index (a key seen at another position) is refused
  whole, with an error that names the block, and leaves the store unchanged;
- **match** a request's whole chain in one call: per worker the leading
  blocks it holds (:meth:`TrieStore.matched_blocks`, placement's hot path),
  or the matched path with every block's holders (:meth:`TrieStore.path`);
- **holders** of a block, the blocks of a worker, and **drop** a worker;
- a **change cursor**: every applied batch is numbered, and
  :meth:`TrieStore.changes` returns the batches since a cursor, including
  the blocks that left the index, so a follower (the cache manager's
  counters, a second router replica) keeps up without rescanning;
- a **namespace** (pool, model, LoRA/salt): two stores with different
  namespaces never share keys, even on one Redis server.

A block is kept while some worker holds it or it has children (a placeholder
parent learnt from a child's event has no holders until its own event
arrives). A block that leaves the index and comes back is a new incarnation:
its **generation** changes, so per-block state kept elsewhere (the cache
manager's counters, by key and generation) is never carried over by mistake.

Implementations: :class:`vertumnus.core.trie.PrefixTrie` (in process: the
simulator, the local pool, the router's own view) and the router's Redis
store. ``tests/store/`` is the contract suite every implementation passes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass
from typing import NamedTuple, Protocol


class StoredBlock(NamedTuple):
    """One block a worker now holds, as its cache event reports it."""

    key: int
    """Chained key of the block (names the whole prefix up to it)."""
    position: int
    """Index of the block in its prefix, from 0: the block's depth minus one."""
    parent: int | None = None
    """Key of the block at ``position - 1``, when the event carries it (None:
    the first block of a prefix, or not reported)."""


class StoreError(ValueError):
    """An event batch contradicts the index; nothing of it was applied."""


class BlockInfo(Protocol):
    """What the store knows about one block (read-only)."""

    @property
    def key(self) -> int: ...

    @property
    def depth(self) -> int:
        """Blocks on the root→block path, the block included (position + 1)."""
        ...

    @property
    def parent(self) -> int | None:
        """The parent block's key (None: a first block, or not known yet)."""
        ...

    @property
    def holders(self) -> Set[int]:
        """Workers holding this block (and, by the chained keys, its prefix)."""
        ...

    @property
    def generation(self) -> int:
        """Incarnation of the key in this store: changes when it leaves and comes back."""
        ...


@dataclass(frozen=True, slots=True)
class Change:
    """One applied event batch, as the change log records it."""

    cursor: int
    """Position of this change in the log (the store's cursor right after it)."""
    worker: int
    stored: tuple[int, ...]
    """Keys ``worker`` holds now and did not before."""
    removed: tuple[int, ...]
    """Keys ``worker`` held before and does not now."""
    gone: tuple[tuple[int, int], ...] = ()
    """(key, generation) of blocks that left the index with this change."""
    dropped: bool = False
    """The worker was dropped whole (left the pool or cleared its cache)."""


class TrieStore(Protocol):
    """The global prefix index; see the module docstring for the contract."""

    @property
    def namespace(self) -> str: ...

    @property
    def cursor(self) -> int:
        """Changes applied so far (0 for an empty store)."""
        ...

    def apply(
        self,
        worker: int,
        stored: Iterable[StoredBlock | tuple[int, int, int | None]] = (),
        removed: Iterable[int] = (),
        *,
        cleared: bool = False,
    ) -> int:
        """Apply one event batch of ``worker`` atomically; returns the new cursor.

        ``cleared``: the worker's cache was cleared before these events (all
        its blocks leave first). Raises :class:`StoreError` without changing
        anything if the batch contradicts the index.
        """
        ...

    def drop_worker(self, worker: int) -> int:
        """Forget every block ``worker`` holds (it left the pool); the new cursor."""
        ...

    def matched_blocks(self, keys: Sequence[int]) -> Mapping[int, int]:
        """Per worker, how many leading blocks of the chain ``keys`` it holds."""
        ...

    def path(self, keys: Sequence[int]) -> Sequence[BlockInfo]:
        """MatchedPath: the blocks of the longest prefix of ``keys`` in the index,
        whoever holds them, root first."""
        ...

    def block(self, key: int | None) -> BlockInfo | None:
        """The block ``key`` (None if it is not in the index, or ``key`` is None)."""
        ...

    def children(self, key: int) -> Set[int]:
        """Keys of the blocks whose parent is ``key``."""
        ...

    def holders(self, key: int) -> Set[int]:
        """Workers holding ``key`` (empty if none)."""
        ...

    def worker_keys(self, worker: int) -> Set[int]:
        """Every block ``worker`` holds."""
        ...

    def worker_block_count(self, worker: int) -> int:
        """How many blocks ``worker`` holds: ``len(worker_keys(worker))`` without listing
        them (kept as the index changes, not counted by a scan)."""
        ...

    def workers(self) -> Set[int]:
        """Workers holding at least one block."""
        ...

    def changes(self, since: int) -> tuple[int, Sequence[Change] | None]:
        """The cursor now and the changes after ``since``, oldest first; None
        instead of the changes when the log no longer reaches back that far
        (the follower must resynchronise from the store itself)."""
        ...

    def __len__(self) -> int:
        """Blocks in the index."""
        ...


def prefix_of(store: TrieStore, key: int) -> tuple[int, ...] | None:
    """The root→``key`` chain of keys, root first, following parents (None if a
    parent on the way is not known)."""
    out: list[int] = []
    info = store.block(key)
    while info is not None:
        out.append(info.key)
        if info.depth == 1:
            out.reverse()
            return tuple(out)
        info = store.block(info.parent)
    return None
