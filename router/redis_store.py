"""The global prefix index in Redis: a :class:`~vertumnus.core.store.TrieStore` for router replicas.

Same contract, same answers as the in-process
:class:`~vertumnus.core.trie.PrefixTrie` (``tests/store/`` runs both through
one contract suite, property tests against a naive reference, and a
side-by-side comparison down to generations and change-log entries), but the
index lives in a Redis server, so a second router replica reads the same
index and follows its changes, and a restarted router finds it again.

**Key layout.** Every key of a store starts with ``vt:{<namespace>}:`` (the
namespace names the pool and model, e.g. ``pool-a/qwen3-30b``; the braces are
a Redis Cluster hash tag, so one store is one slot and its multi-key scripts
stay legal on a cluster). Block keys are decimal 64-bit integers.

==================  ======  ===================================================
``…:holders``       hash    block key → its holders, sorted, comma-separated
                            (``""`` for a placeholder); a field per block in
                            the index, so ``matched_blocks`` reads a whole
                            chain with one ``HMGET``
``…:blocks``        hash    block key → ``depth,generation,children[,parent]``
                            (the number of children; no parent while it is
                            not known)
``…:c:<key>``       set     keys of the block's children (absent: none)
``…:w:<worker>``    set     keys the worker holds (``worker_keys`` is no SCAN)
``…:workers``       set     workers holding at least one block
``…:meta``          hash    ``cur`` cursor, ``g`` next generation (a new
                            store starts it at the server's clock in µs, so a
                            restart never hands a block an old generation),
                            ``inc`` incarnation (see below)
``…:log``           stream  the change log: entry id ``<cursor>-0``, fields
                            ``w`` worker, ``s`` stored, ``r`` removed (keys,
                            comma-separated), ``g`` gone (``key:generation``),
                            ``d`` dropped (``1``/``0``); trimmed to
                            ``log_limit`` entries (exact ``MAXLEN``)
==================  ======  ===================================================

Two big hashes rather than a hash per block: a chain's lookups are one
command, not one per block (about 2x less server time for a 200-block chain),
and a field costs less memory than a key. The price is two large keys; a
store is one cluster slot anyway, so they move with it.

**Round trips.** Every method is one: ``apply``/``drop_worker`` one
``EVALSHA`` of the apply script (validate the whole batch on an overlay,
refuse it whole, or write it back with its generations, pruning and log
entry), ``matched_blocks`` and ``path`` one script walking the chain,
``changes`` one script reading cursor and stream together, ``block`` the
path script on one key, the rest one command each
(:mod:`vertumnus.router.redis_scripts` has the scripts).

**Restarts.** Without persistence a restarted Redis is empty: every method
works again as soon as it is back (scripts are reloaded on ``NOSCRIPT``),
and while it is down each call raises
:class:`~vertumnus.router.redis_conn.RedisUnavailableError` naming the
server. Refilling the index is the router's job, not the store's: it
re-synchronises every worker from its ``ListBlocks`` snapshot. Followers
are told: the first write to an empty store sets a new **incarnation**, and
:meth:`RedisTrieStore.changes` answers None (resynchronise) to a caller whose
cursor belongs to an earlier incarnation, or lies beyond the cursor.

**Costs.** Redis runs one script at a time, so a batch of n blocks holds the
server for O(n): on a busy 2-core box a 16-block completion takes ~0.2 ms of
server time, a 256-block ``matched_blocks`` ~0.15 ms, and a batch or drop of
100,000 blocks 1.5–2 s — longer than the clients' 2 s read timeout once a
clear and a re-store are one batch. Write a big snapshot as ``drop_worker``
and then batches of at most ~10,000 blocks, parents first (each is a valid
index state). Keys and workers are ints. An ACL user needs the ``~vt:*``
keys, ``EVALSHA`` and ``SCRIPT LOAD``.

**Differences from the in-process store.** :meth:`RedisTrieStore.changes`
answers None where :class:`~vertumnus.core.trie.PrefixTrie` would answer an
empty list to a cursor ahead of its own (only a store that started over has
one). Block objects are snapshots (:class:`BlockSnapshot`), not live nodes.
A refusal of a ``cleared=True`` batch names the exact contradiction rather
than "contradicts the index or the rest of the batch". Everything else —
answers, generations, change-log entries, what is refused — is the same
(``tests/store/test_properties.py`` compares the two op by op).
"""

