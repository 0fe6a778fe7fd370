"""The in-process prefix index: a :class:`~vertumnus.core.store.TrieStore` in a dict.

Node z is one cache block; the root→z path is the prefix ending at z. A
worker is a **holder** of z when it caches the block z (with chained keys,
holding a block means holding a copy of its whole prefix's content up to it;
whether it holds every ancestor is what :meth:`PrefixTrie.matched_blocks`
checks by walking the request's own chain). Answers for an arriving request
take O(blocks in the request + holders on the path), never O(trie).

Used by the simulator, the local pool and, as its own view, the router (which
mirrors a Redis store into one of these). The contract it keeps is in
:mod:`vertumnus.core.store`; ``tests/store/`` checks it.

Its nodes and their sets are kept out of Python's cyclic garbage collector
(:data:`UNTRACKED`): they can form no reference cycle, and a full collection
that walked a million of them would stop the router for a quarter of a second
(``bench/gc_pause.py``). The node is compiled (``_trienode.c``), with a
pure-Python twin (:mod:`vertumnus.core.trienode`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence, Set
from itertools import takewhile
from typing import cast

from vertumnus.core.store import BlockInfo, Change, StoredBlock, StoreError

__all__ = ["UNTRACKED", "PrefixTrie", "TrieNode"]

_EMPTY: frozenset[int] = frozenset()

# A node refers only to ints, None and sets of ints (parents and children are
# named by key), and a logged Change only to ints and tuples of them, so no cycle
# can pass through either and reference counting frees them at once: the cyclic
# collector has nothing to find in the index, and walking it is pure cost. The
# compiled node is a type the collector does not know, and the sets and changes
# are untracked, so a full collection skips the index (_trienode.c). Keep it so:
# neither may ever refer to an object that can refer back (a cycle through it
# would leak).
UNTRACKED: bool
"""The index's nodes and sets are outside the collector (the compiled node was built)."""
try:
    from vertumnus.core._trienode import TrieNode
    from vertumnus.core._trienode import untrack as _untrack
except ImportError:  # built without a C compiler: the same index, walked by the collector
    from vertumnus.core.trienode import TrieNode  # type: ignore[assignment]
    from vertumnus.core.trienode import untrack as _untrack

    UNTRACKED = False
else:
    UNTRACKED = True


