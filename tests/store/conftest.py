"""Store factories for the contract suite: every TrieStore implementation runs every test here.

``STORES`` maps a name to a factory ``(namespace, log_limit=...) -> TrieStore``;
a factory listed in ``NEEDS`` also gets ``server=`` the session fixture it names
(the Redis store needs a running ``redis-server``, see ``tests/redis_server.py``).
"""

from __future__ import annotations

import itertools
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from vertumnus.core.store import TrieStore
from vertumnus.core.trie import PrefixTrie

if TYPE_CHECKING:  # imported where used: the memory store's tests need no redis-py
    from tests.redis_server import RedisServer

_names = itertools.count()
_RUN = secrets.token_hex(3)
"""In every namespace: tests that share a server never share a namespace, even if
this module is imported twice (``test_properties.py`` imports it)."""


def _redis_store(namespace: str, log_limit: int = 65536, *, server: RedisServer) -> TrieStore:
    from vertumnus.router.redis_store import RedisTrieStore

    return RedisTrieStore(server.client(), namespace, log_limit=log_limit)


STORES: dict[str, Callable[..., TrieStore]] = {
    "memory": lambda namespace, log_limit=65536: PrefixTrie(namespace, log_limit=log_limit),
    "redis": _redis_store,
}

NEEDS: dict[str, str] = {"redis": "redis_server"}
"""Factory name -> the fixture whose value it takes as ``server=``."""


def store_factory(name: str, request: pytest.FixtureRequest) -> Callable[..., TrieStore]:
    """``make(log_limit=...)``: a new, empty store of implementation ``name``, in a
    namespace of its own."""
    factory = STORES[name]
    extra = {"server": request.getfixturevalue(NEEDS[name])} if name in NEEDS else {}

    def make(log_limit: int = 65536) -> TrieStore:
        return factory(f"test-{_RUN}-{next(_names)}", log_limit=log_limit, **extra)

    return make


@pytest.fixture(params=sorted(STORES))
def make_store(request: pytest.FixtureRequest) -> Iterator[Callable[..., TrieStore]]:
    """``make_store(log_limit=...)``: a new, empty store of one implementation, in a
    namespace of its own."""
    yield store_factory(request.param, request)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One ``redis-server`` for the session (no persistence, loopback, a free port);
    tests keep apart by namespace. Fails if the binary is missing (skips with
    ``VERTUMNUS_SKIP_REDIS=1``)."""
    from tests.redis_server import RedisServer

    server = RedisServer(Path(tmp_path_factory.mktemp("redis")))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def redis_acl_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A ``redis-server`` that wants credentials: the default user's password
    (``requirepass``) and an ACL user ``alice`` limited to the ``vt:*`` keys."""
    from tests.redis_server import RedisServer

    server = RedisServer(
        Path(tmp_path_factory.mktemp("redis-acl")),
        password="default-secret",
        config=["user alice on >alice-secret ~vt:* &* +@all -@dangerous +script|load"],
    )
    server.start()
    yield server
    server.stop()
