"""SGLang KV events, decoded from messages built exactly as SGLang 0.5.23 builds them.

CI does not install SGLang, so the fixtures are made with msgpack from its format,
each builder citing the line of ``sglang/srt/disaggregation/kv_events.py`` (0.5.23
wheel) it follows: ``EventBatch`` is ``array_like`` (233-240), so ``[ts, events,
attn_dp_rank]``; events are ``tag=True`` msgspec structs (243-258), so maps whose
``type`` is the class name, with fields in declaration order (279-304) and optional
fields at their default omitted (``omit_defaults``). The older positional encoding
(``array_like=True`` on the event too) is the tag followed by the fields in order.
"""

from __future__ import annotations

import threading
import time

import msgpack
import pytest

from vertumnus.core.keys import token_block_keys
from vertumnus.worker.blocks import Block
from vertumnus.worker.sglang import events as ev
from vertumnus.worker.sglang.events import CacheChange, Gap, SglangEventDecoder, SglangEventError

B = 16  # our block size = the server's --page-size
END = (-1).to_bytes(8, "big", signed=True)  # ZmqEventPublisher.END_SEQ (kv_events.py:416)


# -- SGLang's wire format ------------------------------------------------------------


def stored(hashes, parent, tokens, page=B, *, medium="GPU", encoding="map", **optional):
    """BlockStored (kv_events.py:279-296): lora_id has no default, so it is always sent;
    medium and the rest only when set (omit_defaults)."""
    if encoding == "array":  # the older tagged array: tag, then the fields in order
        return ["BlockStored", list(hashes), parent, list(tokens), page, None]
    out = {
        "type": "BlockStored",
        "block_hashes": list(hashes),
        "parent_block_hash": parent,
        "token_ids": list(tokens),
        "block_size": page,
        "lora_id": None,
    }
    if medium is not None:
        out["medium"] = medium
    out.update(optional)
    return out


def removed(hashes, *, medium="GPU", encoding="map"):
    """BlockRemoved (kv_events.py:298-300)."""
    if encoding == "array":
        return ["BlockRemoved", list(hashes)]
    out = {"type": "BlockRemoved", "block_hashes": list(hashes)}
    if medium is not None:
        out["medium"] = medium
    return out


def cleared(encoding="map"):
    """AllBlocksCleared (kv_events.py:303-304): a tag and no field."""
    return ["AllBlocksCleared"] if encoding == "array" else {"type": "AllBlocksCleared"}


def batch(*events, ts=1700000000.5, dp_rank=0, old=False):
    """EventBatch [ts, events, attn_dp_rank] (kv_events.py:233-240; older: [ts, events])."""
    return msgpack.packb([ts, list(events)] if old else [ts, list(events), dp_rank])


def live(seq, payload, topic=b""):
    """A PUB message: (topic, 8-byte big-endian sequence, payload) (kv_events.py:617-620)."""
    return [topic, seq.to_bytes(8, "big"), payload]


def replayed(seq, payload, topic=b"", old=False):
    """A replay answer as a DEALER receives it (kv_events.py:643-646); older: no topic."""
    if old:
        return [b"", seq.to_bytes(8, "big"), payload]
    return [b"", topic, seq.to_bytes(8, "big"), payload]


def replay_end(old=False):
    """The end marker (kv_events.py:648); older: [b"", END, b""]."""
    return [b"", END, b""] if old else [b"", b"", END, b""]


def tokens(n, seed=1):
    return [(seed * 7919 + 31 * i) % 50000 for i in range(n)]


def stored_keys(changes):
    return [b.key for c in changes if c.kind == "stored" for b in c.blocks]


# -- decoding ------------------------------------------------------------------------


@pytest.mark.parametrize("encoding", ["map", "array"])
def test_rekeyed_blocks_match_the_routers_keys_across_coalesced_events(encoding):
    """A 100-token prompt's 6 full pages, published as a coalesced event of 4 (root
    first) and a later one of 2 whose parent is the 4th page's hash: our keys are
    token_block_keys over the tokens, positions and parents chain."""
    t = tokens(100)
    d = SglangEventDecoder(B)
    e1 = stored([-11, 12, -13, 14], None, t[:64], encoding=encoding)
    e2 = stored([15, -16], 14, t[64:96], encoding=encoding)
    out = d.live(live(0, batch(e1))) + d.live(live(1, batch(e2)))
    keys = token_block_keys(t, B)
    assert len(keys) == 6 and stored_keys(out) == list(keys)
    blocks = [b for c in out for b in c.blocks]
    assert [b.position for b in blocks] == list(range(6))
    assert [b.parent for b in blocks] == [None, *keys[:5]]
    assert d.served() == blocks