from __future__ import annotations

import functools
import secrets
from collections.abc import Callable, Iterable, Mapping, Sequence, Set
from dataclasses import dataclass
from typing import Any, Concatenate, ParamSpec, TypeVar

from redis.exceptions import NoScriptError, RedisError, ResponseError

from vertumnus.core.store import Change, StoredBlock, StoreError

from .redis_conn import translate
from .redis_scripts import APPLY, CHANGES, MATCH, PATH

__all__ = ["Batch", "BlockSnapshot", "RedisTrieStore", "key_prefix", "validate_namespace"]

_P = ParamSpec("_P")
_R = TypeVar("_R")

Batch = tuple[int, Sequence[StoredBlock | tuple[int, int, int | None]], Sequence[int], bool]
"""One event batch for :meth:`RedisTrieStore.apply_many`: worker, stored, removed, cleared."""

_MAX_POSITION = 1 << 52
"""Positions travel as Lua numbers (doubles): refuse the ones they would round."""


def validate_namespace(namespace: str) -> str:
    """``namespace`` if it can name a store's keys, else a :class:`ValueError` saying why."""
    if not isinstance(namespace, str):
        raise TypeError(f"the namespace must be a str, not {type(namespace).__name__}")
    if not namespace:
        raise ValueError("the namespace is empty: name the pool and model, e.g. 'pool-a/qwen3'")
    if "{" in namespace or "}" in namespace:
        raise ValueError(
            f"the namespace {namespace!r} contains a brace: the store wraps it in {{...}} as a "
            "Redis Cluster hash tag, so it may not contain '{' or '}'"
        )
    if not namespace.isprintable():
        raise ValueError(f"the namespace {namespace!r} contains unprintable characters")
    return namespace


def key_prefix(namespace: str) -> str:
    """``vt:{<namespace>}:``, the start of every key of the store ``namespace``."""
    return f"vt:{{{validate_namespace(namespace)}}}:"


@dataclass(frozen=True, slots=True)
class BlockSnapshot:
    """One block as the store held it when read (a :class:`~vertumnus.core.store.BlockInfo`)."""

    key: int
    depth: int
    parent: int | None
    holders: frozenset[int]
    generation: int


_NO_HOLDERS: frozenset[int] = frozenset()


def _ints(value: bytes | str | None) -> frozenset[int]:
    """The set of ints in a comma-separated reply (bytes or str)."""
    if not value:
        return _NO_HOLDERS
    sep: Any = b"," if isinstance(value, bytes) else ","
    return frozenset(map(int, value.split(sep)))


def _int_tuple(value: bytes | str) -> tuple[int, ...]:
    if not value:
        return ()
    sep: Any = b"," if isinstance(value, bytes) else ","
    return tuple(map(int, value.split(sep)))


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _block_fields(value: bytes | str) -> tuple[int, int, int | None]:
    """Depth, generation and parent from a ``blocks`` field,
    ``depth,generation,children[,parent]``."""
    parts = _text(value).split(",")
    return int(parts[0]), int(parts[1]), int(parts[3]) if len(parts) > 3 else None


def _guarded(
    op: str,
) -> Callable[
    [Callable[Concatenate[RedisTrieStore, _P], _R]], Callable[Concatenate[RedisTrieStore, _P], _R]
]:
    """Turn redis-py's connection and credential errors into ours, naming the server and ``op``."""

    def deco(
        fn: Callable[Concatenate[RedisTrieStore, _P], _R],
    ) -> Callable[Concatenate[RedisTrieStore, _P], _R]:
        @functools.wraps(fn)
        def wrapper(self: RedisTrieStore, *args: _P.args, **kwargs: _P.kwargs) -> _R:
            try:
                return fn(self, *args, **kwargs)
            except RedisError as exc:
                err = translate(exc, self._client, f"{op} in namespace {self._namespace!r}")
                if err is exc:
                    raise
                raise err from exc

        return wrapper

    return deco


