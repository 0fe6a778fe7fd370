"""Worker-level cache events on real ranks: the fold, parents, sequences, replay, resync, snapshots.

One engine of 4 gloo ranks with pool-level ids (workers 10 and 11, CP2 each)
and a replay buffer of 6 events, so that a subscriber can fall behind it.
The tests share the engine and run in order; each reads the sequence it
starts from instead of assuming one.
"""

from __future__ import annotations

import queue

import pytest

from vertumnus.core.lattice import Slot
from vertumnus.worker.blocks import Block, block_keys
from vertumnus.worker.engine import Engine
from vertumnus.worker.events import EventStream, WorkerEvent, WorkerGone
from vertumnus.worker.rank import RankSpec

from .conftest import random_tokens

BLOCK = 8
BUFFER = 6


@pytest.fixture(scope="module")
def engine():
    spec = RankSpec(dtype="float32", block_size=BLOCK, num_blocks=64, seed=7)
    with Engine(
        4, [Slot(10, 2, 0, 0), Slot(11, 2, 0, 2)], spec, max_tokens=512, event_buffer=BUFFER
    ) as e:
        yield e


def take(stream: EventStream, n: int) -> list[WorkerEvent]:
    return [stream.get(timeout=10) for _ in range(n)]


def assert_quiet(stream: EventStream) -> None:
    with pytest.raises(queue.Empty):
        stream.get(timeout=0.2)


def chain(keys: tuple[int, ...], positions: list[int]) -> list[Block]:
    return [Block(keys[j], j, keys[j - 1] if j else None) for j in positions]


def apply(served: dict[int, Block], event: WorkerEvent) -> None:
    """What a router does with one event."""
    if event.kind == "stored":
        served.update((b.key, b) for b in event.blocks)
    elif event.kind == "removed":
        for key in event.block_keys:
            served.pop(key, None)
    elif event.kind == "cleared":
        served.clear()


def regroup(engine: Engine, slots: list[Slot]) -> None:
    for w in list(engine.workers):
        engine.drain(w)
    engine.switch_epoch(engine.epoch + 1, slots)


def test_owner_rank_events_become_worker_events_with_parents_and_sequences_from_1(engine):
    with engine.subscribe(10) as ev10, engine.subscribe(11) as ev11:
        prompt = random_tokens(40, seed=1)  # 5 blocks: rank 0 owns 0, 2, 4; rank 1 owns 1, 3
        keys = block_keys(prompt, BLOCK)
        engine.prefill(10, "a", prompt)
        first, second = take(ev10, 2)
        assert (first.kind, first.sequence, first.rank, first.worker) == ("stored", 1, 0, 10)
        assert first.blocks == chain(keys, [0, 2, 4]) and first.parents[0] is None
        assert (second.sequence, second.rank, second.blocks) == (2, 1, chain(keys, [1, 3]))
        assert {first.incarnation, second.incarnation} == {engine.incarnation} and first.epoch == 1

        other = block_keys(random_tokens(24, seed=2), BLOCK)
        engine.prefill(11, "b", random_tokens(24, seed=2))
        assert [(e.sequence, e.rank, e.blocks) for e in take(ev11, 2)] == [
            (1, 2, chain(other, [0, 2])),  # worker 11 counts on its own, from 1
            (2, 3, chain(other, [1])),
        ]
        engine.evict_blocks(10, keys[3:])
        removed = ev10.get(timeout=10)
        assert (removed.kind, removed.sequence, removed.rank, removed.blocks) == (
            "removed",
            3,
            0,
            chain(keys, [4]),
        )
        assert ev10.get(timeout=10).blocks == chain(keys, [3])  # rank 1's removal: sequence 4
        assert_quiet(ev10)
        assert_quiet(ev11)


def test_flush_cache_drops_everything_with_one_cleared_event(engine):
    engine.prefill(11, "c", random_tokens(32, seed=3))
    before = engine.list_blocks(11)
    assert before.served
    with engine.subscribe(11, before.sequence) as ev:
        held = sum(len(b) for b in before.held.values())
        assert engine.flush_cache(11) == held
        cleared = ev.get(timeout=10)
        assert (cleared.kind, cleared.sequence, cleared.block_keys, cleared.rank) == (
            "cleared",
            before.sequence + 1,
            (),
            2,
        )
        assert_quiet(ev)
    after = engine.list_blocks(11)
    assert after.served == [] and all(not b for b in after.held.values())
    assert after.sequence == cleared.sequence
    assert (
        engine.flush_cache(11) == 0 and engine.list_blocks(11).sequence == cleared.sequence + 1
    )  # still announced


def test_a_subscriber_that_reconnects_gets_the_missed_events_from_the_buffer(engine):
    seen = engine.list_blocks(10).sequence
    with engine.subscribe(10, seen) as ev:
        engine.prefill(10, "d", random_tokens(8, seed=4))  # one block: one event
        last = ev.get(timeout=10).sequence  # then the subscriber goes away
    assert last == seen + 1
    engine.prefill(10, "e", random_tokens(24, seed=5))  # missed: sequences last+1, last+2
    with engine.subscribe(10, last) as again:
        assert [e.sequence for e in take(again, 2)] == [last + 1, last + 2]
        assert_quiet(again)
        engine.prefill(10, "f", random_tokens(8, seed=6))
        assert again.get(timeout=10).sequence == last + 3  # and then live ones


