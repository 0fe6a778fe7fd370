"""One server's KV events into its worker's :class:`~vertumnus.worker.events.EventLog`.

An :class:`EventPump` is a thread that owns the server's
:class:`~.subscriber.SglangEventSubscriber` (ZMQ sockets are used from one thread) and
its :class:`~.events.SglangEventDecoder`, and publishes every change the decoder
reports, in order, through the worker's ``EventLog`` — which numbers them 1, 2, 3, …
(SGLang's own sequences start at 0 and are never forwarded), keeps the replay
buffer and answers ``StreamCacheEvents`` exactly as for the torch engine.

Because only this thread touches the decoder, everything that must see the decoder
and the log at one point runs here, between two polls:

- :meth:`snapshot` (``ListBlocks``): the blocks the decoder says the server holds and
  the sequence of the last event published — exactly what the events up to that
  sequence describe;
- :meth:`flush` (``FlushCache``): ``/flush_cache`` on the server, then the decoder's
  :meth:`~.events.SglangEventDecoder.reset`, published as one ``cleared`` event;
- **recovery from a lost gap**: when batches are lost for good (the replay buffer no
  longer has them, or the replay timed out; the decoder is then ``stale``), the pump
  does the same flush. The server's cache is then empty, so ``cleared`` is the
  truth and every router that applies it is in sync again, without a RESYNC or a
  snapshot; the log's sequence goes on, so a router's replay still works. SGLang
  refuses to flush while requests run (HTTP 400): the pump tries again every
  ``retry_s`` until it succeeds, and until then the view may be wrong (counted in
  :attr:`stale_seconds`). After the flush SGLang publishes its own
  ``AllBlocksCleared`` (``RadixCache.reset`` records it), which arrives as a second
  ``cleared`` and clears anything stale that was still in flight.

**Late joins.** ZMQ's PUB socket silently drops what it sends before a subscription
reaches it, and only a later batch would reveal the gap; so whenever the stream has
been quiet for ``catch_up_s`` the pump asks the replay socket for everything from the
next sequence on (:meth:`~.subscriber.SglangEventSubscriber.catch_up`): usually just
the end marker.

A stopped pump follows nothing: its snapshot is empty (its server is gone).
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import IO, Any

from ..blocks import Block
from ..errors import NotReady
from ..events import EventLog
from .events import CacheChange, SglangEventDecoder, SglangEventError

__all__ = ["EventPump"]


class EventPump:
    """The thread that feeds ``log`` from one server's publisher (see the module docstring).

    ``flush`` calls the server's ``/flush_cache`` (raising when it refuses);
    ``epoch`` gives the epoch to stamp on events; ``rank`` is the worker's first rank
    (SGLang publishes from CP rank 0 only, ``kv_events.py:66-78``).
    """

    def __init__(
        self,
        log: EventLog,
        decoder: SglangEventDecoder,
        endpoint: str,
        replay_endpoint: str | None,
        *,
        flush: Callable[[], None],
        epoch: Callable[[], int],
        name: str,
        replay_timeout_s: float = 5.0,
        retry_s: float = 0.5,
        poll_s: float = 0.02,
        catch_up_s: float = 0.5,
        messages: IO[str] | None = None,
    ) -> None:
        self.log, self.decoder = log, decoder
        self._endpoints = (endpoint, replay_endpoint)
        self._flush, self._epoch, self.name = flush, epoch, name
        self._replay_timeout_s, self._retry_s, self._poll_s = replay_timeout_s, retry_s, poll_s
        self._catch_up_s = catch_up_s
        self._messages = messages
        self._requests: queue.Queue[tuple[str, Future[Any]]] = queue.Queue()
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"{name}-events", daemon=True)
        self.recoveries = 0
        """Lost gaps recovered by a flush."""
        self.stale_seconds = 0.0
        """Time spent with a lost gap not yet recovered."""

    def start(self) -> None:
        """Connect (before the server starts: ZMQ connects lazily) and start polling."""
        self._thread.start()
        self._ready.wait(10)
        if self._error is not None:
            raise self._error

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)

    @property
    def running(self) -> bool:
        return self._thread.is_alive() and not self._stop.is_set()

    # -- calls from other threads, run on the pump's thread ------------------------

    def _ask(self, kind: str, timeout_s: float) -> Any:
        if not self.running:
            if kind == "snapshot":
                return [], self.log.last_sequence
            raise NotReady(f"{self.name}: its events are not followed (the server is stopped)")
        fut: Future[Any] = Future()
        self._requests.put((kind, fut))
        return fut.result(timeout=timeout_s)

    def snapshot(self, timeout_s: float = 10.0) -> tuple[list[Block], int]:
        """(blocks served, sequence of the last event published) at one point."""
        result: tuple[list[Block], int] = self._ask("snapshot", timeout_s)
        return result

    def flush(self, timeout_s: float = 60.0) -> int:
        """Flush the server's cache and publish ``cleared``; the blocks it had served."""
        removed: int = self._ask("flush", timeout_s)
        return removed

    # -- the thread ------------------------------------------------------------------

    def _say(self, text: str) -> None:
        if self._messages is not None:
            with contextlib.suppress(ValueError, OSError):
                print(f"[{self.name}] {text}", file=self._messages, flush=True)

    def _publish(self, changes: list[CacheChange]) -> None:
        epoch = self._epoch()
        for c in changes:
            self.log.publish(c.kind, c.blocks, self.log.slot.offset, epoch)

    def _reset(self) -> int:
        """Flush the server (raises if it refuses), forget, publish ``cleared``."""
        held = len(self.decoder.served())
        self._flush()
        self._publish(self.decoder.reset(self.decoder.expected))
        return held

    def _run(self) -> None:
        from .subscriber import SglangEventSubscriber  # pyzmq, imported by the thread's owner

        try:
            endpoint, replay = self._endpoints
            sub = SglangEventSubscriber(
                self.decoder, endpoint, replay, replay_timeout_s=self._replay_timeout_s
            )
        except BaseException as exc:
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        stale_since: float | None = None
        next_try = 0.0
        heard = time.monotonic()
        try:
            while not self._stop.is_set():
                self._serve_requests()
                expected = self.decoder.expected
                try:
                    self._publish(sub.poll(self._poll_s))
                    if self.decoder.expected != expected:
                        heard = time.monotonic()
                    elif time.monotonic() - heard > self._catch_up_s and sub.catch_up():
                        # Quiet: ask for what the PUB socket may have dropped (a late join).
                        heard = time.monotonic()
                except SglangEventError as exc:
                    # The batch is not applied; the decoder waits for it, asks the replay, and
                    # finally gives it up as lost, which the flush below recovers from.
                    self._say(f"malformed SGLang event batch: {exc}")
                if not self.decoder.stale:
                    continue
                now = time.monotonic()
                if stale_since is None:
                    stale_since = now
                    self._say(f"lost SGLang event batches {self.decoder.lost}: flushing its cache")
                if now < next_try:
                    continue
                try:
                    self._reset()
                except NotReady as exc:  # refused while requests run, or no answer
                    next_try = now + self._retry_s
                    self._say(f"flush after lost events not done yet: {exc}")
                    continue
                self.recoveries += 1
                self.stale_seconds += time.monotonic() - stale_since
                stale_since = None
                self._say("cache flushed after lost events; published CLEARED")
        finally:
            sub.close()
            while True:  # nobody waits forever on a pump that stopped
                try:
                    _, fut = self._requests.get_nowait()
                except queue.Empty:
                    break
                fut.set_exception(NotReady(f"{self.name}: its events are not followed any more"))

    def _serve_requests(self) -> None:
        while True:
            try:
                kind, fut = self._requests.get_nowait()
            except queue.Empty:
                return
            try:
                if kind == "snapshot":
                    fut.set_result((self.decoder.served(), self.log.last_sequence))
                else:
                    fut.set_result(self._reset())
            except BaseException as exc:
                fut.set_exception(exc)
