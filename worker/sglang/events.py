"""SGLang's KV-cache events as its ZMQ publisher sends them, turned into our cache changes.

The format, as SGLang 0.5.23 writes it (``sglang/srt/disaggregation/kv_events.py``;
``sglang/srt/mem_cache/events.py`` records the events):

- **Live messages** (PUB socket): three frames ``[topic, sequence, payload]``; the
  sequence is 8 bytes big-endian, counting 0, 1, 2, … per publisher
  (``kv_events.py:449, 617-620``).
- **Payload**: one msgpack ``EventBatch``, always a positional array
  ``[ts, events, attn_dp_rank]`` (``array_like=True``, ``kv_events.py:233-240``;
  releases before ``attn_dp_rank`` send ``[ts, events]``).
- **Events**: since SGLang PR #37482, ``KVCacheEvent`` is a msgspec struct with
  ``tag=True`` and no ``array_like`` (``kv_events.py:243-258``), so each event is a
  **msgpack map** whose ``type`` key is the class name — ``BlockStored``,
  ``BlockRemoved``, ``AllBlocksCleared`` (``kv_events.py:279-304``) — and optional
  fields left at their default are omitted (``omit_defaults=True``). Earlier releases
  had ``array_like=True`` on the event too, so an event was a **positional array**
  with the tag first: ``["BlockStored", block_hashes, parent_block_hash, token_ids,
  block_size, lora_id]`` (sgl-project/sglang ``python/sglang/srt/disaggregation/
  kv_events.py`` at commit 006d053f). Both are decoded here, told apart by their type.
- **Replay** (ROUTER socket, when ``replay_endpoint`` is set): a DEALER sends
  ``[b"", start]`` (8 bytes big-endian); the publisher answers every buffered batch
  with sequence ≥ start as ``[b"", topic, sequence, payload]`` and ends with
  ``[b"", b"", -1 (8 bytes, signed), b""]`` (``kv_events.py:630-648``); earlier
  releases sent ``[b"", sequence, payload]`` and ``[b"", -1, b""]``.

What the events say (``mem_cache/events.py:213-309``): ``BlockStored`` is a chain of
pages, each page ``block_size`` tokens (the server's ``--page-size``), with one hash
per page; consecutive chained stores are coalesced into one event, their
``token_ids`` concatenated (``events.py:140-170``); ``parent_block_hash`` is the hash
of the page before the first one, None at the root. A hash is the first 64 bits of
a chained SHA-256 over the page's tokens (``mem_cache/utils.py:155-175``), signed.
``BlockRemoved`` lists the hashes of a radix node's pages. ``AllBlocksCleared``
empties the cache. ``medium`` says which tier (``GPU``, ``CPU_PINNED``, …).

**Key chaining.** Our router keys a request with
:func:`vertumnus.core.keys.token_block_keys` over its token ids; SGLang's hashes are
a different function, so they are never compared with ours. Instead each stored page
is **rekeyed from its token ids**: block j's key is our chain step from block j−1's
key (:func:`chain_key`), and the decoder remembers, per SGLang page hash, the blocks
it became, so the first page of a later event continues from its parent's last key.
A page whose parent the decoder does not know (events lost before it) cannot be
keyed and is counted in ``unkeyable_blocks``; so are its descendants.

**Block size.** SGLang's page of ``P`` tokens becomes ``P / B`` of our blocks of
``B`` tokens (the command sets ``--page-size B``, so normally one). A page size that
is not a multiple of ``B`` is refused (:class:`SglangEventError`, naming
``page_size``). A partial page (fewer than ``P`` tokens) yields its full blocks
only, and nothing chains after it.

**Sequences.** :class:`SglangEventDecoder` applies batches strictly in sequence
order: a batch after a gap waits until the gap is filled by a replay
(:meth:`~SglangEventDecoder.replay_request` says what to ask for), or is declared
lost (the replay buffer no longer reaches back, or :meth:`skip_gap`), after which
the decoder's view may be wrong (``stale``) until the adapter flushes the server's
cache and calls :meth:`~SglangEventDecoder.reset`. Duplicates (a replayed batch
that also arrived live) are dropped. Our own event sequence numbers are not made
here: the adapter publishes each :class:`CacheChange` through the worker's
:class:`vertumnus.worker.events.EventLog`, which numbers, buffers and replays them
exactly as for the torch engine.

Pure Python + msgpack; no ZMQ here (:mod:`.subscriber` is the socket side).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack

from vertumnus.core.keys import block_content_hash, chain_block_hashes, mix64, salt_of

from ..blocks import Block

__all__ = [
    "END_SEQUENCE",
    "MEDIUM_GPU",
    "Batch",
    "CacheChange",
    "Cleared",
    "Gap",
    "Message",
    "Removed",
    "SglangEventDecoder",
    "SglangEventError",
    "Stored",
    "Unknown",
    "chain_key",
    "decode_batch",
    "decode_event",
    "parse_live",
    "parse_replay",
    "replay_request",
]

MEDIUM_GPU = "GPU"
"""``StorageMedium.GPU`` (``kv_events.py:261-267``); events without a medium are GPU ones
(releases before the field existed only published the device cache)."""

END_SEQUENCE = -1
"""The sequence of the replay's end marker (``kv_events.py:416``)."""
_END = END_SEQUENCE.to_bytes(8, "big", signed=True)

