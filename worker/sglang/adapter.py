"""The SGLang adapter: one domain pod's SGLang servers behind our ``Worker`` protocol.

:class:`SglangEngine` is the SGLang counterpart of :class:`vertumnus.worker.engine.Engine`:
one NVLink domain of ``world`` GPUs grouped into CP workers
(:class:`vertumnus.core.lattice.Slot`\\ s, the same vocabulary and checks,
:func:`vertumnus.worker.lattice.engine_grouping`), with the methods and attributes the
gRPC service of :mod:`vertumnus.worker.service` calls, so the same
:class:`~vertumnus.worker.service.PoolServer` serves it (one endpoint per GPU; the
endpoint of GPU r serves the worker whose first GPU is r) — see :mod:`.serve`. Each
worker is one SGLang server started with the exact command of :mod:`.command`
(:class:`~.runner.SglangWorker`).

What each call becomes:

=====================  ==============================================================
``Prefill``            ``/generate`` with ``input_ids`` and one new token (:mod:`.client`)
``StreamCacheEvents``  the worker's ``EventLog``, fed from the server's KV events
                       (:mod:`.pump`; our sequences from 1)
``ListBlocks``         the event decoder's view of the server's pages, at a sequence
                       (``ranks`` is empty: SGLang publishes one stream per server)
``FlushCache``         ``/flush_cache``, then one ``cleared``
``Drain``              as the torch worker: refuse new prefills, wait for those in flight
``Epoch``              as the torch engine's checks; the changed workers' servers restart
``CopyBlocks``         FAILED_PRECONDITION: SGLang has no API to copy blocks between
                       servers; the prefix is recomputed where it is missing (a miss)
``EvictBlocks``        FAILED_PRECONDITION: SGLang has no API to drop chosen blocks
``Describe``           as the torch engine; ``cache_blocks`` 0 (not known, see below)
=====================  ==============================================================

**Regrouping** (``Epoch``, driven exactly as for the torch engine: ``Drain`` each
worker that changes, then ``Epoch(epoch, grouping)``; a worker with the same id,
degree and offset is kept and keeps serving). A split or merge is a controlled
restart of only the changed workers' servers, in this pod, on the same GPUs:
stop them (SIGTERM, SIGKILL after ``stop_timeout_s``), start the new ones with the
new ``--tp-size``/``--attn-cp-size``, wait for ``/health``, then commit the epoch (the
new workers become schedulable, each with a fresh event log from sequence 1, the
kept ones get the new epoch). The restart time (first stop to last healthy) is
logged and reported as ``switch_seconds``. Nothing in GPU memory survives a restart:
a new worker starts with an empty cache. During the restart the old grouping is
still the one in force (its leaving workers drained), as during the torch engine's
switch. If a new server does not become healthy, the epoch is committed anyway (its
old servers are gone), that worker is *failed*, and ``Epoch`` answers an error naming
it; a later epoch that replaces it (a new worker id) starts a new server.

**Failures** are reported, not repaired (:mod:`.runner`): a crashed server's worker
stays in the grouping, not admitting, until an ``Epoch`` replaces it. Drain is not
needed first: a failed worker has nothing in flight.

**Not known from SGLang**, and what is reported instead: the KV capacity per rank
(``cache_blocks`` 0: SGLang 0.5.23's server info reports tokens per server, and
whether CP ranks split them was not checked); per-rank holdings (``ListBlocks.ranks``
empty). The vocabulary is the model's ``config.json`` ``vocab_size`` (the router
checks token ids against it).
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TypeVar

from vertumnus.core.lattice import Slot

from ..dispatch import PrefillOutcome
from ..engine import (
    BlockListing,
    CopyReport,
    SwitchReport,
    WorkerTable,
    _incarnation,
    regroup_plan,
)
from ..errors import NotReady, check_tokens
from ..events import EventLog
from ..lattice import engine_grouping
from .command import SGLANG_VERSION, SglangOptions, server_command
from .runner import SglangWorker
from .server import ServerDown

__all__ = ["AdapterSettings", "RestartReport", "SglangEngine", "model_vocab_size"]

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class AdapterSettings:
    """How the adapter runs its servers (the model and flags are :class:`SglangOptions`)."""

    max_tokens: int = 131072
    """The longest request admitted (INVALID_ARGUMENT beyond), as ``vertumnus serve``."""
    event_buffer: int = 4096
    """Events kept per worker for subscribers that reconnect."""
    health_timeout_s: float = 900.0
    """A server's start to its first healthy ``/health`` (weights, CUDA graphs)."""
    stop_timeout_s: float = 30.0
    """SIGTERM to SIGKILL."""
    request_timeout_s: float = 600.0
    replay_timeout_s: float = 5.0
    launcher: tuple[str, ...] | None = None
    """Instead of ``python3 -m sglang.launch_server`` (a stand-in server in tests)."""
    vocab_size: int | None = None
    """Instead of the model's ``config.json`` ``vocab_size``."""


