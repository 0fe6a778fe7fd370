"""One CP worker's queue and dispatcher: requests in, engine steps out.

A :class:`WorkerRunner` is the host-side handle of one worker of the current
epoch. Its dispatcher thread takes whatever requests are queued (up to
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

from vertumnus.worker.errors import NotReady
from vertumnus.worker.lattice import WorkerSlot
from vertumnus.worker.pool import RankPool
from vertumnus.worker.rank import Prefill
from vertumnus.worker.step import StepRequest


@dataclass(frozen=True)
class PrefillOutcome:
    request_id: str
    first_token: int
    cached_tokens: int
    queue_seconds: float
    execution_seconds: float
    worker: int
    degree: int
    epoch: int
    hidden: object = None  # torch.Tensor when asked for (verify)



class WorkerRunner:
    """Host-side handle of one CP worker: its queue, its dispatcher, its step lock."""

    def __init__(self, pool: RankPool, slot: WorkerSlot, epoch: int, max_batch_tokens: int) -> None:
        self.pool, self.slot, self.epoch = pool, slot, epoch
        self.max_batch_tokens = max_batch_tokens
        self.step_lock = threading.Lock()  # held for a step; copies and switches take it too
        self._cv = threading.Condition()
        self._queue: list[tuple[StepRequest, Future, float, dict]] = []
        self._busy = False
        self._stopped = False
        self.draining = False
        self._thread = threading.Thread(target=self._loop, name=f"worker-{slot.first}", daemon=True)
        self._thread.start()

    def submit(self, request: StepRequest, options: dict) -> Future:
        fut: Future = Future()
        with self._cv:
            if self.draining or self._stopped:
                raise NotReady(f"worker {self.slot.first} (CP{self.slot.degree}) is draining; not admitting")
            self._queue.append((request, fut, time.perf_counter(), options))
            self._cv.notify_all()
        return fut

    def drain(self, timeout_s: float = 600.0) -> None:
        with self._cv:
            self.draining = True
            if not self._cv.wait_for(lambda: not self._queue and not self._busy, timeout=timeout_s):
                raise NotReady(f"worker {self.slot.first} did not drain within {timeout_s} s")

    def resume(self) -> None:
        with self._cv:
            self.draining = False

    def stop(self) -> None:
        with self._cv:
            self._stopped = True
            self._cv.notify_all()
        self._thread.join(timeout=10)

    def _take_batch(self) -> list:
        limit = self.max_batch_tokens
        batch, tokens = [], 0
        while self._queue:
            req, _, _, opts = self._queue[0]
            if batch and (tokens + len(req.tokens) > limit or opts != batch[0][3]):
                break
            batch.append(self._queue.pop(0))
            tokens += len(req.tokens)
        return batch

    def _loop(self) -> None:
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._queue or self._stopped)
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

    def _run(self, batch: list) -> None:
        opts = batch[0][3]
        cmd = Prefill(self.slot, tuple(r for r, _, _, _ in batch), **opts)
        with self.step_lock:
            started = time.perf_counter()
            try:
                answers = self.pool.call({r: cmd for r in self.slot.ranks})
            except Exception as exc:
                for _, fut, _, _ in batch:
                    fut.set_exception(exc)
                return
        lead = answers[self.slot.first]
        for (_, fut, arrived, _), res in zip(batch, lead["results"], strict=True):
            fut.set_result(
                PrefillOutcome(
                    request_id=res.request_id,
                    first_token=res.first_token,
                    cached_tokens=res.cached_tokens,
                    queue_seconds=started - arrived,
                    execution_seconds=lead["seconds"],
                    worker=self.slot.first,
                    degree=self.slot.degree,
                    epoch=self.epoch,
                    hidden=res.hidden,
                )
            )
