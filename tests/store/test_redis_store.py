"""What only the Redis store must get right: sharing, namespaces, atomicity, restarts, credentials.

Everything runs against a real ``redis-server`` (``tests/redis_server.py``);
the contract and property suites (``test_contract.py``, ``test_properties.py``)
cover the index's semantics for this store too.
"""

from __future__ import annotations

import os
import time
from typing import Any

import pytest

if os.environ.get("VERTUMNUS_SKIP_REDIS") == "1":
    pytest.skip(
        "VERTUMNUS_SKIP_REDIS=1: the tests against a real redis-server are skipped",
        allow_module_level=True,
    )

import redis  # noqa: E402 - after the skip: without redis-py these tests are skipped or fail here
from redis.crc import key_slot  # noqa: E402

from tests.redis_server import RedisServer  # noqa: E402
from tests.store.test_contract import A, B, chain  # noqa: E402
from vertumnus.core.store import StoreError  # noqa: E402
from vertumnus.router.redis_conn import (  # noqa: E402
    RedisConfigError,
    RedisCredentialsError,
    RedisUnavailableError,
    parse_redis_url,
    redis_client,
)
from vertumnus.router.redis_store import RedisTrieStore  # noqa: E402

_ns = iter(range(1_000_000))


def fresh_namespace(tag: str = "t") -> str:
    return f"redis-only/{tag}-{next(_ns)}"


def namespace_dump(client: redis.Redis, store: RedisTrieStore) -> dict[bytes, Any]:
    """Every key of ``store`` with its whole content."""
    out: dict[bytes, Any] = {}
    for key in client.scan_iter(match=store.key_prefix + "*", count=1000):
        kind = client.type(key)
        if kind == b"hash":
            out[key] = client.hgetall(key)
        elif kind == b"set":
            out[key] = sorted(client.smembers(key))
        elif kind == b"stream":
            out[key] = client.xrange(key)
        else:
            out[key] = (kind, client.dump(key))
    return out


class CountingClient:
    """A client proxy counting the commands (round trips) the store sends."""

    def __init__(self, client: redis.Redis) -> None:
        self._client = client
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if not callable(attr):
            return attr

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            return attr(*args, **kwargs)

        return counted


def test_two_store_objects_share_one_index_and_the_second_follows_the_first(redis_server):
    ns = fresh_namespace("shared")
    first = RedisTrieStore(redis_server.client(), ns)
    second = RedisTrieStore(redis_server.client(), ns)  # another router replica
    cursor, log = second.changes(0)
    assert (cursor, log) == (0, [])

    first.apply(0, chain(A))
    first.apply(1, chain(B))
    assert dict(second.matched_blocks(A)) == {0: 4, 1: 2}
    assert len(second) == 5 and sorted(second.workers()) == [0, 1]
    cursor, log = second.changes(cursor)
    # stored: what the worker gained (worker 1 held none of B, so all of it).
    assert cursor == 2 and [(c.cursor, c.worker, c.stored) for c in log] == [(1, 0, A), (2, 1, B)]

    second.apply(0, removed=[A[3]])  # and the other way round
    cursor2, log2 = first.changes(cursor)
    assert cursor2 == 3 and log2[0].removed == (A[3],) and log2[0].gone[0][0] == A[3]
    assert first.block(A[3]) is None and dict(first.matched_blocks(A)) == {0: 3, 1: 2}


def test_namespaces_never_see_each_other_and_each_is_one_cluster_slot(redis_server):
    client = redis_server.client()
    a = RedisTrieStore(client, fresh_namespace("pool-a/qwen3"))
    b = RedisTrieStore(client, fresh_namespace("pool-b/qwen3"))
    a.apply(0, chain(A))
    b.apply(0, chain(A, 2))
    b.apply(1, chain(B))
    assert dict(a.matched_blocks(B)) == {0: 2} and dict(b.matched_blocks(A)) == {0: 2, 1: 2}
    assert len(a) == 4 and len(b) == 3 and a.cursor == 1 and b.cursor == 2
    a.drop_worker(0)
    assert len(a) == 0 and dict(b.matched_blocks(A)) == {0: 2, 1: 2}
    for store in (a, b):
        keys = list(namespace_dump(client, store))
        assert keys and all(k.startswith(store.key_prefix.encode()) for k in keys)
        assert len({key_slot(k) for k in keys}) == 1, "a store's keys must share one hash slot"
    assert a.key_prefix.startswith("vt:{") and a.key_prefix.endswith("}:")