@dataclass(frozen=True)
class RestartReport:
    """What one regroup did to the servers."""

    epoch: int
    stopped: dict[int, float]  # leaving worker id -> seconds to stop its server
    started: dict[int, float]  # new worker id -> seconds from its start to healthy
    seconds: float  # first stop to last healthy (0 when nothing restarted)
    failed: list[str] = field(default_factory=list)  # new workers that did not come up


def model_vocab_size(model_path: str) -> int:
    """``vocab_size`` of the model's Hugging Face ``config.json`` (or of its
    ``text_config``); ValueError naming the file otherwise."""
    path = Path(model_path) / "config.json"
    try:
        config = json.loads(path.read_text())
    except OSError as exc:
        raise ValueError(
            f"{path}: cannot read the model's config ({exc.strerror}); give --vocab-size"
        ) from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})") from None
    for doc in (config, config.get("text_config") or {}):
        value = doc.get("vocab_size")
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    raise ValueError(f"{path}: no vocab_size; give --vocab-size")


def _each(fn: Callable[[T], R], items: Sequence[T]) -> list[R | BaseException]:
    """``fn`` over ``items`` in parallel (servers start and stop side by side)."""
    if not items:
        return []

    def run(item: T) -> R | BaseException:
        try:
            return fn(item)
        except BaseException as exc:
            return exc

    with ThreadPoolExecutor(max_workers=len(items)) as pool:
        return list(pool.map(run, items))


