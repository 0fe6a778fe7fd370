"""Prefixes that placed, not yet finished requests will leave cached.

Cache events only report a prefix once its prefill has *finished*. Under load
a conversation's next turn often arrives while the previous turn is still
queued, so an index built from cache events alone sees no cached prefix
anywhere, the turn lands on another worker and its whole context is computed
again — extra work that lengthens every queue just when the pool has least
room for it. Routers that index their own decisions (SGLang's tree, llm-d's
approximate index) or predict active blocks (Dynamo) do not fall into this.

A worker serves its queue in order, so a request placed behind one with the
same prefix *will* find that prefix cached when it runs (barring eviction).
This index records, per worker, the block keys of requests placed there and
not yet finished; placement takes, per worker, the longer of the prefix
cached now and the prefix in flight there.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence


class InflightPrefixes:
    """Per worker, reference-counted block keys of placed, unfinished requests."""

    __slots__ = ("_by_key", "_placed")

    def __init__(self) -> None:
        self._by_key: dict[int, dict[int, int]] = {}
        """block key -> {worker: number of in-flight requests covering it}"""
        self._placed: dict[int, tuple[int, Sequence[int]]] = {}
        """request id -> (worker, block keys)"""

    def __len__(self) -> int:
        return len(self._placed)

    def add(self, request_id: int, worker: int, keys: Sequence[int]) -> None:
        """``request_id`` was queued at ``worker`` (a re-placed request moves)."""
        if request_id in self._placed:
            self.remove(request_id)
        self._placed[request_id] = (worker, keys)
        by_key = self._by_key
        for k in keys:
            holders = by_key.get(k)
            if holders is None:
                by_key[k] = {worker: 1}
            else:
                holders[worker] = holders.get(worker, 0) + 1

    def remove(self, request_id: int) -> None:
        """``request_id`` finished (its blocks are now reported by cache events) or left."""
        entry = self._placed.pop(request_id, None)
        if entry is None:
            return
        worker, keys = entry
        by_key = self._by_key
        for k in keys:
            holders = by_key[k]
            n = holders[worker] - 1
            if n:
                holders[worker] = n
            else:
                del holders[worker]
                if not holders:
                    del by_key[k]

    def matched_blocks(self, keys: Sequence[int]) -> dict[int, int]:
        """Per worker, leading blocks of ``keys`` that requests in flight there cover."""
        # Placement's hot path (issue 4). The result is what writing
        # ``depths[w] = depth`` for every holder of every matched key gives
        # (deeper keys overwrite); consecutive keys usually have the same
        # holders (every request with a hot system prompt covers all of its
        # blocks; a conversation's blocks are in flight at the same workers),
        # so each run of equal holder maps is written once, at its deepest
        # key, by one C-level update. Equal maps have equal workers; maps that
        # differ only in their counts merely split a run.
        by_key = self._by_key
        depths: dict[int, int] = {}
        run: dict[int, int] | None = None
        run_depth = 0
        for depth, holders in enumerate(map(by_key.get, keys), 1):  # map(): lookups in C
            if holders is None:
                break
            if holders != run:
                if run is not None:
                    depths.update(dict.fromkeys(run, run_depth))
                run = holders
            run_depth = depth
        if run is not None:
            depths.update(dict.fromkeys(run, run_depth))
        return depths


def merge_matches(cached: Mapping[int, int] | None, inflight: Mapping[int, int]) -> dict[int, int]:
    """Per worker, the longer of the two matches (a new dict; neither input changes)."""
    merged = dict(cached) if cached else {}
    get = merged.get
    for w, n in inflight.items():
        if n > get(w, 0):
            merged[w] = n
    return merged