@pytest.mark.parametrize("bad", ["", "pool{a}", "pool}", "po\nol"])
def test_a_bad_namespace_is_refused_with_the_reason(redis_server, bad):
    with pytest.raises(ValueError, match="empty|brace|unprintable"):
        RedisTrieStore(redis_server.client(), bad)


def test_a_refused_batch_leaves_nothing_behind(redis_server):
    client = redis_server.client()
    s = RedisTrieStore(client, fresh_namespace("refused"), log_limit=4)
    s.apply(0, chain(A))
    s.apply(1, [(B[2], 2, None)])
    before = namespace_dump(client, s)
    refused = [
        dict(stored=chain(B) + [(A[3], 1, A[0])]),  # the last item contradicts the index
        dict(stored=[(77, 3, None), (77, 4, None)]),  # the batch contradicts itself
        dict(stored=[(B[2], 2, B[1]), (B[2], 2, 77)], cleared=True),  # after a clear
        dict(stored=[(5, 0, None), (6, 1, 5), (B[2], 0, None)], removed=[A[0]], cleared=True),
        dict(stored=[(A[0], 0, 99)]),
    ]
    for batch in refused:
        with pytest.raises(StoreError, match="worker 0: block 0x"):
            s.apply(0, **batch)
        assert namespace_dump(client, s) == before, batch


def test_every_operation_is_one_round_trip(redis_server):
    counting = CountingClient(redis_server.client())
    s = RedisTrieStore(counting, fresh_namespace("trips"))
    s.apply(0, chain(A))  # loads the apply script (NOSCRIPT, SCRIPT LOAD, EVALSHA)
    s.matched_blocks(A)
    s.path(A)
    s.changes(0)
    for name, call in [
        ("apply", lambda: s.apply(1, chain(B), removed=[A[3]])),
        ("refused apply", lambda: pytest.raises(StoreError, s.apply, 1, [(A[3], 0, None)])),
        ("drop_worker", lambda: s.drop_worker(1)),
        ("matched_blocks", lambda: s.matched_blocks(A + B)),
        ("path", lambda: s.path(A)),
        ("changes", lambda: s.changes(0)),
        ("block", lambda: s.block(A[1])),
        ("blocks", lambda: s.blocks(A + B + (12345,))),
        ("holders", lambda: s.holders(A[1])),
        ("children", lambda: s.children(A[1])),
        ("worker_keys", lambda: s.worker_keys(0)),
        ("workers", lambda: s.workers()),
        ("len", lambda: len(s)),
        ("cursor", lambda: s.cursor),
    ]:
        counting.calls.clear()
        call()
        assert len(counting.calls) == 1, (name, counting.calls)


def test_blocks_reads_many_blocks_at_once(redis_server):
    s = RedisTrieStore(redis_server.client(), fresh_namespace("blocks"))
    s.apply(0, chain(A))
    s.apply(1, [(B[2], 2, B[1])])
    got = s.blocks([*A, B[2], 999])
    assert sorted(got) == sorted([*A, B[2]])
    assert all(got[k] == s.block(k) for k in got)
    assert got[B[2]].holders == {1} and got[B[2]].parent == B[1] and got[A[0]].parent is None
    assert s.blocks([]) == {}


def test_matched_blocks_over_a_long_chain_with_many_holders(redis_server):
    """The leading-run rule on a 256-block chain: a worker missing block i stops
    there, even if it holds deeper blocks."""
    s = RedisTrieStore(redis_server.client(), fresh_namespace("long"))
    keys = tuple(range(1000, 1256))
    items = [(k, i, keys[i - 1] if i else None) for i, k in enumerate(keys)]
    for w in range(8):
        s.apply(w, items[: 32 * (w + 1)])
    s.apply(9, items[:10] + items[11:])  # a gap at position 10
    assert dict(s.matched_blocks(keys)) == {**{w: 32 * (w + 1) for w in range(8)}, 9: 10}
    assert [b.key for b in s.path(keys + (1,))] == list(keys)
    assert s.path(keys)[-1].holders == frozenset({7, 9})