def test_a_page_of_several_blocks_becomes_several_blocks():
    t = tokens(64, seed=3)
    d = SglangEventDecoder(B, page_size=32)
    (change,) = d.live(live(0, batch(stored([1, 2], None, t, page=32))))
    assert [b.key for b in change.blocks] == list(token_block_keys(t, B))


def test_a_partial_page_keys_its_full_blocks_and_ends_the_chain():
    t = tokens(48, seed=4)
    d = SglangEventDecoder(B, page_size=32)
    out = d.live(
        live(0, batch(stored([1], None, t[:32], page=32), stored([2], 1, t[32:], page=16)))
    )
    assert stored_keys(out) == list(token_block_keys(t, B))  # 2 + 1 blocks
    # A page after the partial one cannot be placed: its parent did not end on a page.
    assert d.live(live(1, batch(stored([3], 2, tokens(32, 9), page=32)))) == []
    assert d.unkeyable_blocks == 2


def test_removed_and_cleared_name_the_same_keys():
    t = tokens(48)
    d = SglangEventDecoder(B)
    d.live(live(0, batch(stored([1, 2, 3], None, t))))
    (gone,) = d.live(live(1, batch(removed([3, 2]))))
    keys = token_block_keys(t, B)
    assert gone.kind == "removed" and [b.key for b in gone.blocks] == [keys[2], keys[1]]
    assert [b.parent for b in gone.blocks] == [keys[1], keys[0]]
    assert d.live(live(2, batch(cleared()))) == [CacheChange("cleared")]
    assert d.served() == []


def test_the_older_positional_encoding_decodes_like_the_map_one():
    t = tokens(32)
    for enc in ("map", "array"):
        raw = msgpack.unpackb(batch(stored([5, 6], None, t, encoding=enc)), raw=False)
        (event,) = ev.decode_batch(msgpack.packb(raw)).events
        assert event == ev.Stored((5, 6), None, tuple(t), B, None, "GPU" if enc == "map" else None)
    assert ev.decode_event(removed([1], encoding="array")) == ev.Removed((1,))
    assert ev.decode_event(cleared("array")) == ev.Cleared()
    old = ev.decode_batch(batch(cleared(), old=True))
    assert old.dp_rank is None and old.events == (ev.Cleared(),)


def test_only_the_served_media_count():
    t = tokens(32)
    d = SglangEventDecoder(B)  # the GPU cache only
    assert d.live(live(0, batch(stored([1, 2], None, t, medium="CPU_PINNED")))) == []
    assert d.ignored_events == 1
    both = SglangEventDecoder(B, media=("GPU", "CPU_PINNED"))
    (s,) = both.live(live(0, batch(stored([1, 2], None, t))))
    assert both.live(live(1, batch(stored([1, 2], None, t, medium="CPU_PINNED")))) == []
    # Evicted from the GPU to host memory: still served from one medium.
    assert both.live(live(2, batch(removed([1, 2])))) == []
    (r,) = both.live(live(3, batch(removed([2, 1], medium="CPU_PINNED"))))
    assert sorted(b.key for b in r.blocks) == sorted(b.key for b in s.blocks)


def test_salted_pages_get_their_own_key_space():
    t = tokens(16)
    plain = SglangEventDecoder(B).live(live(0, batch(stored([1], None, t))))
    salty = SglangEventDecoder(B).live(live(0, batch(stored([1], None, t, cache_salt="tenant"))))
    assert stored_keys(plain) == list(token_block_keys(t, B))
    assert stored_keys(salty) != stored_keys(plain)


def test_unknown_parents_and_unknown_event_types_are_counted_not_guessed():
    d = SglangEventDecoder(B)
    assert d.live(live(0, batch(stored([7, 8], 999, tokens(32))))) == []
    assert d.unkeyable_blocks == 2
    assert d.live(live(1, batch({"type": "KvFuture", "x": 1}))) == []
    assert d.ignored_events == 1
    assert d.live(live(2, batch(removed([7])))) == []  # never indexed: nothing to remove