_FIELDS: dict[str, tuple[str, ...]] = {
    # Field order of the structs (kv_events.py:279-304): the positional encoding's order.
    "BlockStored": (
        "block_hashes",
        "parent_block_hash",
        "token_ids",
        "block_size",
        "lora_id",
        "medium",
        "cache_salt",
        "session_id",
        "lora_name",
    ),
    "BlockRemoved": ("block_hashes", "medium"),
    "AllBlocksCleared": (),
}
_REQUIRED = {
    "BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size"),
    "BlockRemoved": ("block_hashes",),
    "AllBlocksCleared": (),
}


class SglangEventError(ValueError):
    """A message or event that is not in SGLang's format; the message names the field."""


# -- the events ----------------------------------------------------------------


@dataclass(frozen=True)
class Stored:
    """``BlockStored``: pages ``block_hashes`` (root first) and their concatenated tokens."""

    block_hashes: tuple[int, ...]
    parent_block_hash: int | None
    token_ids: tuple[int, ...]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None
    cache_salt: str | None = None
    lora_name: str | None = None


@dataclass(frozen=True)
class Removed:
    """``BlockRemoved``: these pages left ``medium``."""

    block_hashes: tuple[int, ...]
    medium: str | None = None


@dataclass(frozen=True)
class Cleared:
    """``AllBlocksCleared``: nothing is cached any more."""


@dataclass(frozen=True)
class Unknown:
    """An event type this decoder does not know (a newer SGLang); skipped and counted."""

    tag: str


SglangEvent = Stored | Removed | Cleared | Unknown


@dataclass(frozen=True)
class Batch:
    """One ``EventBatch``."""

    ts: float
    events: tuple[SglangEvent, ...]
    dp_rank: int | None = None


@dataclass(frozen=True)
class Message:
    """One published batch as it came off a socket, not yet decoded."""

    topic: bytes
    sequence: int
    payload: bytes


@dataclass(frozen=True)
class Gap:
    """Sequences ``first .. last`` (inclusive) that did not arrive."""

    first: int
    last: int


@dataclass(frozen=True)
class CacheChange:
    """What one SGLang event changes in what the worker serves, in our keys.

    ``kind`` is ``stored``, ``removed`` or ``cleared`` (the first three of
    :data:`vertumnus.worker.events.KINDS`): ``EventLog.publish(kind, blocks, ...)``.
    """

    kind: str
    blocks: tuple[Block, ...] = ()


# -- frames ----------------------------------------------------------------------


def _sequence(frame: bytes, what: str) -> int:
    if len(frame) != 8:
        raise SglangEventError(f"{what}: the sequence frame has 8 bytes, got {len(frame)}")
    return int.from_bytes(frame, "big")