class SglangEngine(WorkerTable[SglangWorker]):
    """A domain pod's SGLang servers as CP workers; see the module docstring.

    Starts the first grouping's servers and waits until all are healthy; raises
    :class:`~.server.ServerDown` naming every one that did not come up (after
    stopping the others), ValueError for a bad grouping or model.
    """

    _whole = "GPU pod"

    def __init__(
        self,
        world: int,
        grouping: Sequence[Slot] | Sequence[int],
        options: SglangOptions,
        settings: AdapterSettings | None = None,
        *,
        log: IO[str] | None = None,
    ) -> None:
        slots = engine_grouping(grouping, world)
        options.check()
        self.options = options
        self.settings = settings or AdapterSettings()
        if self.settings.max_tokens < 1 or self.settings.event_buffer < 1:
            raise ValueError("max_tokens and event_buffer must be >= 1")
        self.world = world
        self.vocab_size = self.settings.vocab_size or model_vocab_size(options.model_path)
        self.cache_blocks_per_rank = 0  # not known from SGLang (module docstring)
        self.incarnation = _incarnation()
        self.log = log if log is not None else sys.stderr
        self.on_change: Callable[[], None] = lambda: None
        """Called when a worker's admission changes on its own (a crash): the gRPC
        server's health refresh."""
        self.epoch = 0
        self.workers = {}
        self._by_rank = {}
        self._control = threading.Lock()
        self.restarts: list[RestartReport] = []
        self.copies_refused = 0
        """CopyBlocks answered unsupported (each a prefix recomputed where it is missing)."""
        try:
            report = self._activate(1, slots)
        except BaseException:
            self.close()
            raise
        if report.failed:
            self.close()
            raise ServerDown("the SGLang servers did not all start: " + "; ".join(report.failed))

    @property
    def block_size(self) -> int:
        return self.options.block_size

    @property
    def max_tokens(self) -> int:
        return self.settings.max_tokens

    def _say(self, text: str) -> None:
        print(f"vertumnus sglang adapter: {text}", file=self.log, flush=True)

    # -- requests ------------------------------------------------------------------------

    def prefill(self, worker: int, request_id: str, tokens: Sequence[int]) -> PrefillOutcome:
        ids = [int(t) for t in tokens]
        # The torch engine's checks and messages, before the server sees it.
        check_tokens(request_id, ids, self.max_tokens, self.vocab_size)
        return self.worker(worker).prefill(request_id, ids)

    # -- blocks --------------------------------------------------------------------------

    def list_blocks(self, worker: int) -> BlockListing:
        w = self.worker(worker)
        served, sequence = w.pump.snapshot()
        return BlockListing(w.slot.worker, self.epoch, self.incarnation, sequence, {}, served)

    def flush_cache(self, worker: int) -> int:
        w = self.worker(worker)
        w.check_up()
        return w.pump.flush()

    def copy_blocks(self, source: int, destination: int, keys: Sequence[int]) -> CopyReport:
        self.copies_refused += 1
        raise NotReady(
            f"copy: worker {destination} is an SGLang {SGLANG_VERSION} server, which has no API "
            f"to copy KV blocks from another server (worker {source}); nothing copied: the "
            "blocks it lacks are recomputed by the prefill that needs them (a miss)"
        )

    def evict_blocks(self, worker: int, keys: Sequence[int]) -> int:
        raise NotReady(
            f"evict: worker {worker} is an SGLang {SGLANG_VERSION} server, which has no API to "
            "drop chosen blocks (only /flush_cache, which drops all of them); nothing evicted: "
            "its own LRU eviction frees space and publishes REMOVED"
        )

    # -- regrouping ----------------------------------------------------------------------

    def switch_epoch(self, epoch: int, grouping: Sequence[Slot] | Sequence[int]) -> SwitchReport:
        """Commit ``grouping`` under ``epoch``: the torch engine's rules
        (:meth:`vertumnus.worker.engine.Engine.switch_epoch`), with the changed workers'
        servers restarted (module docstring)."""
        slots = engine_grouping(grouping, self.world)
        with self._control:
            changing = regroup_plan(epoch, self.epoch, slots, self.workers.values())
            if changing is None:
                return SwitchReport(epoch, 0.0, unchanged=True)
            for w in changing:
                w.drain()  # already refusing; waits for what is still in flight
            report = self._activate(epoch, slots)
        if report.failed:
            raise ServerDown(f"epoch {epoch} is committed, but " + "; ".join(report.failed))
        return SwitchReport(epoch, report.seconds, unchanged=False)

    def _activate(self, epoch: int, slots: list[Slot]) -> RestartReport:
        keep = {s for s in slots if s.worker in self.workers and self.workers[s.worker].slot == s}
        leaving = sorted(
            (w for w in self.workers.values() if w.slot not in keep), key=lambda w: w.slot.offset
        )
        new = [s for s in slots if s not in keep]
        started_at = time.monotonic()
        stop_s = _each(lambda w: w.stop(self.settings.stop_timeout_s), leaving)
        runners = [self._runner(s, epoch) for s in new]
        failed: list[str] = []
        for r in runners:
            try:
                r.start()
            except ServerDown as exc:
                failed.append(str(exc))
        healthy_s = _each(
            lambda r: r.wait_healthy(self.settings.health_timeout_s),
            [r for r in runners if r.failure is None],
        )
        failed += [str(x) for x in healthy_s if isinstance(x, BaseException)]
        seconds = time.monotonic() - started_at if runners or leaving else 0.0
        # Commit: the new grouping is the one in force.
        for w in leaving:
            w.events.close(f"{w.describe()} left the grouping in epoch {epoch}")
            del self.workers[w.slot.worker]
        for r in runners:
            self.workers[r.slot.worker] = r
        self._by_rank = {g: w for w in self.workers.values() for g in w.slot.ranks}
        self.epoch = epoch
        for s in keep:
            self.workers[s.worker].epoch = epoch
            self.workers[s.worker].resume()
        report = RestartReport(
            epoch,
            {
                w.slot.worker: x
                for w, x in zip(leaving, stop_s, strict=True)
                if isinstance(x, float)
            },
            {r.slot.worker: r.healthy_seconds for r in runners if r.failure is None},
            seconds,
            failed,
        )
        self.restarts.append(report)
        self._say(self._describe_restart(report, leaving, runners, keep))
        self.on_change()
        return report

    def _runner(self, slot: Slot, epoch: int) -> SglangWorker:
        s = self.settings
        return SglangWorker(
            slot,
            epoch,
            server_command(slot.degree, self.options, offset=slot.offset),
            EventLog(slot, self.incarnation, epoch, s.event_buffer),
            block_size=self.block_size,
            launcher=s.launcher,
            request_timeout_s=s.request_timeout_s,
            replay_timeout_s=s.replay_timeout_s,
            log=self.log,
            on_failure=self._worker_failed,
        )

    def _describe_restart(
        self,
        report: RestartReport,
        leaving: list[SglangWorker],
        runners: list[SglangWorker],
        keep: set[Slot],
    ) -> str:
        def names(ws: Sequence[SglangWorker]) -> str:
            return ", ".join(w.describe() for w in ws) or "nothing"

        stop = max(report.stopped.values(), default=0.0)
        up = max(report.started.values(), default=0.0)
        text = (
            f"epoch {report.epoch}: stopped {names(leaving)} ({stop:.2f} s), started "
            f"{names(runners)} (healthy after {up:.2f} s): restart {report.seconds:.2f} s"
        )
        if keep:
            text += f"; kept {names([self.workers[s.worker] for s in sorted(keep, key=lambda s: s.offset)])}"
        if report.failed:
            text += "; FAILED: " + "; ".join(report.failed)
        return text

    def _worker_failed(self, w: SglangWorker) -> None:
        self._say(
            f"{w.describe()} FAILED: {w.failure} (not restarted; an Epoch that replaces it starts a new server)"
        )
        self.on_change()

    # -- the end ---------------------------------------------------------------------------

    def status(self) -> list[dict[str, object]]:
        """Per worker: id, degree, offset, server pid, admitting, failure, recoveries."""
        return [
            {
                "worker": w.slot.worker,
                "degree": w.slot.degree,
                "offset": w.slot.offset,
                "pid": w.server.pid,
                "admitting": not w.draining,
                "failure": w.failure,
                "event_recoveries": w.pump.recoveries,
            }
            for w in (self.workers[s.worker] for s in self.grouping())
        ]

    def close(self) -> None:
        """Stop every server (SIGTERM, then SIGKILL) and end the event streams."""
        workers = list(self.workers.values())
        _each(lambda w: w.stop(self.settings.stop_timeout_s), workers)
        for w in workers:
            w.events.close(f"{w.describe()}: the adapter stopped")

    def __enter__(self) -> SglangEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