# -- sequences, gaps, replays ---------------------------------------------------------


def test_a_gap_waits_for_the_replay_and_applies_in_order():
    t = tokens(48)
    pages = [stored([1], None, t[:16]), stored([2], 1, t[16:32]), stored([3], 2, t[32:])]
    d = SglangEventDecoder(B)
    assert len(d.live(live(0, batch(pages[0])))) == 1
    assert d.live(live(2, batch(pages[2]))) == []  # parent (seq 1) not here yet
    assert d.gap == Gap(1, 1)
    request = d.replay_request()
    assert request == [b"", (1).to_bytes(8, "big")]  # ROUTER sees [id, b"", start]
    assert d.replay_request() is None  # one in flight
    out = d.replay(replayed(1, batch(pages[1])))
    assert stored_keys(out) == list(token_block_keys(t, B)[1:])  # seq 1, then the waiting 2
    assert d.replay(replayed(2, batch(pages[2]))) == []  # also arrived live
    assert d.replay(replay_end()) == []
    assert d.gap is None and d.duplicates == 1 and not d.stale and d.expected == 3


def test_a_late_subscriber_replays_from_the_first_sequence():
    t = tokens(64)
    pages = [stored([i + 1], i or None, t[16 * i : 16 * i + 16]) for i in range(4)]
    d = SglangEventDecoder(B)
    assert d.live(live(3, batch(pages[3]))) == []  # 0-2 went out before we connected
    assert d.gap == Gap(0, 2) and d.replay_request() == [b"", bytes(8)]
    out = []
    for seq in range(4):
        out += d.replay(replayed(seq, batch(pages[seq]), old=seq % 2 == 1))
    out += d.replay(replay_end(old=True))
    assert stored_keys(out) == list(token_block_keys(t, B))


def test_a_gap_the_replay_buffer_no_longer_holds_is_lost_until_a_reset():
    t = tokens(48)
    d = SglangEventDecoder(B)
    d.live(live(0, batch(stored([1], None, t[:16]))))
    d.live(live(5, batch(stored([9], None, t[16:32]))))
    d.replay_request()
    # The publisher's buffer starts at 3: batches 1 and 2 are gone.
    d.replay(replayed(3, batch(removed([1]))))
    assert d.lost == [Gap(1, 2)] and d.stale and d.gap == Gap(4, 4)
    d.replay(replayed(4, batch()))
    assert d.gap is None and d.expected == 6
    assert d.reset() == [CacheChange("cleared")]
    assert not d.stale and d.served() == [] and d.expected == 0


def test_without_a_replay_socket_a_gap_is_skipped():
    d = SglangEventDecoder(B)
    d.live(live(2, batch(stored([1], None, tokens(16)))))
    (change,) = d.skip_gap()
    assert change.kind == "stored" and d.lost == [Gap(0, 1)]


def test_too_much_held_behind_a_gap_gives_it_up():
    d = SglangEventDecoder(B, max_pending=2)
    d.live(live(1, batch()))
    d.live(live(2, batch()))
    assert d.gap == Gap(0, 0)
    d.live(live(3, batch(stored([1], None, tokens(16)))))
    assert d.gap is None and d.lost == [Gap(0, 0)] and d.expected == 4


def test_a_replay_that_ends_without_the_gap_loses_it():
    d = SglangEventDecoder(B)
    d.live(live(3, batch()))
    d.replay_request()
    assert d.replay(replay_end()) == [] and d.lost == [Gap(0, 2)] and d.expected == 4


