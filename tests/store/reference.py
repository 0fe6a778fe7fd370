"""A naive prefix index: the contract of ``vertumnus.core.store.TrieStore`` written as plainly as possible.

Every operation recomputes what it needs from three maps (holders, depth,
parent); nothing is incremental, so it is obviously right and slow. The
property tests hold every real store against it.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence

from vertumnus.core.store import StoreError


class NaiveStore:
    def __init__(self) -> None:
        self.held: dict[int, set[int]] = {}
        """key -> workers holding it (only keys with at least one holder)"""
        self.depth: dict[int, int] = {}
        self.parent: dict[int, int | None] = {}
        self.generation: dict[int, int] = {}
        self._next_gen = 1

    # -- what is in the index ------------------------------------------------------

    def present(self) -> set[int]:
        """Keys held by someone, and every ancestor of those whose parent link is known."""
        out: set[int] = set()
        todo = [k for k, ws in self.held.items() if ws]
        while todo:
            k = todo.pop()
            if k in out:
                continue
            out.add(k)
            p = self.parent.get(k)
            if p is not None:
                todo.append(p)
        return out

    def _forget_absent(self) -> None:
        present = self.present()
        for table in (self.depth, self.parent, self.generation):
            for k in [k for k in table if k not in present]:
                del table[k]

    def _ensure(self, key: int, depth: int, parent: int | None) -> None:
        if key not in self.depth:
            self.depth[key] = depth
            self.parent[key] = parent
            self.generation[key] = self._next_gen
            self._next_gen += 1

    # -- events ------------------------------------------------------------------------

    def apply(
        self,
        worker: int,
        stored: Iterable[tuple[int, int, int | None]] = (),
        removed: Iterable[int] = (),
        *,
        cleared: bool = False,
    ) -> None:
        saved = copy.deepcopy((self.held, self.depth, self.parent, self.generation, self._next_gen))
        try:
            if cleared:
                self.drop_worker(worker)
            for key, position, parent in stored:
                self._store_one(worker, key, position, parent)
        except StoreError:
            self.held, self.depth, self.parent, self.generation, self._next_gen = saved
            raise
        for key in removed:
            ws = self.held.get(key)
            if ws is not None:
                ws.discard(worker)
                if not ws:
                    del self.held[key]
        self._forget_absent()

    def _store_one(self, worker: int, key: int, position: int, parent: int | None) -> None:
        if position < 0 or (position == 0 and parent is not None):
            raise StoreError(f"bad position {position} for {key}")
        if key in self.depth and self.depth[key] != position + 1:
            raise StoreError(f"{key} is at another position")
        if parent is not None:
            if parent in self.depth and self.depth[parent] != position:
                raise StoreError(f"parent {parent} is at another position")
            if self.parent.get(key) not in (None, parent):
                raise StoreError(f"{key} has another parent")
        self._ensure(key, position + 1, parent)
        if parent is not None:
            self._ensure(parent, position, None)
            self.parent[key] = parent
        self.held.setdefault(key, set()).add(worker)

    def drop_worker(self, worker: int) -> None:
        for key in list(self.held):
            self.held[key].discard(worker)
            if not self.held[key]:
                del self.held[key]
        self._forget_absent()

    # -- queries -------------------------------------------------------------------------

    def matched_blocks(self, keys: Sequence[int]) -> dict[int, int]:
        workers = {w for ws in self.held.values() for w in ws}
        out = {}
        for w in workers:
            n = 0
            for k in keys:
                if w not in self.held.get(k, ()):
                    break
                n += 1
            if n:
                out[w] = n
        return out

    def holders(self, key: int) -> set[int]:
        return set(self.held.get(key, ()))

    def path_keys(self, keys: Sequence[int]) -> list[int]:
        present = self.present()
        out = []
        for k in keys:
            if k not in present:
                break
            out.append(k)
        return out

    def children(self, key: int) -> set[int]:
        present = self.present()
        return {k for k in present if self.parent.get(k) == key}