def test_history_the_buffer_no_longer_holds_starts_with_resync(engine):
    for i in range(BUFFER):  # push sequence 1 out of the buffer
        engine.prefill(10, f"g{i}", random_tokens(8, seed=100 + i))
    latest = engine.list_blocks(10).sequence
    assert latest > BUFFER
    with engine.subscribe(10, 0) as ev:
        resync = ev.get(timeout=10)
        assert (resync.kind, resync.sequence, resync.worker, resync.block_keys) == (
            "resync",
            latest,
            10,
            (),
        )
        assert resync.incarnation == engine.incarnation
        assert_quiet(ev)  # no replay after a resync: the subscriber takes a snapshot
        engine.prefill(10, "h", random_tokens(8, seed=200))
        assert ev.get(timeout=10).sequence == latest + 1
    with engine.subscribe(10, latest - BUFFER + 1) as ev:  # the oldest start the buffer can serve
        assert [e.sequence for e in take(ev, BUFFER)] == list(
            range(latest - BUFFER + 2, latest + 2)
        )
    for asked in (
        {"from_sequence": latest + 5},  # ahead of the worker: another worker's history
        {"from_sequence": latest, "incarnation": engine.incarnation ^ 1},  # another engine's
    ):
        with engine.subscribe(10, **asked) as ev:
            assert ev.get(timeout=10).kind == "resync"


def test_snapshot_then_later_events_equal_what_the_worker_serves_across_regroups(engine):
    prompt = random_tokens(40, seed=7)
    keys = block_keys(prompt, BLOCK)
    engine.flush_cache(10)
    engine.prefill(10, "p", prompt)  # CP2: rank 0 holds positions 0, 2, 4; rank 1 holds 1, 3
    gone = engine.subscribe(10, engine.list_blocks(10).sequence)
    regroup(
        engine, [Slot(20, 4, 0, 0)]
    )  # merge into CP4: rank 2 and 3 own positions 2 and 3, hold nothing
    with pytest.raises(
        WorkerGone, match=r"worker 10 \(CP2, ranks 0-1\) left the grouping in epoch"
    ):
        gone.get(timeout=10)
    gone.close()

    with engine.subscribe(20) as ev:
        # A new worker starts at sequence 1 with what it already serves: 0, 4 on rank 0, 1 on rank 1.
        initial = take(ev, 2)
        assert [(e.sequence, e.rank, e.blocks) for e in initial] == [
            (1, 0, chain(keys, [0, 4])),
            (2, 1, chain(keys, [1])),
        ]
        snapshot = engine.list_blocks(20)
        assert snapshot.sequence == 2 and snapshot.served == chain(keys, [0, 1, 4])
        assert snapshot.incarnation == engine.incarnation and snapshot.worker == 20

        engine.evict_blocks(
            20, [keys[2]]
        )  # held by rank 0, which no longer owns it: nothing to publish
        assert_quiet(ev)
        engine.evict_blocks(20, [keys[4]])
        out = engine.prefill(20, "again", prompt)  # reuses 0, 1; stores 2, 3, 4 on ranks 2, 3, 0
        assert out.cached_tokens == 2 * BLOCK
        later = take(ev, 4)
        assert [(e.kind, e.sequence, e.rank) for e in later] == [
            ("removed", 3, 0),
            ("stored", 4, 0),
            ("stored", 5, 2),
            ("stored", 6, 3),
        ]
        assert later[2].blocks == chain(keys, [2])
        served = {b.key: b for b in snapshot.served}
        for e in initial + later:
            if e.sequence > snapshot.sequence:
                apply(served, e)
        final = engine.list_blocks(20)
        assert final.sequence == 6
        assert sorted(served.values()) == sorted(final.served) == sorted(chain(keys, range(5)))

    # Ids reused by a later regroup are new workers: a history from before them resyncs.
    created = engine.epoch + 1
    regroup(engine, [Slot(10, 2, 0, 0), Slot(11, 2, 0, 2)])
    with engine.subscribe(10, 1, epoch=created - 1) as ev:
        assert ev.get(timeout=10).kind == "resync"
    with engine.subscribe(10, 0, epoch=created) as ev:
        assert ev.get(timeout=10).sequence == 1


def test_each_engine_start_draws_a_new_incarnation(engine):
    spec = RankSpec(dtype="float32", block_size=BLOCK, num_blocks=8)
    incarnations = {engine.incarnation}
    for _ in range(2):
        with Engine(1, [1], spec) as restarted:
            incarnations.add(restarted.incarnation)
            restarted.prefill(0, "x", random_tokens(8, seed=9))
            with restarted.subscribe(0) as ev:
                first = ev.get(timeout=10)
            assert (first.sequence, first.incarnation) == (1, restarted.incarnation)
            assert restarted.list_blocks(0).incarnation == restarted.incarnation
    assert len(incarnations) == 3 and 0 not in incarnations
