"""One CP worker's queue and dispatcher: requests in, engine steps out.

A :class:`WorkerRunner` is the host-side handle of one worker of the current
epoch: its place (a :class:`vertumnus.core.lattice.Slot`: pool-level id,
degree, first rank), its event log (:mod:`vertumnus.worker.events`), and a
dispatcher thread that takes whatever requests are queued (up to
``max_batch_tokens``, same options) into one engine step and sends the step
to every rank of the worker. ``step_lock`` is held for the whole step, which
is what lets an epoch switch or a block copy fall between steps: they take
the same lock. Draining stops admission and waits for the queue to empty.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vertumnus.core.lattice import Slot

from .errors import NotReady
from .events import EventLog
from .pool import RankPool
from .rank import Prefill
from .step import StepRequest, StepResult

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class PrefillOutcome:
    request_id: str
    first_token: int
    cached_tokens: int
    queue_seconds: float
    execution_seconds: float
    worker: int  # pool-level id
    degree: int
    epoch: int
    hidden: torch.Tensor | None = None  # when asked for (verify)


@dataclass(frozen=True)
class _Queued:
    request: StepRequest
    future: Future[PrefillOutcome]
    arrived: float
    options: dict[str, bool]


class WorkerRunner:
    """Host-side handle of one CP worker: its queue, its dispatcher, its step lock."""

    def __init__(
        self, pool: RankPool, slot: Slot, epoch: int, max_batch_tokens: int, events: EventLog
    ) -> None:
        self.pool, self.slot, self.epoch, self.events = pool, slot, epoch, events
        self.max_batch_tokens = max_batch_tokens
        self.step_lock = threading.Lock()  # held for a step; copies and switches take it too
        self._cv = threading.Condition()
        self._queue: list[_Queued] = []
        self._busy = False
        self._stopped = False
        self.draining = False
        self.failure: str | None = None
        """Why the worker cannot serve (never set here: a torch worker fails with its
        engine process; the SGLang adapter's workers set theirs)."""
        self._thread = threading.Thread(
            target=self._loop, name=f"worker-{slot.worker}", daemon=True
        )
        self._thread.start()

    def describe(self) -> str:
        """``worker 7 (CP2, ranks 4-5)``: how messages name this worker."""
        s = self.slot
        ranks = (
            f"rank {s.offset}" if s.degree == 1 else f"ranks {s.offset}-{s.offset + s.degree - 1}"
        )
        return f"worker {s.worker} (CP{s.degree}, {ranks})"

    def submit(self, request: StepRequest, options: dict[str, bool]) -> Future[PrefillOutcome]:
        fut: Future[PrefillOutcome] = Future()
        with self._cv:
            if self.draining or self._stopped:
                raise NotReady(f"{self.describe()} is draining; not admitting")
            self._queue.append(_Queued(request, fut, time.perf_counter(), options))
            self._cv.notify_all()
        return fut

    def drain(self, timeout_s: float = 600.0) -> None:
        with self._cv:
            self.draining = True
            if not self._cv.wait_for(lambda: not self._queue and not self._busy, timeout=timeout_s):
                raise NotReady(f"{self.describe()} did not drain within {timeout_s} s")

    def resume(self) -> None:
        with self._cv:
            self.draining = False

    def stop(self) -> None:
        with self._cv:
            self._stopped = True
            self._cv.notify_all()
        self._thread.join(timeout=10)

    def _take_batch(self) -> list[_Queued]:
        limit = self.max_batch_tokens
        batch: list[_Queued] = []
        tokens = 0
        while self._queue:
            head = self._queue[0]
            if batch and (
                tokens + len(head.request.tokens) > limit or head.options != batch[0].options
            ):
                break
            batch.append(self._queue.pop(0))
            tokens += len(head.request.tokens)
        return batch

    def _loop(self) -> None:
        while True:
            with self._cv:
                self._cv.wait_for(lambda: bool(self._queue) or self._stopped)
                if self._stopped and not self._queue:
                    return
                batch = self._take_batch()
                self._busy = True
            try:
                self._run(batch)
            finally:
                with self._cv:
                    self._busy = False
                    self._cv.notify_all()

    def _run(self, batch: list[_Queued]) -> None:
        opts = batch[0].options
        cmd = Prefill(self.slot, tuple(q.request for q in batch), **opts)
        with self.step_lock:
            started = time.perf_counter()
            try:
                answers: dict[int, Any] = self.pool.call({r: cmd for r in self.slot.ranks})
            except Exception as exc:
                for q in batch:
                    q.future.set_exception(exc)
                return
        lead = answers[self.slot.offset]
        results: list[StepResult] = lead["results"]
        for q, res in zip(batch, results, strict=True):
            q.future.set_result(
                PrefillOutcome(
                    request_id=res.request_id,
                    first_token=res.first_token,
                    cached_tokens=res.cached_tokens,
                    queue_seconds=started - q.arrived,
                    execution_seconds=lead["seconds"],
                    worker=self.slot.worker,
                    degree=self.slot.degree,
                    epoch=self.epoch,
                    hidden=res.hidden,
                )
            )
