"""``vertumnus.gcpauses``: each collection of the process's cyclic collector, timed."""

from __future__ import annotations

import gc
import itertools

import pytest

from vertumnus.gcpauses import CollectorPauses


def test_a_full_collection_is_timed_while_started_and_only_then():
    pauses = CollectorPauses()
    gc.collect()
    assert pauses.drain() == []  # not started
    pauses.start()
    pauses.start()  # idempotent: one callback
    try:
        gc.collect()
        got = pauses.drain()
    finally:
        pauses.stop()
    full = [s for g, s in got if g == 2]
    assert len(full) == 1 and full[0] >= 0.0
    assert pauses.drain() == []  # drained
    gc.collect()
    assert pauses.drain() == []  # stopped
    pauses.stop()  # idempotent


def test_the_pause_is_read_on_the_given_clock():
    ticks = itertools.count(step=0.25)
    pauses = CollectorPauses(clock=lambda: next(ticks))
    pauses.start()
    try:
        gc.collect()
    finally:
        pauses.stop()
    assert (2, 0.25) in pauses.drain()


def test_what_waits_to_be_drained_is_bounded():
    pauses = CollectorPauses(keep=3)
    pauses.start()
    try:
        for _ in range(5):
            gc.collect()
    finally:
        pauses.stop()
    assert len(pauses.drain()) == 3
    with pytest.raises(ValueError, match="keep"):
        CollectorPauses(keep=0)