# -- malformed input -------------------------------------------------------------------


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: ev.parse_live([b"", b"x"]), "live message: expected 3 frames"),
        (lambda: ev.parse_live([b"", b"123", b""]), "sequence frame has 8 bytes"),
        (lambda: ev.parse_replay([b"x", b"", END, b""]), "replay message"),
        (lambda: ev.decode_batch(b"\xc1"), "payload: not msgpack"),
        (lambda: ev.decode_batch(msgpack.packb({"ts": 1})), "EventBatch: expected"),
        (lambda: ev.decode_batch(msgpack.packb(["x", []])), "EventBatch.ts"),
        (lambda: ev.decode_event({"block_hashes": [1]}), "'type' key"),
        (lambda: ev.decode_event({"type": "BlockRemoved"}), "BlockRemoved.block_hashes"),
        (
            lambda: ev.decode_event(stored([1], None, ["a"] * 16)),
            r"BlockStored.token_ids\[0\]",
        ),
        (lambda: ev.decode_event(stored([1], None, [1], page=0)), "BlockStored.block_size"),
        (lambda: ev.decode_event(["BlockRemoved", [1], "GPU", 3]), "at most 2 fields"),
        (lambda: SglangEventDecoder(16, page_size=8), "page_size: SGLang's page size 8"),
        (lambda: ev.replay_request(-1), "replay start"),
    ],
)
def test_malformed_input_names_the_field(call, match):
    with pytest.raises(SglangEventError, match=match):
        call()


def test_inconsistent_stored_events_are_refused():
    d = SglangEventDecoder(B)
    with pytest.raises(SglangEventError, match="larger than the server's page size 16"):
        d.live(live(0, batch(stored([1], None, tokens(32), page=32))))
    with pytest.raises(SglangEventError, match="BlockStored.token_ids: 40 tokens for 2 page"):
        SglangEventDecoder(B).live(live(0, batch(stored([1, 2], None, tokens(40)))))


def test_bigram_pages_use_each_pairs_first_token():
    t = tokens(17)
    pairs = [[t[j], t[j + 1]] for j in range(16)]  # mem_cache/events.py:245-248
    (change,) = SglangEventDecoder(B).live(live(0, batch(stored([1], None, pairs))))
    assert [b.key for b in change.blocks] == list(token_block_keys(t[:16], B))
    assert change.blocks == (Block(token_block_keys(t[:16], B)[0], 0, None),)


# -- over real sockets -------------------------------------------------------------------


def _stand_in_publisher(router, buffer, stop):
    """A publisher that speaks SGLang's protocol (kv_events.py:617-648): answers replay
    requests [id, b"", start] with every buffered batch >= start, then the end marker.
    Owns ``router`` (bound by the caller, handed over when the thread starts)."""
    try:
        while not stop.is_set():
            if router.poll(20):
                ident, _, start = router.recv_multipart()
                for seq, payload in buffer:
                    if seq >= int.from_bytes(start, "big"):
                        router.send_multipart([ident, b"", b"", seq.to_bytes(8, "big"), payload])
                router.send_multipart([ident, b"", b"", END, b""])
    finally:
        router.close(linger=0)


def test_the_subscriber_replays_what_it_missed_over_zmq():
    zmq = pytest.importorskip("zmq", reason="the subscriber needs pyzmq (the sglang extra)")
    from vertumnus.worker.sglang.subscriber import SglangEventSubscriber

    ctx = zmq.Context()
    try:
        pub = ctx.socket(zmq.PUB)
        pub_port = pub.bind_to_random_port("tcp://127.0.0.1")
        router = ctx.socket(zmq.ROUTER)
        replay_port = router.bind_to_random_port("tcp://127.0.0.1")
        t = tokens(64)
        payloads = [batch(stored([i + 1], i or None, t[16 * i : 16 * i + 16])) for i in range(4)]
        stop = threading.Event()
        server = threading.Thread(
            target=_stand_in_publisher, args=(router, list(enumerate(payloads)), stop)
        )
        server.start()
        try:
            for seq in range(3):  # published before anyone listens: lost to the PUB socket
                pub.send_multipart(live(seq, payloads[seq]))
            sub = SglangEventSubscriber(
                SglangEventDecoder(B),
                f"tcp://127.0.0.1:{pub_port}",
                f"tcp://127.0.0.1:{replay_port}",
                context=ctx,
            )
            out: list[CacheChange] = []
            deadline = time.monotonic() + 10
            while len(stored_keys(out)) < 4 and time.monotonic() < deadline:
                pub.send_multipart(live(3, payloads[3]))  # repeated until the SUB is connected
                out += sub.poll(0.05)
            assert stored_keys(out) == list(token_block_keys(t, B))
            assert not sub.decoder.stale and sub.decoder.expected == 4
            sub.close()
        finally:
            stop.set()
            server.join(timeout=5)
    finally:
        ctx.destroy(linger=0)  # closes whatever is still open; never blocks