def parse_live(frames: Sequence[bytes]) -> Message:
    """A live message: ``[topic, sequence, payload]`` (``kv_events.py:619-620``)."""
    if len(frames) != 3:
        raise SglangEventError(
            f"live message: expected 3 frames (topic, sequence, payload), got {len(frames)}"
        )
    topic, seq, payload = frames
    return Message(bytes(topic), _sequence(seq, "live message"), bytes(payload))


def replay_request(start: int) -> list[bytes]:
    """The frames a DEALER sends to ask for every buffered batch from ``start`` on.

    The ROUTER receives ``[identity, b"", start]`` (``kv_events.py:636-639``).
    """
    if not 0 <= start < 2**63:
        raise SglangEventError(f"replay start: must be a sequence >= 0, got {start}")
    return [b"", start.to_bytes(8, "big")]


def parse_replay(frames: Sequence[bytes]) -> Message | None:
    """One replay answer as a DEALER receives it; None for the end marker.

    0.5.23: ``[b"", topic, sequence, payload]``, end ``[b"", b"", -1, b""]``
    (``kv_events.py:643-648``); earlier: ``[b"", sequence, payload]``, end ``[b"", -1, b""]``.
    """
    if len(frames) not in (3, 4) or frames[0] != b"":
        raise SglangEventError(
            "replay message: expected [b'', topic, sequence, payload] (or the older "
            f"[b'', sequence, payload]), got {len(frames)} frames"
        )
    topic = bytes(frames[1]) if len(frames) == 4 else b""
    seq, payload = frames[-2], frames[-1]
    if bytes(seq) == _END:
        return None
    return Message(topic, _sequence(seq, "replay message"), bytes(payload))


# -- payloads --------------------------------------------------------------------


def _int(value: Any, where: str, *, optional: bool = False) -> int | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise SglangEventError(f"{where}: expected an integer, got {value!r}")
    return value


def _ints(value: Any, where: str) -> tuple[int, ...]:
    if not isinstance(value, list | tuple):
        raise SglangEventError(f"{where}: expected a list of integers, got {type(value).__name__}")
    out = []
    for i, v in enumerate(value):
        # Bigram pages (EAGLE) publish (token j, token j+1) pairs (mem_cache/events.py:245-248):
        # the page's own token is the first.
        if isinstance(v, list | tuple) and len(v) == 2:
            v = v[0]
        out.append(_int(v, f"{where}[{i}]"))
    return tuple(x for x in out if x is not None)