def test_a_batch_of_many_blocks_and_its_drop(redis_server):
    """Lua's unpack() is bounded (~8000 values): big batches are written in chunks."""
    s = RedisTrieStore(redis_server.client(), fresh_namespace("big"))
    n = 12_000
    items = [(10_000 + i, i, 10_000 + i - 1 if i else None) for i in range(n)]
    t0 = time.monotonic()
    s.apply(3, items)
    assert len(s) == n and len(s.worker_keys(3)) == n
    assert dict(s.matched_blocks([k for k, _, _ in items[:300]])) == {3: 300}
    s.drop_worker(3)
    assert len(s) == 0 and s.workers() == frozenset()
    _, log = s.changes(0)
    assert len(log[-1].gone) == n and log[-1].dropped
    assert time.monotonic() - t0 < 20


def test_a_client_that_decodes_responses_gets_the_same_answers(redis_server):
    ns = fresh_namespace("decoded")
    raw = RedisTrieStore(redis_server.client(), ns)
    text = RedisTrieStore(redis_server.client(decode_responses=True), ns)
    raw.apply(0, chain(A))
    text.apply(1, chain(B), removed=[])
    for s in (raw, text):
        assert dict(s.matched_blocks(A)) == {0: 4, 1: 2}
        assert s.block(A[1]).holders == {0, 1} and s.block(B[2]).parent == B[1]
        assert [b.key for b in s.path(B)] == list(B)
        assert s.children(A[1]) == {A[2], B[2]} and s.workers() == {0, 1}
    assert raw.changes(0) == text.changes(0)
    with pytest.raises(StoreError, match="position 3"):
        text.apply(2, [(A[3], 1, None)])


def test_a_follower_whose_cursor_belongs_to_an_earlier_store_must_resynchronise(redis_server):
    client = redis_server.client()
    ns = fresh_namespace("reset")
    writer, follower = RedisTrieStore(client, ns), RedisTrieStore(client, ns)
    writer.apply(0, chain(A))
    writer.apply(1, chain(B))
    cursor, _ = follower.changes(0)
    assert follower.incarnation is not None
    # The namespace is wiped (a flush, or a restart without persistence) and
    # written again, past the follower's cursor.
    client.delete(*client.scan_iter(match=writer.key_prefix + "*"))
    for w in range(4):
        writer.apply(w, chain(B))
    assert writer.cursor > cursor
    assert follower.changes(cursor) == (writer.cursor, None)
    # Resynchronised: it follows again from the store's cursor.
    now, log = follower.changes(writer.cursor)
    assert log == []
    assert follower.changes(now + 5) == (now, None)  # a cursor ahead of the store


def test_a_restarted_redis_server(tmp_path):
    server = RedisServer(tmp_path / "restart").start()
    try:
        ns = "restart"
        writer = RedisTrieStore(server.client(), ns)
        follower = RedisTrieStore(server.client(), ns)
        writer.apply(0, chain(A))
        cursor, _ = follower.changes(0)
        generation = writer.block(A[0]).generation

        server.kill()
        where = f"127.0.0.1:{server.port}"
        t0 = time.monotonic()
        for name, call in [
            ("apply", lambda: writer.apply(0, chain(B))),
            ("matched_blocks", lambda: follower.matched_blocks(A)),
            ("len", lambda: len(writer)),
            ("changes", lambda: follower.changes(cursor)),
        ]:
            with pytest.raises(RedisUnavailableError, match=f"{where}.*unavailable.*{name}"):
                call()
        assert time.monotonic() - t0 < 5, (
            "a down server must fail fast (short timeouts, no backoff)"
        )

        server.start()
        # No persistence: the index is empty, and filling it again is the router's
        # job (it re-synchronises each worker from its ListBlocks snapshot).
        assert len(writer) == 0 and writer.cursor == 0
        writer.apply(0, chain(A))  # the scripts are loaded again (NOSCRIPT)
        assert dict(follower.matched_blocks(A)) == {0: 4}
        assert follower.changes(cursor)[1] is None  # a new incarnation: resynchronise
        # A block back after the restart is a new incarnation of it, whose
        # generation it never had (they count from the server clock).
        assert writer.block(A[0]).generation > generation
    finally:
        server.stop()


# -- connections and credentials ------------------------------------------------------


def test_a_url_with_a_password_is_refused_and_the_message_says_where_it_goes():
    for url in ("redis://:hunter2@127.0.0.1:6379/0", "redis://alice:hunter2@cache:6380/1"):
        with pytest.raises(RedisConfigError, match="VERTUMNUS_REDIS_PASSWORD_FILE") as info:
            redis_client(url, environ={})
        assert "hunter2" not in str(info.value) and "***" in str(info.value)


