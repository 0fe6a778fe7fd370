"""The load board (``vertumnus.router.loadboard``): replicas see each other's outstanding work.

Two and three boards on one real ``redis-server``, as router replicas of one
pool would be; expiry is tested with a short time to live.
"""

from __future__ import annotations

import itertools
import os
import time

import pytest

if os.environ.get("VERTUMNUS_SKIP_REDIS") == "1":
    pytest.skip(
        "VERTUMNUS_SKIP_REDIS=1: the tests against a real redis-server are skipped",
        allow_module_level=True,
    )

from vertumnus.router.loadboard import RedisLoadBoard  # noqa: E402
from vertumnus.router.redis_conn import RedisUnavailableError  # noqa: E402
from vertumnus.router.redis_store import key_prefix  # noqa: E402

_ns = itertools.count()


def boards(server, *replicas, ttl_s=2.0, namespace=None):
    ns = namespace or f"board-{next(_ns)}"
    return [RedisLoadBoard(server.client(), ns, r, ttl_s=ttl_s) for r in replicas]


def test_each_replica_reads_the_sum_of_the_others_not_its_own(redis_server):
    a, b, c = boards(redis_server, "router-a", "router-b", "router-c")
    assert a.others() == {}
    a.publish({0: 1.5, 1: 0.25})
    b.publish({1: 2.0, 7: 0.125})
    assert a.others() == {1: 2.0, 7: 0.125}
    assert b.others() == {0: 1.5, 1: 0.25}
    assert c.others() == {0: 1.5, 1: 2.25, 7: 0.125}
    assert c.exchange({0: 3.0}) == {0: 1.5, 1: 2.25, 7: 0.125}
    assert a.others() == {0: 3.0, 1: 2.0, 7: 0.125}


def test_a_publish_replaces_the_replicas_whole_entry(redis_server):
    a, b = boards(redis_server, "a", "b")
    a.publish({0: 1.0, 1: 1.0})
    a.publish({1: 0.5})  # worker 0's work finished: it is gone, not left at 1.0
    assert b.others() == {1: 0.5}
    a.publish({})  # alive, with nothing outstanding
    assert b.others() == {}


def test_a_replica_that_stops_publishing_expires(redis_server):
    a, b = boards(redis_server, "a", "b", ttl_s=0.25)
    a.publish({3: 4.0})
    b.publish({3: 1.0})
    assert b.others() == {3: 4.0}
    deadline = time.monotonic() + 0.2
    while time.monotonic() < deadline:  # a live replica keeps its entry by publishing
        b.publish({3: 1.0})
        time.sleep(0.05)
    a.publish({3: 4.0})
    time.sleep(0.4)  # a dies; b is past its ttl too
    assert b.others() == {} and a.others() == {}
    # Nothing is left behind once every replica is gone (the keys expire too).
    client = redis_server.client()
    assert list(client.scan_iter(match=key_prefix(a.namespace) + "*")) == []


def test_withdraw_takes_the_entry_off_at_once(redis_server):
    a, b = boards(redis_server, "a", "b")
    a.publish({0: 9.0})
    a.withdraw()
    assert b.others() == {}


def test_boards_of_two_namespaces_never_mix(redis_server):
    (a,) = boards(redis_server, "a", namespace="pool-1")
    (b,) = boards(redis_server, "b", namespace="pool-2")
    a.publish({0: 1.0})
    assert b.others() == {}


def test_bad_arguments_are_refused_with_the_reason(redis_server):
    client = redis_server.client()
    with pytest.raises(ValueError, match="replica_id"):
        RedisLoadBoard(client, "pool", "")
    with pytest.raises(ValueError, match="ttl_s"):
        RedisLoadBoard(client, "pool", "a", ttl_s=0)
    with pytest.raises(ValueError, match="brace"):
        RedisLoadBoard(client, "po{ol", "a")
    (a,) = boards(redis_server, "a")
    with pytest.raises(ValueError, match="worker 2 must be finite seconds >= 0"):
        a.publish({2: float("nan")})
    with pytest.raises(ValueError, match="worker 2"):
        a.publish({2: -1.0})


def test_a_board_whose_server_is_down_says_which(tmp_path):
    from tests.redis_server import RedisServer

    server = RedisServer(tmp_path / "down").start()
    board = RedisLoadBoard(server.client(), "pool", "a")
    board.publish({0: 1.0})
    server.kill()
    with pytest.raises(RedisUnavailableError, match=f"127.0.0.1:{server.port}.*load board publish"):
        board.publish({0: 1.0})