class RedisTrieStore:
    """The prefix index of one namespace in Redis; see the module docstring.

    ``client``: a synchronous ``redis.Redis`` (build it with
    :func:`vertumnus.router.redis_conn.redis_client`; replies may be bytes or
    str). ``log_limit``: change-log entries kept — the writer's setting trims
    the stream, so replicas of one namespace should agree on it.

    Stateless apart from the incarnation it last saw, so any number of these
    objects (threads, processes, replicas) may share one namespace.
    """

    __slots__ = ("_client", "_namespace", "_prefix", "_meta", "_holders", "_log_limit", "_seen")

    def __init__(self, client: Any, namespace: str, *, log_limit: int = 65536) -> None:
        if isinstance(log_limit, bool) or not isinstance(log_limit, int) or log_limit < 1:
            raise ValueError(f"log_limit must be an int >= 1, got {log_limit!r}")
        self._client = client
        self._namespace = namespace
        self._prefix = key_prefix(namespace)
        self._meta = self._prefix + "meta"
        self._holders = self._prefix + "holders"
        self._log_limit = log_limit
        self._seen: str | None = None
        """The incarnation :meth:`changes` last saw (None: none yet)."""

    def __repr__(self) -> str:
        return f"RedisTrieStore({self._namespace!r})"

    @property
    def namespace(self) -> str:
        return self._namespace

    @property
    def key_prefix(self) -> str:
        """``vt:{<namespace>}:``: every key of this store starts with it."""
        return self._prefix

    @property
    @_guarded("cursor")
    def cursor(self) -> int:
        value = self._client.hget(self._meta, "cur")
        return int(value) if value is not None else 0

    @property
    @_guarded("incarnation")
    def incarnation(self) -> str | None:
        """Set by the first write to an empty store; a new one means the store
        started over (a Redis restart without persistence, a flush)."""
        value = self._client.hget(self._meta, "inc")
        return _text(value) if value is not None else None

    @_guarded("len")
    def __len__(self) -> int:
        return int(self._client.hlen(self._holders))

    # -- events ---------------------------------------------------------------

    @_guarded("apply")
    def apply(
        self,
        worker: int,
        stored: Iterable[StoredBlock | tuple[int, int, int | None]] = (),
        removed: Iterable[int] = (),
        *,
        cleared: bool = False,
    ) -> int:
        """Apply one event batch of ``worker`` atomically, in one round trip;
        returns the new cursor. Raises :class:`~vertumnus.core.store.StoreError`
        (nothing applied) if the batch contradicts the index."""
        try:
            return int(
                APPLY(
                    self._client, [self._meta], self._apply_args(worker, stored, removed, cleared)
                )
            )
        except ResponseError as exc:
            if str(exc).startswith("VTREFUSED "):
                raise _refusal(str(exc)) from None
            raise

    @_guarded("apply_many")
    def apply_many(self, batches: Sequence[Batch]) -> list[int | StoreError]:
        """Apply event batches in order, each atomically as :meth:`apply` does, in one
        round trip (a pipeline, not a transaction); per batch its new cursor, or the
        :class:`~vertumnus.core.store.StoreError` that refused it (the others apply
        regardless). What a writer behind a busy router sends: a round trip and a
        thread hop per batch cost more than the scripts. Not in the protocol."""
        pipe = self._client.pipeline(transaction=False)
        out: list[int | StoreError] = []
        sent: list[int] = []
        for i, (worker, stored, removed, cleared) in enumerate(batches):
            try:
                args = self._apply_args(worker, stored, removed, cleared)
            except StoreError as exc:
                out.append(exc)
                continue
            out.append(0)
            sent.append(i)
            pipe.evalsha(APPLY.sha, 1, self._meta, *args)
        replies = pipe.execute(raise_on_error=False) if sent else []
        for i, reply in zip(sent, replies, strict=True):
            if isinstance(reply, NoScriptError):
                # First use on this server (or it restarted): this call loads the script.
                # The batches after it in the pipeline failed the same way, in order.
                worker, stored, removed, cleared = batches[i]
                try:
                    out[i] = self.apply(worker, stored, removed, cleared=cleared)
                except StoreError as exc:
                    out[i] = exc
            elif isinstance(reply, ResponseError) and str(reply).startswith("VTREFUSED "):
                out[i] = _refusal(str(reply))
            elif isinstance(reply, Exception):
                raise reply
            else:
                out[i] = int(reply)
        return out

    def _apply_args(
        self,
        worker: int,
        stored: Iterable[StoredBlock | tuple[int, int, int | None]],
        removed: Iterable[int],
        cleared: bool,
    ) -> list[Any]:
        worker = int(worker)
        keys: list[str] = []
        positions: list[str] = []
        parents: list[str] = []
        for key, position, parent in stored:
            position = int(position)
            if position >= _MAX_POSITION:
                raise StoreError(
                    f"worker {worker}: block {int(key):#x} has position {position}, too large"
                )
            keys.append(str(int(key)))
            positions.append(str(position))
            parents.append("-" if parent is None else str(int(parent)))
        # A fresh token per call: it becomes the incarnation if this is the first
        # write to an empty store (one per object would repeat itself after a restart).
        return [
            self._prefix,
            worker,
            "1" if cleared else "0",
            self._log_limit,
            secrets.token_hex(8),
            ",".join(keys),
            ",".join(positions),
            ",".join(parents),
            ",".join(str(int(k)) for k in removed),
        ]

    def drop_worker(self, worker: int) -> int:
        """Forget every block ``worker`` holds (it left the pool); the new cursor."""
        return self.apply(worker, cleared=True)

    # -- queries --------------------------------------------------------------

    @_guarded("matched_blocks")
    def matched_blocks(self, keys: Sequence[int]) -> Mapping[int, int]:
        """Per worker, how many leading blocks of ``keys`` it holds (one round trip)."""
        if not keys:
            return {}
        # One joined argument, not one per key: see redis_scripts._HELPERS.
        reply = MATCH(self._client, [self._meta], [self._prefix, ",".join(map(str, keys))])
        if not reply:
            return {}
        pairs = iter(map(int, reply.split(b"," if isinstance(reply, bytes) else ",")))
        return dict(zip(pairs, pairs, strict=True))

    @_guarded("path")
    def path(self, keys: Sequence[int]) -> list[BlockSnapshot]:
        """The blocks of the longest prefix of ``keys`` in the index, whoever
        holds them (placeholders included), root first; one round trip."""
        if not keys:
            return []
        keys = [int(k) for k in keys]
        flat = PATH(self._client, [self._meta], [self._prefix, ",".join(map(str, keys))])
        out = []
        for i in range(len(flat) // 2):
            depth, generation, parent = _block_fields(flat[2 * i])
            out.append(BlockSnapshot(keys[i], depth, parent, _ints(flat[2 * i + 1]), generation))
        return out

    def block(self, key: int | None) -> BlockSnapshot | None:
        if key is None:
            return None
        found = self.path([key])
        return found[0] if found else None

    @_guarded("blocks")
    def blocks(self, keys: Iterable[int]) -> dict[int, BlockSnapshot]:
        """The blocks of ``keys`` that are in the index, read together in one round
        trip (one MULTI/EXEC): what a follower needs to mirror a change or reload
        a worker, without a round trip per block. Not in the protocol."""
        keys = [int(k) for k in keys]
        if not keys:
            return {}
        chunk = 10_000  # bounded commands: a big reload does not make one huge reply
        pipe = self._client.pipeline(transaction=True)
        for i in range(0, len(keys), chunk):
            fields = [str(k) for k in keys[i : i + chunk]]
            pipe.hmget(self._prefix + "blocks", fields)
            pipe.hmget(self._holders, fields)
        replies = pipe.execute()
        out: dict[int, BlockSnapshot] = {}
        for n, i in enumerate(range(0, len(keys), chunk)):
            metas, holds = replies[2 * n], replies[2 * n + 1]
            for key, meta, hold in zip(keys[i : i + chunk], metas, holds, strict=True):
                if meta is not None:
                    depth, generation, parent = _block_fields(meta)
                    out[key] = BlockSnapshot(key, depth, parent, _ints(hold), generation)
        return out

    @_guarded("holders")
    def holders(self, key: int) -> Set[int]:
        return _ints(self._client.hget(self._holders, str(int(key))))

    @_guarded("children")
    def children(self, key: int) -> Set[int]:
        return frozenset(map(int, self._client.smembers(f"{self._prefix}c:{int(key)}")))

    @_guarded("worker_keys")
    def worker_keys(self, worker: int) -> Set[int]:
        return frozenset(map(int, self._client.smembers(f"{self._prefix}w:{int(worker)}")))

    @_guarded("worker_block_count")
    def worker_block_count(self, worker: int) -> int:
        return int(self._client.scard(f"{self._prefix}w:{int(worker)}"))

    @_guarded("workers")
    def workers(self) -> Set[int]:
        return frozenset(map(int, self._client.smembers(self._prefix + "workers")))

    @_guarded("changes")
    def changes(self, since: int) -> tuple[int, Sequence[Change] | None]:
        """The cursor now and the changes after ``since`` (one round trip); None
        when the stream no longer reaches back that far — or ``since`` is from
        an earlier incarnation of the store, or ahead of its cursor (both mean
        the store started over): the follower must resynchronise."""
        since = int(since)
        cursor_raw, inc_raw, reaches, entries = CHANGES(
            self._client, [self._meta], [self._prefix, since]
        )
        cursor = int(cursor_raw)
        inc = _text(inc_raw) or None
        seen, self._seen = self._seen, inc
        if seen is not None and inc != seen:
            return cursor, None
        if not reaches or since > cursor:
            return cursor, None
        return cursor, [_change(entry) for entry in entries]


def _change(entry: list[Any]) -> Change:
    """The :class:`~vertumnus.core.store.Change` in a stream entry ``[id, [field, value, ...]]``."""
    entry_id, flat = entry
    fields = {_text(flat[i]): flat[i + 1] for i in range(0, len(flat), 2)}
    gone_raw = fields["g"]
    gone: tuple[tuple[int, int], ...] = ()
    if gone_raw:
        pairs = _text(gone_raw).split(",")
        gone = tuple((int(k), int(g)) for k, _, g in (p.partition(":") for p in pairs))
    return Change(
        cursor=int(_text(entry_id).partition("-")[0]),
        worker=int(fields["w"]),
        stored=_int_tuple(fields["s"]),
        removed=_int_tuple(fields["r"]),
        gone=gone,
        dropped=_text(fields["d"]) == "1",
    )


def _refusal(reply: str) -> StoreError:
    """The :class:`StoreError` for the apply script's refusal
    ``VTREFUSED <kind> <worker> <key> <position> <parent|-> <other|->``, worded
    like the in-process store's."""
    _, kind, worker, key_s, position, parent_s, other = reply.split(" ")[:7]
    key = int(key_s)
    parent = None if parent_s == "-" else int(parent_s)
    where = f"worker {worker}: block {key:#x} at position {position}"
    if kind == "neg":
        return StoreError(f"worker {worker}: block {key:#x} has negative position {position}")
    if kind == "root":
        return StoreError(f"{where} cannot have a parent ({parent:#x})")
    if kind == "depth":
        return StoreError(f"{where}, but the index has it at position {other}")
    if kind == "parent":
        return StoreError(f"{where} names parent {parent:#x}, the index has {int(other):#x}")
    if kind == "pdepth":
        return StoreError(
            f"{where} names parent {parent:#x}, which the index has at position {other}"
        )
    return StoreError(f"{where} contradicts the index ({kind})")