class PrefixTrie:
    """Global index of cached prefixes across workers, in process memory.

    ``log_limit`` bounds the change log (:meth:`changes`): a follower more
    than that many changes behind must resynchronise.
    """

    __slots__ = (
        "_nodes",
        "_namespace",
        "_log",
        "_log_base",
        "_next_generation",
        "_log_limit",
        "_held",
        "block",
    )

    def __init__(self, namespace: str = "default", log_limit: int = 65536) -> None:
        if log_limit < 1:
            raise ValueError(f"log_limit must be >= 1, got {log_limit}")
        self._nodes: dict[int, TrieNode] = {}
        self.block: Callable[[int | None], TrieNode | None] = self._nodes.get  # type: ignore[assignment]
        """The block ``key`` (None if absent or ``key`` is None): the dict's own ``get``,
        since the cache manager's scans call it for every pair they rank."""
        self._namespace = namespace
        self._log: list[Change] = []
        self._log_base = 0
        """Cursor of the change just before ``_log[0]``."""
        self._log_limit = log_limit
        self._next_generation = 1
        self._held: dict[int, int] = {}
        """Worker → how many blocks it holds, kept with each change (a router's GetPool
        reports it for every worker every few seconds; counting by a scan of the index
        cost O(workers × blocks) each time)."""

    @property
    def namespace(self) -> str:
        return self._namespace

    @property
    def cursor(self) -> int:
        return self._log_base + len(self._log)

    def __len__(self) -> int:
        return len(self._nodes)

    # -- events ---------------------------------------------------------------

    def apply(
        self,
        worker: int,
        stored: Iterable[StoredBlock | tuple[int, int, int | None]] = (),
        removed: Iterable[int] = (),
        *,
        cleared: bool = False,
    ) -> int:
        """Apply one event batch of ``worker`` atomically (see :class:`~vertumnus.core.store.TrieStore`)."""
        items = stored if isinstance(stored, list) else list(stored)
        gone: list[tuple[int, int]] = []
        removed_keys: list[int] = []
        if cleared:
            # The clear comes first, so blocks may come back at other positions;
            # check the whole batch against the index as it will be before
            # dropping anything (a refused batch must leave no trace).
            self._check_after_clear(worker, items)
            removed_keys.extend(self._drop(worker, gone))
        new = self._store(worker, items) if items else []
        for key in removed:
            if self._remove(worker, key, gone):
                removed_keys.append(key)
        return self._record(worker, new, removed_keys, gone, dropped=cleared)

    def drop_worker(self, worker: int) -> int:
        """Forget everything ``worker`` held (it left the pool or lost its cache)."""
        gone: list[tuple[int, int]] = []
        removed = self._drop(worker, gone)
        return self._record(worker, [], removed, gone, dropped=True)

    def _store(self, worker: int, items: Sequence[tuple[int, int, int | None]]) -> list[int]:
        """Store the blocks, checking each against the index on the way; on a
        contradiction, undo the batch's changes and raise :class:`StoreError`.

        One pass does both: a block created earlier in the same batch is in the
        index by the time a later item names it, so the batch is checked
        against itself too.
        """
        nodes = self._nodes
        get = nodes.get
        new: list[int] = []
        created: list[int] = []
        linked: list[TrieNode] = []
        gen = self._next_generation
        try:
            for key, position, parent in items:
                node = get(key)
                if node is None:
                    if position < 0 or (position == 0 and parent is not None):
                        raise self._refusal(worker, key, position, parent)
                    node = nodes[key] = TrieNode(key, position + 1, parent, gen)
                    gen += 1
                    created.append(key)
                    if parent is not None:
                        pnode = get(parent)
                        if pnode is None:
                            # A placeholder until the parent's own event arrives:
                            # it has a child, so it stays; no holder: matches nobody.
                            pnode = nodes[parent] = TrieNode(parent, position, None, gen)
                            gen += 1
                            created.append(parent)
                        elif pnode.depth != position:
                            raise self._refusal(worker, key, position, parent)
                        _adopt(pnode, key)
                else:
                    if node.depth != position + 1 or (position == 0 and parent is not None):
                        raise self._refusal(worker, key, position, parent)
                    if parent is not None and node.parent != parent:
                        if node.parent is not None:
                            raise self._refusal(worker, key, position, parent)
                        # Learnt now (a per-rank event without parents came first).
                        pnode = get(parent)
                        if pnode is None:
                            pnode = nodes[parent] = TrieNode(parent, position, None, gen)
                            gen += 1
                            created.append(parent)
                        elif pnode.depth != position:
                            raise self._refusal(worker, key, position, parent)
                        node.parent = parent
                        _adopt(pnode, key)
                        linked.append(node)
                holders = node.holders
                if worker not in holders:
                    holders.add(worker)
                    new.append(key)
        except StoreError:
            self._undo(worker, new, created, linked)
            raise
        self._next_generation = gen
        return new

    def _undo(
        self, worker: int, new: list[int], created: list[int], linked: list[TrieNode]
    ) -> None:
        """Take back what a refused batch changed, newest first."""
        nodes = self._nodes
        for key in new:
            nodes[key].holders.discard(worker)
        for node in linked:
            parent = nodes.get(cast(int, node.parent))
            if parent is not None:
                _disown(parent, node.key)
            node.parent = None
        for key in reversed(created):
            node = nodes.pop(key)
            parent = nodes.get(node.parent) if node.parent is not None else None
            if parent is not None:
                _disown(parent, key)

    def _refusal(self, worker: int, key: int, position: int, parent: int | None) -> StoreError:
        """The :class:`StoreError` that names what is wrong with one item."""
        where = f"worker {worker}: block {key:#x} at position {position}"
        if position < 0:
            return StoreError(f"worker {worker}: block {key:#x} has negative position {position}")
        if position == 0 and parent is not None:
            return StoreError(f"{where} cannot have a parent ({parent:#x})")
        node = self._nodes.get(key)
        if node is not None and node.depth != position + 1:
            return StoreError(f"{where}, but the index has it at position {node.depth - 1}")
        if node is not None and node.parent is not None and node.parent != parent:
            return StoreError(f"{where} names parent {parent:#x}, the index has {node.parent:#x}")
        pnode = self._nodes.get(parent) if parent is not None else None
        depth = "?" if pnode is None else pnode.depth - 1
        return StoreError(
            f"{where} names parent {parent:#x}, which the index has at position {depth}"
        )

    def _check_after_clear(self, worker: int, items: Sequence[tuple[int, int, int | None]]) -> None:
        """Check a cleared batch against the index as it will be once ``worker``'s
        blocks are dropped, without changing anything (a refused batch leaves no trace).

        The same checks as :meth:`_store`, in the same order, on an overlay of
        (depth, parent) per block: what the batch would create or link.
        """
        doomed = self._doomed(worker)
        nodes = self._nodes
        overlay: dict[int, tuple[int, int | None]] = {}

        def get(key: int) -> tuple[int, int | None] | None:
            if key in overlay:
                return overlay[key]
            node = None if key in doomed else nodes.get(key)
            return None if node is None else (node.depth, node.parent)

        for key, position, parent in items:
            cur = get(key)
            bad = position < 0 or (position == 0 and parent is not None)
            link = False
            if not bad and cur is None:
                overlay[key] = (position + 1, parent)
                link = parent is not None
            elif not bad and cur is not None:
                depth, have = cur
                bad = depth != position + 1 or (parent is not None and have not in (None, parent))
                if not bad and parent is not None and have is None:
                    overlay[key] = (depth, parent)
                    link = True
            if link:
                assert parent is not None
                p = get(parent)
                if p is None:
                    overlay[parent] = (position, None)
                elif p[0] != position:
                    bad = True
            if bad:
                raise StoreError(
                    f"worker {worker}: block {key:#x} at position {position}"
                    + (f" (parent {parent:#x})" if parent is not None else "")
                    + " contradicts the index or the rest of the batch"
                )

    def _doomed(self, worker: int) -> set[int]:
        """The blocks that dropping ``worker`` removes from the index: held by it
        alone, with no child that stays."""
        nodes = self._nodes
        candidates = sorted(
            (node for node in nodes.values() if node.holders and node.holders <= {worker}),
            key=lambda n: -n.depth,
        )
        doomed: set[int] = set()
        for node in candidates:  # deepest first: children are decided before parents
            if _all_in(node, doomed):
                doomed.add(node.key)
                # A placeholder ancestor whose last child goes, goes too.
                parent = nodes.get(node.parent) if node.parent is not None else None
                while (
                    parent is not None
                    and not parent.holders
                    and _all_in(parent, doomed)
                    and parent.key not in doomed
                ):
                    doomed.add(parent.key)
                    parent = nodes.get(parent.parent) if parent.parent is not None else None
        return doomed

    def _remove(self, worker: int, key: int, gone: list[tuple[int, int]]) -> bool:
        node = self._nodes.get(key)
        if node is None or worker not in node.holders:
            return False
        node.holders.discard(worker)
        if not node.holders and node.children is None:
            self._prune(node, gone)
        return True

    def _drop(self, worker: int, gone: list[tuple[int, int]]) -> list[int]:
        keys = [k for k, node in self._nodes.items() if worker in node.holders]
        nodes = self._nodes
        for key in keys:
            nodes[key].holders.discard(worker)
        for key in keys:
            node = nodes.get(key)
            if node is not None:
                self._prune(node, gone)
        return keys

    def _prune(self, node: TrieNode | None, gone: list[tuple[int, int]]) -> None:
        nodes = self._nodes
        while node is not None and not node.holders and node.children is None and node.key in nodes:
            del nodes[node.key]
            gone.append((node.key, node.generation))
            parent = nodes.get(node.parent) if node.parent is not None else None
            if parent is not None:
                _disown(parent, node.key)
            node = parent

    def _record(
        self,
        worker: int,
        stored: list[int],
        removed: list[int],
        gone: list[tuple[int, int]],
        dropped: bool,
    ) -> int:
        if not (stored or removed or gone or dropped):
            return self.cursor
        held = self._held.get(worker, 0) + len(stored) - len(removed)
        if held:
            self._held[worker] = held
        else:
            self._held.pop(worker, None)
        log = self._log
        # Ints and tuples of ints only, like a node: out of the collector's walks too
        # (the log holds up to log_limit of them).
        log.append(
            _untrack(
                Change(self.cursor + 1, worker, tuple(stored), tuple(removed), tuple(gone), dropped)
            )
        )
        if len(log) > self._log_limit:
            cut = len(log) - self._log_limit
            del log[:cut]
            self._log_base += cut
        return self.cursor

    def changes(self, since: int) -> tuple[int, Sequence[Change] | None]:
        cursor = self.cursor
        if since < self._log_base:
            return cursor, None
        return cursor, self._log[since - self._log_base :]

    # -- queries --------------------------------------------------------------

    def children(self, key: int) -> Set[int]:
        node = self._nodes.get(key)
        kids = None if node is None else node.children
        if kids is None:
            return _EMPTY
        return frozenset((kids,)) if isinstance(kids, int) else kids

    def holders(self, key: int) -> Set[int]:
        node = self._nodes.get(key)
        return node.holders if node is not None else _EMPTY

    def worker_keys(self, worker: int) -> Set[int]:
        # A scan: only reconfigurations and resynchronisations ask, and an index
        # per worker would cost every stored and removed block a set update.
        return frozenset(k for k, node in self._nodes.items() if worker in node.holders)

    def worker_block_count(self, worker: int) -> int:
        return self._held.get(worker, 0)

    def workers(self) -> Set[int]:
        out: set[int] = set()
        for node in self._nodes.values():
            out |= node.holders
        return frozenset(out)

    def path(self, keys: Sequence[int]) -> list[BlockInfo]:
        """MatchedPath: the nodes of the longest prefix of ``keys`` present in
        the index, whoever holds them (placeholders included)."""
        # Lookups stop at the first miss; takewhile/map keep the loop in C.
        return cast(list[BlockInfo], list(takewhile(_is_node, map(self._nodes.get, keys))))

    def matched_blocks(self, keys: Sequence[int]) -> Mapping[int, int]:
        """Per worker, how many leading blocks of ``keys`` it holds."""
        # Placement's hot path (issue 4). A worker's match is the run of
        # leading blocks it holds without a gap, so the workers still matching
        # after block i (``alive``) are the holders of every block so far: the
        # set only shrinks. Consecutive blocks usually have the same holders (a
        # conversation's blocks live on the same workers), so one subset test
        # per block is all the loop does until someone drops out; each worker's
        # depth is written once, where it drops out or at the end. A worker
        # that holds a deeper block but not an earlier one (per-rank events
        # still arriving, a partial copy) never joins: it lacks the prefix.
        get = self._nodes.get
        alive: Set[int] | None = None
        depths: dict[int, int] = {}
        walked = len(keys)
        for i, node in enumerate(map(get, keys)):  # map(): the lookups run in C
            if node is None:
                walked = i
                break
            holders = node.holders
            if alive is None:
                if not holders:
                    return depths
                alive = holders  # borrowed, never changed: a shrink takes another set
            elif not alive <= holders:
                # Depths count positions in the chain asked about, not the blocks'
                # own depths: the answer is about this chain, whatever was stored.
                if holders <= alive:
                    gone, alive = alive - holders, holders
                else:
                    gone, alive = alive - holders, alive & holders
                depths.update(dict.fromkeys(gone, i))
                if not alive:
                    return depths
        if alive and walked:
            depths.update(dict.fromkeys(alive, walked))
        return depths


def _is_node(node: TrieNode | None) -> bool:
    return node is not None


def _adopt(node: TrieNode, key: int) -> None:
    """``key`` is a child of ``node`` (see :attr:`TrieNode.children`)."""
    kids = node.children
    if kids is None:
        node.children = key
    elif isinstance(kids, int):
        if kids != key:
            node.children = _untrack({kids, key})
    else:
        kids.add(key)


def _disown(node: TrieNode, key: int) -> None:
    """``key`` is no longer a child of ``node``; no child left is None again."""
    kids = node.children
    if isinstance(kids, int):
        if kids == key:
            node.children = None
    elif kids is not None:
        kids.discard(key)
        if not kids:
            node.children = None


def _all_in(node: TrieNode, keys: Set[int]) -> bool:
    """Every child of ``node`` is in ``keys``."""
    kids = node.children
    if kids is None:
        return True
    return kids in keys if isinstance(kids, int) else kids <= keys
