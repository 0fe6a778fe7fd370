"""A watched copy of one labelled collection (a pool's domain pods, its router's endpoints).

A pool's loop steps about once a second. Listing its pods at every step cost the API
server a LIST per second per pool, and noticed a lost domain only at the next step. An
:class:`Informer` lists the collection once and then keeps a WATCH open from that list's
``resourceVersion`` (the pattern client-go's informers follow): the loop reads the copy
instead, and each change wakes the loop at once through ``on_change``.

- The watch asks for bookmarks and ends every ``timeout_s`` (the server closes it); the
  next one starts from the last version seen, so an idle collection costs one request per
  ``timeout_s``.
- ``410 Gone`` (the version is older than the server keeps) lists again.
- Any other failure (connection lost, 403, a stream that stalls past ``timeout_s`` plus a
  margin) marks the copy unsynced and retries with backoff (1 s doubling to 30 s). While
  unsynced, :meth:`current` lists, as the loop did before: a watch that cannot run costs
  requests, never correctness.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from vertumnus.operator.kube import KubeClient, KubeError

__all__ = ["Informer"]

log = logging.getLogger(__name__)

BACKOFF_MAX_S = 30.0


class Expired(Exception):
    """The watch's resourceVersion is older than the API server keeps (410 Gone)."""


class Informer:
    def __init__(
        self,
        kube: KubeClient,
        path: str,
        label_selector: str,
        on_change: Callable[[], None] = lambda: None,
        timeout_s: float = 300.0,
        on_failure: Callable[[], None] = lambda: None,
    ) -> None:
        self.kube = kube
        self.path = path
        self.selector = label_selector
        self.on_change = on_change
        self.on_failure = on_failure
        self.timeout_s = timeout_s
        self._items: dict[str, dict[str, Any]] = {}
        self._synced = False
        self._task: asyncio.Task[None] | None = None
        self.restarts = 0
        """Failures the watch recovered from (a relist after 410 Gone is not one)."""

    @property
    def synced(self) -> bool:
        """The copy follows the server (listed, and the watch since then unbroken)."""
        return self._synced

    def items(self) -> list[dict[str, Any]]:
        """The objects as last seen (a snapshot; deleted ones gone)."""
        return list(self._items.values())

    async def current(self) -> list[dict[str, Any]]:
        """The objects: the copy while it is synced, else listed now (a watch that is
        down or not started costs a request, never a stale answer)."""
        if self._synced:
            return self.items()
        return await self.kube.list(self.path, self.selector)

    def start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._run())

    async def close(self) -> None:
        task, self._task = self._task, None
        self._synced = False
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # ---- the loop --------------------------------------------------------------------------

    async def _run(self) -> None:
        backoff = 1.0
        while True:
            try:
                version = await self._relist()
                while True:
                    started = time.monotonic()
                    version, events = await self._watch(version)
                    backoff = 1.0
                    if not events and time.monotonic() - started < 1.0:
                        # A server that ends watches at once would have us spin: pause.
                        await asyncio.sleep(1.0)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001  (any failure: unsynced, retried)
                if isinstance(e, Expired) or (isinstance(e, KubeError) and e.status == 410):
                    log.info(
                        "watch of %s (%s): version expired, listing again", self.path, self.selector
                    )
                    continue
                self._synced = False
                self.restarts += 1
                self.on_failure()
                log.warning(
                    "watch of %s (%s) failed (%s: %s); the loop lists until it is back, "
                    "retrying in %.0f s",
                    self.path,
                    self.selector,
                    type(e).__name__,
                    e,
                    backoff,
                )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX_S)

    async def _relist(self) -> str:
        items, version = await self.kube.list_versioned(self.path, self.selector)
        fresh = {_key(o): o for o in items}
        changed = fresh != self._items or not self._synced
        self._items = fresh
        self._synced = True
        if changed:
            self.on_change()
        return version

    async def _watch(self, version: str) -> tuple[str, int]:
        """One watch until the server ends it; the last version seen and the events."""
        events = 0
        stream = self.kube.watch(self.path, self.selector, version, self.timeout_s)
        async with contextlib.aclosing(stream):  # an error below closes the connection now
            async for event in stream:
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise Expired
                    raise KubeError(
                        int(obj.get("code") or 500),
                        str(obj.get("reason", "")),
                        str(obj.get("message", obj)),
                        "WATCH",
                        self.path,
                    )
                version = (obj.get("metadata") or {}).get("resourceVersion") or version
                if kind == "BOOKMARK":
                    continue
                events += 1
                if kind == "DELETED":
                    self._items.pop(_key(obj), None)
                else:  # ADDED, MODIFIED
                    self._items[_key(obj)] = obj
                self.on_change()
        return version, events


def _key(obj: dict[str, Any]) -> str:
    return str(obj["metadata"]["name"])