@pytest.mark.parametrize(
    ("url", "error"),
    [
        ("http://127.0.0.1:6379/0", "scheme"),
        ("redis:///0", "no host"),
        ("redis://127.0.0.1:99999/0", "bad Redis URL"),
        ("redis://127.0.0.1:6379/zero", "database number"),
        ("redis://127.0.0.1:6379/0?password=x", "query options"),
    ],
)
def test_a_bad_url_is_refused_with_the_reason(url, error):
    with pytest.raises(RedisConfigError, match=error):
        parse_redis_url(url)


def test_urls_are_read_as_documented():
    a = parse_redis_url("rediss://alice@cache.example:6380/3")
    assert (a.host, a.port, a.db, a.tls, a.username) == ("cache.example", 6380, 3, True, "alice")
    assert str(a) == "rediss://alice@cache.example:6380/3"
    assert str(parse_redis_url("redis://[::1]")) == "redis://[::1]:6379/0"


def test_credentials_from_the_environment_and_from_a_file(redis_acl_server, tmp_path):
    url = redis_acl_server.url
    # The default user's password (requirepass) from the environment.
    env = {"VERTUMNUS_REDIS_PASSWORD": "default-secret"}
    s = RedisTrieStore(redis_client(url, environ=env), fresh_namespace("creds"))
    s.apply(0, chain(A))
    assert dict(s.matched_blocks(A)) == {0: 4}
    # An ACL user (limited to vt:* keys) with its password in a file, named by the
    # environment or passed in; a trailing newline in the file is not the password's.
    secret = tmp_path / "redis-password"
    secret.write_text("alice-secret\n")
    for client in (
        redis_client(
            url,
            environ={
                "VERTUMNUS_REDIS_USERNAME": "alice",
                "VERTUMNUS_REDIS_PASSWORD_FILE": str(secret),
            },
        ),
        redis_client(url.replace("//", "//alice@"), password_file=secret, environ={}),
    ):
        alice = RedisTrieStore(client, s.namespace)
        assert dict(alice.matched_blocks(A))[0] == 4
        alice.apply(1, chain(B))
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.set("not-vertumnus", 1)  # the ACL holds: only vt:* keys
    # The operator's deployments name their own variable.
    op_env = {"REDIS_PASSWORD": "default-secret"}
    assert (
        RedisTrieStore(
            redis_client(url, password_env="REDIS_PASSWORD", environ=op_env), s.namespace
        ).cursor
        == 2
    )


def test_wrong_or_missing_credentials_say_so(redis_acl_server, tmp_path):
    url = redis_acl_server.url
    for env in ({"VERTUMNUS_REDIS_PASSWORD": "wrong-secret"}, {}):
        s = RedisTrieStore(redis_client(url, environ=env), "creds-bad")
        with pytest.raises(
            RedisCredentialsError, match=f"127.0.0.1:{redis_acl_server.port}"
        ) as info:
            s.matched_blocks(A)
        assert "wrong-secret" not in str(info.value)
    with pytest.raises(RedisConfigError, match="given twice"):
        redis_client(
            url,
            environ={
                "VERTUMNUS_REDIS_PASSWORD": "a",
                "VERTUMNUS_REDIS_PASSWORD_FILE": str(tmp_path / "p"),
            },
        )
    with pytest.raises(RedisConfigError, match="cannot read the Redis password file.*missing"):
        redis_client(url, environ={"VERTUMNUS_REDIS_PASSWORD_FILE": str(tmp_path / "missing")})
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(RedisConfigError, match="is empty"):
        redis_client(url, password_file=tmp_path / "empty", environ={})
    with pytest.raises(RedisConfigError, match="user 'alice' is configured without a password"):
        redis_client(url, environ={"VERTUMNUS_REDIS_USERNAME": "alice"})


def test_a_missing_redis_server_fails_with_the_package_name_unless_skipped(monkeypatch):
    from tests.redis_server import redis_server_binary

    monkeypatch.delenv("VERTUMNUS_SKIP_REDIS", raising=False)
    monkeypatch.setenv("VERTUMNUS_REDIS_SERVER", "/nonexistent/redis-server")
    with pytest.raises(pytest.fail.Exception, match=r"apt-get install redis-server"):
        redis_server_binary()
    monkeypatch.setenv("VERTUMNUS_SKIP_REDIS", "1")
    with pytest.raises(pytest.skip.Exception, match="VERTUMNUS_SKIP_REDIS=1"):
        redis_server_binary()
