"""One CP worker of the SGLang adapter: its server, its events, its admission.

A :class:`SglangWorker` is to the adapter what :class:`vertumnus.worker.dispatch.WorkerRunner`
is to the torch engine — the handle of one worker of the current epoch, with the
attributes :mod:`vertumnus.worker.service` reads (``slot``, ``epoch``, ``events``,
``draining``, ``describe()``) — but the work runs in an SGLang server
(:class:`~.server.ServerProcess`), which batches concurrent requests itself: each
``Prefill`` is one ``/generate`` call (:class:`~.client.SglangClient`), sent at once.

- **Admission and drain** follow the torch worker: a draining worker refuses new
  prefills with the same :class:`~vertumnus.worker.errors.NotReady` ("… is draining;
  not admitting", FAILED_PRECONDITION, which the router retries elsewhere), and
  :meth:`drain` waits until the prefills in flight have answered.
- **Events**: an :class:`~.pump.EventPump` feeds the worker's ``EventLog`` from the
  server's KV events; it connects before the server starts.
- **A crash** (the server exits without being asked) is reported, never repaired:
  the worker stays in the grouping but is *failed* — it admits nothing (``draining``
  is true, so gRPC health says NOT_SERVING and ``Describe`` says ``draining``), every
  call names the exit code and the server's last output, its event stream gets one
  ``cleared`` (the server's cache is gone) and then ends with the same
  FAILED_PRECONDITION — until an ``Epoch`` replaces it.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import IO

from vertumnus.core.lattice import Slot

from ..dispatch import PrefillOutcome
from ..errors import NotReady
from ..events import EventLog
from .client import ServerUnreachable, SglangClient
from .command import ServerCommand
from .events import SglangEventDecoder
from .pump import EventPump
from .server import ServerDown, ServerExit, ServerProcess

__all__ = ["SglangWorker", "describe_slot"]


def describe_slot(slot: Slot) -> str:
    """``worker 7 (CP2, GPUs 4-5)``: how messages name a worker."""
    last = slot.offset + slot.degree - 1
    gpus = f"GPU {slot.offset}" if slot.degree == 1 else f"GPUs {slot.offset}-{last}"
    return f"worker {slot.worker} (CP{slot.degree}, {gpus})"


class SglangWorker:
    """One worker: an SGLang server, its event pump, its admission (module docstring)."""

    def __init__(
        self,
        slot: Slot,
        epoch: int,
        command: ServerCommand,
        events: EventLog,
        *,
        block_size: int,
        launcher: tuple[str, ...] | None = None,
        request_timeout_s: float = 600.0,
        replay_timeout_s: float = 5.0,
        log: IO[str] | None = None,
        on_failure: Callable[[SglangWorker], None] | None = None,
    ) -> None:
        self.slot, self.epoch, self.command, self.events = slot, epoch, command, events
        self.name = f"sglang {describe_slot(slot)}"
        self.client = SglangClient(command.ports["http"], timeout_s=request_timeout_s)
        self.server = ServerProcess(
            command, self.name, launcher=launcher, on_exit=self._server_exited, log=log
        )
        self.pump = EventPump(
            events,
            SglangEventDecoder(block_size),
            command.events_endpoint,
            command.replay_endpoint,
            flush=self.client.flush_cache,
            epoch=lambda: self.epoch,
            name=self.name,
            replay_timeout_s=replay_timeout_s,
            messages=log,
        )
        self._on_failure = on_failure
        self._cv = threading.Condition()
        self._in_flight = 0
        self._draining = False
        self._ready = False
        self.failure: str | None = None
        """Why the worker is failed (its server exited or never became healthy), or None."""
        self.healthy_seconds = 0.0
        """Start of the server to its first healthy ``/health``."""

    def describe(self) -> str:
        return describe_slot(self.slot)

    @property
    def draining(self) -> bool:
        """Not admitting: drained, still starting, or failed."""
        return self._draining or not self._ready or self.failure is not None

    # -- life --------------------------------------------------------------------------

    def start(self) -> None:
        """Connect to its events, start its server (returns at once)."""
        self.pump.start()
        try:
            self.server.start()
        except ServerDown as exc:
            self._fail(str(exc))
            raise

    def wait_healthy(self, timeout_s: float) -> float:
        """Wait for the server's ``/health``; admit from then on. Raises :class:`ServerDown`."""
        try:
            self.healthy_seconds = self.server.wait_healthy(timeout_s)
        except ServerDown as exc:
            self._fail(str(exc).removeprefix(f"{self.name}: "))
            raise ServerDown(f"{self.describe()}: {self.failure}") from None
        with self._cv:
            self._ready = True
        return self.healthy_seconds

    def stop(self, timeout_s: float) -> float:
        """Stop its server (SIGTERM, then SIGKILL) and its pump; the seconds it took."""
        with self._cv:
            self._ready = False
        self.pump.stop()
        return self.server.stop(timeout_s)

    def _server_exited(self, exit: ServerExit) -> None:
        self._fail(exit.describe())

    def _fail(self, reason: str) -> None:
        with self._cv:
            if self.failure is not None:
                return
            self.failure = reason
            self._cv.notify_all()
        self.pump.stop()
        # The server's cache died with it: the worker serves nothing now. Then its
        # stream ends naming why, so a router learns of the failure at once, not at
        # the next request it sends there (replays still deliver the cleared first).
        self.events.publish("cleared", [], self.slot.offset, self.epoch)
        self.events.close(f"{self.describe()} is failed: {reason}")
        if self._on_failure is not None:
            self._on_failure(self)

    # -- admission ---------------------------------------------------------------------

    def check_up(self) -> None:
        """Raise :class:`ServerDown` naming why if the worker failed."""
        if self.failure is not None:
            raise ServerDown(f"{self.describe()} is failed: {self.failure}")

    @contextlib.contextmanager
    def _admitted(self) -> Iterator[None]:
        with self._cv:
            self.check_up()
            if not self._ready:
                raise NotReady(
                    f"{self.describe()} is starting (its SGLang server is not healthy yet)"
                )
            if self._draining:
                raise NotReady(f"{self.describe()} is draining; not admitting")
            self._in_flight += 1
        try:
            yield
        finally:
            with self._cv:
                self._in_flight -= 1
                self._cv.notify_all()

    def prefill(self, request_id: str, tokens: list[int]) -> PrefillOutcome:
        arrived = time.perf_counter()
        with self._admitted():
            sent = time.perf_counter()
            try:
                out = self.client.generate(tokens)
            except ServerUnreachable as exc:
                # A server that died under the request: say so once the watcher knows.
                if self.server.exit is None:
                    self.server.wait_exit(1.0)
                self.check_up()
                raise ServerDown(f"{self.describe()}: {exc}") from None
        return PrefillOutcome(
            request_id=request_id,
            first_token=out.first_token,
            cached_tokens=out.cached_tokens,
            # The adapter queues nothing: SGLang's own waiting is inside e2e_latency.
            queue_seconds=sent - arrived,
            execution_seconds=out.e2e_latency,
            worker=self.slot.worker,
            degree=self.slot.degree,
            epoch=self.epoch,
        )

    def drain(self, timeout_s: float = 600.0) -> None:
        with self._cv:
            self._draining = True
            if not self._cv.wait_for(lambda: self._in_flight == 0, timeout=timeout_s):
                raise NotReady(f"{self.describe()} did not drain within {timeout_s} s")

    def resume(self) -> None:
        with self._cv:
            self._draining = False
