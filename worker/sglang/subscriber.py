"""The socket side of SGLang's KV events: a SUB socket, a DEALER for replays, a decoder.

:class:`SglangEventSubscriber` connects to one server's publisher
(``ServerCommand.events_endpoint``) and replay socket (``replay_endpoint``) and
feeds what arrives to a :class:`~vertumnus.worker.sglang.events.SglangEventDecoder`,
which keeps the order. When the decoder reports a gap it asks the replay socket for
the missing batches (SGLang's protocol: ``events.replay_request``); a replay that does
not answer within ``replay_timeout_s``, or a server without a replay socket, makes the
gap lost (``decoder.stale``). A subscriber that connects late misses the first
batches (ZMQ's PUB drops messages for peers not yet connected), so its first live
batch opens a gap from ``first_sequence`` that the replay fills; :meth:`catch_up` asks
without waiting for a later batch (the adapter calls it when the stream is quiet).

pyzmq is imported here only, when a subscriber is made (the ``sglang`` extra).
"""

from __future__ import annotations

import time
from typing import Any

from .events import CacheChange, SglangEventDecoder

__all__ = ["SglangEventSubscriber"]


def _zmq() -> Any:
    try:
        import zmq
    except ModuleNotFoundError:
        raise ModuleNotFoundError(
            "the SGLang event subscriber needs pyzmq, which is not installed; "
            "install the 'sglang' extra: pip install 'vertumnus[sglang]'",
            name="zmq",
        ) from None
    return zmq


class SglangEventSubscriber:
    """One server's event stream. Not thread-safe: one thread calls :meth:`poll`."""

    def __init__(
        self,
        decoder: SglangEventDecoder,
        endpoint: str,
        replay_endpoint: str | None = None,
        *,
        topic: bytes = b"",
        replay_timeout_s: float = 5.0,
        context: Any = None,
    ) -> None:
        self._zmq = zmq = _zmq()
        self.decoder = decoder
        self._ctx = context or zmq.Context.instance()
        self._replay_endpoint = replay_endpoint
        self._replay_timeout_s = replay_timeout_s
        self._sub = self._ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.SUBSCRIBE, topic)
        self._sub.connect(endpoint)
        self._dealer: Any = None
        self._asked_at = 0.0
        self._poller = zmq.Poller()
        self._poller.register(self._sub, zmq.POLLIN)
        self._open_dealer()

    def _open_dealer(self) -> None:
        if self._replay_endpoint is None:
            return
        if self._dealer is not None:
            # Answers to an abandoned replay must not be taken for the next one's.
            self._poller.unregister(self._dealer)
            self._dealer.close(linger=0)
        self._dealer = self._ctx.socket(self._zmq.DEALER)
        self._dealer.connect(self._replay_endpoint)
        self._poller.register(self._dealer, self._zmq.POLLIN)

    def poll(self, timeout_s: float = 0.1, max_messages: int = 1024) -> list[CacheChange]:
        """Wait up to ``timeout_s`` for messages; return the changes now in order."""
        ready = dict(self._poller.poll(int(timeout_s * 1000)))
        out: list[CacheChange] = []
        # Replay answers first: they hold the batches the live ones wait for.
        if self._dealer is not None and ready.get(self._dealer):
            out += self._drain(self._dealer, self.decoder.replay, max_messages)
        if ready.get(self._sub):
            out += self._drain(self._sub, self.decoder.live, max_messages)
        if self.decoder.replaying:
            if time.monotonic() - self._asked_at > self._replay_timeout_s:
                out += self.decoder.skip_gap()  # the replay (and any open gap) given up
                self._open_dealer()
        elif self.decoder.gap is not None:
            if self._dealer is None:
                out += self.decoder.skip_gap()
            else:
                request = self.decoder.replay_request()
                if request is not None:
                    self._dealer.send_multipart(request)
                    self._asked_at = time.monotonic()
        return out

    def catch_up(self) -> bool:
        """Ask the replay socket for every batch from the decoder's next sequence on
        (:meth:`~.events.SglangEventDecoder.catch_up_request`); False without a replay
        socket or while a replay is in flight. Answers arrive through :meth:`poll`."""
        if self._dealer is None:
            return False
        request = self.decoder.catch_up_request()
        if request is None:
            return False
        self._dealer.send_multipart(request)
        self._asked_at = time.monotonic()
        return True

    def _drain(self, socket: Any, feed: Any, limit: int) -> list[CacheChange]:
        out: list[CacheChange] = []
        for _ in range(limit):
            try:
                frames = socket.recv_multipart(self._zmq.NOBLOCK)
            except self._zmq.Again:
                break
            out += feed(frames)
        return out

    def close(self) -> None:
        for s in (self._sub, self._dealer):
            if s is not None:
                s.close(linger=0)
