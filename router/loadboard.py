"""The load board: router replicas share their outstanding work per worker through Redis.

Each replica places requests with its own view of every worker's queue
(outstanding predicted prefill seconds). Two replicas that see only their
own queues both think the same idle worker is idle and pile onto it. The
board fixes that: each replica **publishes** its outstanding seconds per
worker, and adds the **others'** to its own view before placing.

- ``publish({worker: seconds})`` replaces the replica's whole entry, in one
  round trip, with a time to live (``ttl_s``): a replica that dies stops
  counting after ``ttl_s`` without anyone cleaning up. Publish more often than
  ``ttl_s`` (every placement or completion, or a timer at ``ttl_s / 4``).
- ``others()`` sums the live entries of every other replica, in one round
  trip; ``exchange(mine)`` does both in one.
- ``withdraw()`` takes the replica's entry off at a clean shutdown.

Keys, beside the prefix index's (same namespace, same hash-tag slot):
``vt:{<ns>}:load:replicas`` (sorted set: replica → expiry in the server's
milliseconds) and ``vt:{<ns>}:load:r:<replica>`` (hash: worker → seconds,
with the same expiry). Expiry is judged on the server's clock, so replicas
whose clocks disagree still agree on who is alive.

The board is advisory and eventually consistent: what another replica
placed less than one publish interval ago is missing from ``others()``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from redis.exceptions import RedisError

from .redis_conn import translate
from .redis_scripts import LOADBOARD
from .redis_store import key_prefix

__all__ = ["RedisLoadBoard"]


class RedisLoadBoard:
    """One router replica's place on the load board of a namespace (see the module docstring)."""

    __slots__ = ("_client", "_namespace", "_prefix", "_replicas", "_replica", "_ttl_ms")

    def __init__(self, client: Any, namespace: str, replica_id: str, ttl_s: float = 2.0) -> None:
        if not isinstance(replica_id, str) or not replica_id or not replica_id.isprintable():
            raise ValueError(f"replica_id must be a non-empty printable str, got {replica_id!r}")
        if not (isinstance(ttl_s, int | float) and math.isfinite(ttl_s) and ttl_s >= 0.001):
            raise ValueError(f"ttl_s must be a number of seconds >= 0.001, got {ttl_s!r}")
        self._client = client
        self._namespace = namespace
        self._prefix = key_prefix(namespace)
        self._replicas = self._prefix + "load:replicas"
        self._replica = replica_id
        self._ttl_ms = max(1, round(ttl_s * 1000))

    def __repr__(self) -> str:
        ttl_s = self._ttl_ms / 1000
        return f"RedisLoadBoard({self._namespace!r}, replica={self._replica!r}, ttl_s={ttl_s})"

    @property
    def namespace(self) -> str:
        return self._namespace

    @property
    def replica_id(self) -> str:
        return self._replica

    def publish(self, outstanding: Mapping[int, float]) -> None:
        """Replace this replica's entry with ``outstanding`` (worker → seconds
        of predicted work it has placed there and not seen finish)."""
        self._call("publish", "pub", outstanding)

    def others(self) -> dict[int, float]:
        """Outstanding seconds per worker, summed over the other live replicas
        (workers nobody else loads are absent)."""
        return self._call("others", "read", {})

    def exchange(self, outstanding: Mapping[int, float]) -> dict[int, float]:
        """:meth:`publish` then :meth:`others`, in one round trip."""
        return self._call("exchange", "both", outstanding)

    def withdraw(self) -> None:
        """Take this replica's entry off the board now (a clean shutdown)."""
        try:
            pipe = self._client.pipeline(transaction=True)
            pipe.zrem(self._replicas, self._replica)
            pipe.delete(f"{self._prefix}load:r:{self._replica}")
            pipe.execute()
        except RedisError as exc:
            err = self._translated(exc, "withdraw")
            if err is exc:
                raise
            raise err from exc

    def _call(self, op: str, mode: str, outstanding: Mapping[int, float]) -> dict[int, float]:
        args: list[Any] = [self._prefix, mode, self._replica, self._ttl_ms]
        for worker, seconds in outstanding.items():
            value = float(seconds)
            if not (math.isfinite(value) and value >= 0.0):
                raise ValueError(
                    f"outstanding work of worker {worker} must be finite seconds >= 0, "
                    f"got {seconds!r}"
                )
            args += (int(worker), repr(value))
        try:
            flat = LOADBOARD(self._client, [self._replicas], args)
        except RedisError as exc:
            err = self._translated(exc, op)
            if err is exc:
                raise
            raise err from exc
        return {int(flat[i]): float(flat[i + 1]) for i in range(0, len(flat), 2)}

    def _translated(self, exc: RedisError, op: str) -> Exception:
        return translate(exc, self._client, f"load board {op} in namespace {self._namespace!r}")