def _str(value: Any, where: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise SglangEventError(f"{where}: expected a string, got {value!r}")


def decode_event(raw: Any) -> SglangEvent:
    """One event, either a tagged map (0.5.23) or a tagged positional array (older)."""
    if isinstance(raw, Mapping):
        tag = raw.get("type")
        if not isinstance(tag, str):
            raise SglangEventError(f"event: a map event needs a string 'type' key, got {tag!r}")
        if tag not in _FIELDS:
            return Unknown(tag)
        values = {k: raw[k] for k in _FIELDS[tag] if k in raw}
    elif isinstance(raw, list | tuple) and raw and isinstance(raw[0], str):
        tag = raw[0]
        if tag not in _FIELDS:
            return Unknown(tag)
        names = _FIELDS[tag]
        if len(raw) - 1 > len(names):
            raise SglangEventError(
                f"{tag}: a positional event has at most {len(names)} fields, got {len(raw) - 1}"
            )
        values = dict(zip(names, raw[1:], strict=False))
    else:
        raise SglangEventError(
            f"event: expected a map with a 'type' key or an array starting with the type, got {raw!r}"
        )
    missing = [k for k in _REQUIRED[tag] if k not in values]
    if missing:
        raise SglangEventError(f"{tag}.{missing[0]}: required field missing")
    if tag == "BlockStored":
        size = _int(values["block_size"], "BlockStored.block_size")
        assert size is not None
        if size < 1:
            raise SglangEventError(f"BlockStored.block_size: must be >= 1, got {size}")
        return Stored(
            block_hashes=_ints(values["block_hashes"], "BlockStored.block_hashes"),
            parent_block_hash=_int(
                values["parent_block_hash"], "BlockStored.parent_block_hash", optional=True
            ),
            token_ids=_ints(values["token_ids"], "BlockStored.token_ids"),
            block_size=size,
            lora_id=_int(values.get("lora_id"), "BlockStored.lora_id", optional=True),
            medium=_str(values.get("medium"), "BlockStored.medium"),
            cache_salt=_str(values.get("cache_salt"), "BlockStored.cache_salt"),
            lora_name=_str(values.get("lora_name"), "BlockStored.lora_name"),
        )
    if tag == "BlockRemoved":
        return Removed(
            block_hashes=_ints(values["block_hashes"], "BlockRemoved.block_hashes"),
            medium=_str(values.get("medium"), "BlockRemoved.medium"),
        )
    return Cleared()


def decode_batch(payload: bytes) -> Batch:
    """An ``EventBatch`` payload: ``[ts, events]`` or ``[ts, events, attn_dp_rank]``."""
    try:
        raw = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as e:
        raise SglangEventError(f"payload: not msgpack ({e})") from None
    if not isinstance(raw, list) or len(raw) not in (2, 3):
        raise SglangEventError(
            f"EventBatch: expected [ts, events, attn_dp_rank], got {type(raw).__name__} "
            f"of {len(raw) if isinstance(raw, list) else '?'} items"
        )
    ts, events = raw[0], raw[1]
    if isinstance(ts, bool) or not isinstance(ts, int | float):
        raise SglangEventError(f"EventBatch.ts: expected a number, got {ts!r}")
    if not isinstance(events, list):
        raise SglangEventError(f"EventBatch.events: expected a list, got {type(events).__name__}")
    dp_rank = _int(raw[2], "EventBatch.attn_dp_rank", optional=True) if len(raw) == 3 else None
    return Batch(float(ts), tuple(decode_event(e) for e in events), dp_rank)


# -- rekeying --------------------------------------------------------------------


def chain_key(parent: int | None, tokens: Sequence[int], salt: int = 0) -> int:
    """Our chained key of a block of ``tokens`` after the block keyed ``parent`` (None:
    the first block). Equal to :func:`vertumnus.core.keys.token_block_keys` over the
    whole prefix (tests/worker/test_sglang_events.py checks it)."""
    h = block_content_hash(tokens)
    if parent is None:
        return chain_block_hashes([h], salt)[0]
    return mix64(parent ^ mix64(h))


def _salt(event: Stored) -> int:
    """The key space of a stored page: plain (0) unless SGLang namespaced it.

    SGLang namespaces hashes by LoRA adapter and cache salt (kv_events.py:279-296);
    keying such pages in their own space keeps them from ever matching a plain
    request (our router sends none).
    """
    parts = []
    if event.lora_id is not None:
        parts.append(f"lora-id={event.lora_id}")
    if event.lora_name is not None:
        parts.append(f"lora={event.lora_name}")
    if event.cache_salt is not None:
        parts.append(f"salt={event.cache_salt}")
    return salt_of("\x00".join(parts))


@dataclass
class _Page:
    blocks: tuple[Block, ...]  # our blocks of the page, root first
    complete: bool  # the page had exactly page-size tokens: later pages may chain after it
    media: set[str] = field(default_factory=set)


class SglangEventDecoder:
    """One SGLang server's event stream, in order, as our cache changes.

    ``block_size``: our block size (the router's). ``page_size``: the server's
    ``--page-size`` (default ``block_size``, as :mod:`.command` starts it); a multiple
    of ``block_size``. ``media``: the tiers whose blocks count as served (default the
    GPU cache only). ``first_sequence``: the first sequence expected (0 for a server
    started after the decoder). ``max_pending``: batches held behind a gap before it
    is declared lost.

    Feed it live messages (:meth:`live`) and replay answers (:meth:`replay`); each
    returns the changes now in order. Not thread-safe: one subscriber owns it.
    """

    def __init__(
        self,
        block_size: int,
        *,
        page_size: int | None = None,
        media: Iterable[str] = (MEDIUM_GPU,),
        first_sequence: int = 0,
        max_pending: int = 4096,
    ) -> None:
        if block_size < 1:
            raise SglangEventError(f"block_size: must be >= 1, got {block_size}")
        page = block_size if page_size is None else page_size
        if page < 1 or page % block_size:
            raise SglangEventError(
                f"page_size: SGLang's page size {page} is not a multiple of the worker's "
                f"block size {block_size} (start the server with --page-size {block_size})"
            )
        if max_pending < 1:
            raise SglangEventError(f"max_pending: must be >= 1, got {max_pending}")
        self.block_size = block_size
        self.page_size = page
        self.media = frozenset(media)
        self.max_pending = max_pending
        self.expected = first_sequence
        """The next sequence to apply."""
        self.lost: list[Gap] = []
        """Gaps given up on since the last reset (the view may be wrong: ``stale``)."""
        self.duplicates = 0
        """Batches received twice (live and replayed) and dropped."""
        self.unkeyable_blocks = 0
        """Our blocks not indexed because their parent page was unknown."""
        self.ignored_events = 0
        """Events of a medium outside ``media``, or of an unknown type."""
        self._pending: dict[int, Batch] = {}
        self._replay_from: int | None = None
        self._pages: dict[int, _Page] = {}

    # -- state -----------------------------------------------------------------------

    @property
    def gap(self) -> Gap | None:
        """The sequences missing before the first batch held back, if any."""
        if not self._pending:
            return None
        return Gap(self.expected, min(self._pending) - 1)

    @property
    def stale(self) -> bool:
        """True once a gap was lost: flush the server's cache and :meth:`reset`."""
        return bool(self.lost)

    def served(self) -> list[Block]:
        """Every block the server serves as far as the events tell (a snapshot)."""
        return sorted(
            (b for p in self._pages.values() for b in p.blocks), key=lambda b: (b.position, b.key)
        )

    def reset(self, first_sequence: int = 0) -> list[CacheChange]:
        """The server restarted (or its cache was flushed after a lost gap): forget
        everything, expect ``first_sequence`` next; one ``cleared`` change."""
        self._pages.clear()
        self._pending.clear()
        self._replay_from = None
        self.lost = []
        self.expected = first_sequence
        return [CacheChange("cleared")]

    # -- input -----------------------------------------------------------------------

    def live(self, frames: Sequence[bytes]) -> list[CacheChange]:
        """One message from the PUB socket."""
        msg = parse_live(frames)
        return self._receive(msg.sequence, msg.payload)

    def replay_request(self) -> list[bytes] | None:
        """The frames to send to the replay socket now, if a gap is open and no replay
        is in flight (then one is: call :meth:`replay` with the answers)."""
        if self.gap is None or self._replay_from is not None:
            return None
        self._replay_from = self.expected
        return replay_request(self.expected)

    def catch_up_request(self) -> list[bytes] | None:
        """The frames that ask for every batch from :attr:`expected` on even without a
        gap, unless a replay is in flight: a subscriber that connected late, or a quiet
        stream, learns of batches ZMQ's PUB dropped before the subscription reached it
        (it drops them silently; only a later batch would show the gap). The answers go
        to :meth:`replay` like a gap's."""
        if self._replay_from is not None:
            return None
        self._replay_from = self.expected
        return replay_request(self.expected)

    @property
    def replaying(self) -> bool:
        return self._replay_from is not None

    def replay(self, frames: Sequence[bytes]) -> list[CacheChange]:
        """One answer from the replay socket (a batch, or the end marker)."""
        msg = parse_replay(frames)
        if msg is None:
            self._replay_from = None
            # Whatever the replay did not bring, the publisher no longer has.
            return self.skip_gap() if self.gap else []
        out: list[CacheChange] = []
        if msg.sequence > self.expected:
            # The replay buffer starts after the first missing batch: those are lost.
            out += self._lose_until(min(msg.sequence, min(self._pending, default=msg.sequence)))
        return out + self._receive(msg.sequence, msg.payload)

    def skip_gap(self) -> list[CacheChange]:
        """Give up on the open gap (no replay socket, or it timed out) and on the replay in
        flight, if any: apply what waits."""
        self._replay_from = None
        if not self._pending:
            return []
        return self._lose_until(min(self._pending))

    # -- internals -------------------------------------------------------------------

    def _lose_until(self, sequence: int) -> list[CacheChange]:
        if sequence <= self.expected:
            return []
        self.lost.append(Gap(self.expected, sequence - 1))
        self.expected = sequence
        return self._drain()

    def _receive(self, sequence: int, payload: bytes) -> list[CacheChange]:
        if sequence < self.expected or sequence in self._pending:
            self.duplicates += 1
            return []
        batch = decode_batch(payload)
        if sequence > self.expected:
            self._pending[sequence] = batch
            if len(self._pending) > self.max_pending:
                return self.skip_gap()
            return []
        out = self._apply(batch)
        self.expected += 1
        return out + self._drain()

    def _drain(self) -> list[CacheChange]:
        out: list[CacheChange] = []
        while self.expected in self._pending:
            out += self._apply(self._pending.pop(self.expected))
            self.expected += 1
        if self._replay_from is not None and not self._pending:
            self._replay_from = None  # the gap is filled; the rest of the replay is duplicates
        return out

    def _apply(self, batch: Batch) -> list[CacheChange]:
        out = []
        for event in batch.events:
            change: CacheChange | None
            if isinstance(event, Stored):
                change = self._stored(event)
            elif isinstance(event, Removed):
                change = self._removed(event)
            elif isinstance(event, Cleared):
                self._pages.clear()
                change = CacheChange("cleared")
            else:
                self.ignored_events += 1
                change = None
            if change is not None:
                out.append(change)
        return out

    def _stored(self, event: Stored) -> CacheChange | None:
        medium = event.medium or MEDIUM_GPU
        if medium not in self.media:
            self.ignored_events += 1
            return None
        # A page of the event has event.block_size tokens: the server's page size, or
        # fewer for a partial page (mem_cache/events.py:241-262), which is never coalesced
        # with full ones (events.py:155-170).
        page, bs = event.block_size, self.block_size
        if page > self.page_size:
            raise SglangEventError(
                f"BlockStored.block_size: {page} is larger than the server's page size "
                f"{self.page_size}"
            )
        n, tokens = len(event.block_hashes), event.token_ids
        if n == 0 or not (n - 1) * page < len(tokens) <= n * page:
            raise SglangEventError(
                f"BlockStored.token_ids: {len(tokens)} tokens for {n} page(s) of {page}"
            )
        salt = _salt(event)
        prev: int | None = None
        position = 0
        chained = True
        if event.parent_block_hash is not None:
            parent = self._pages.get(event.parent_block_hash)
            if parent is None or not parent.complete or not parent.blocks:
                chained = False
            else:
                prev, position = parent.blocks[-1].key, parent.blocks[-1].position + 1
        out: list[Block] = []
        for i, h in enumerate(event.block_hashes):
            page_tokens = tokens[i * page : (i + 1) * page]
            known = self._pages.get(h)
            if known is not None:  # held already (another medium, or stored again)
                if medium not in known.media:
                    known.media.add(medium)
                chained = known.complete and bool(known.blocks)
                if chained:
                    prev, position = known.blocks[-1].key, known.blocks[-1].position + 1
                continue
            full = len(page_tokens) // bs
            if not chained:
                self.unkeyable_blocks += full
                continue
            blocks = []
            for j in range(full):
                key = chain_key(prev, page_tokens[j * bs : (j + 1) * bs], salt)
                blocks.append(Block(key, position, prev))
                prev, position = key, position + 1
            complete = len(page_tokens) == self.page_size
            self._pages[h] = _Page(tuple(blocks), complete, {medium})
            out += blocks
            chained = complete
        return CacheChange("stored", tuple(out)) if out else None

    def _removed(self, event: Removed) -> CacheChange | None:
        medium = event.medium or MEDIUM_GPU
        if medium not in self.media:
            self.ignored_events += 1
            return None
        out: list[Block] = []
        for h in event.block_hashes:
            known = self._pages.get(h)
            if known is None:
                continue  # never indexed (unkeyable, or stored before we listened)
            known.media.discard(medium)
            if not known.media:
                del self._pages[h]
                out += known.blocks
        return CacheChange("removed", tuple(out)) if out else None
