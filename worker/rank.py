"""The persistent rank process: weights, KV cache and process groups live here.

A rank process starts once, joins the pool's ``torch.distributed`` world,
creates every lattice group (see :mod:`vertumnus.worker.lattice`), builds or
loads the model and allocates its KV cache. Then it serves commands from the
pool (:mod:`vertumnus.worker.pool`) one at a time, in the order received.
Commands that involve several ranks (a prefill step, a block copy) are sent to
each of them; they meet in collectives over the active group, so a command
changes nothing until every participant has it.

An epoch switch only changes which pre-created group is active: weights and
cached blocks stay where they are.

A rank ignores SIGINT: a Ctrl-C at the terminal reaches the whole process
group, and the host, not the rank, decides how to shut down (it drains the
workers, then sends :class:`Shutdown`).
"""

from __future__ import annotations

import os
import signal
import traceback
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from vertumnus.core.lattice import Slot

from .blocks import Block
from .lifetime import on_exit_of

if TYPE_CHECKING:
    from multiprocessing.queues import Queue

    import torch.distributed as dist

    from .step import GroupComm, StepRequest


@dataclass(frozen=True)
class RankSpec:
    """What every rank of a pool loads; identical on all ranks."""

    model_path: str | None = None  # HF directory; None means the seeded tiny model
    seed: int = 0
    dtype: str = "float32"
    block_size: int = 16
    num_blocks: int = 256
    backend: str = "gloo"  # "nccl" on GPUs
    device: str = "cpu"  # "cuda" puts rank r on cuda:r
    threads: int = 1
    collective_timeout_s: float = 300.0  # a rank stuck in a collective fails instead of hanging


# -- commands (picklable; sent by the pool, executed by a rank) -------------------


@dataclass(frozen=True)
class Prefill:
    worker: Slot
    requests: tuple[StepRequest, ...]
    use_cache: bool = True
    return_hidden: bool = False


@dataclass(frozen=True)
class SetEpoch:
    epoch: int
    worker: Slot


@dataclass(frozen=True)
class QueryBlocks:
    keys: tuple[int, ...]


@dataclass(frozen=True)
class SendBlocks:
    sends: dict[int, tuple[int, ...]] = field(default_factory=dict)  # dst rank -> keys


@dataclass(frozen=True)
class RecvBlocks:
    recvs: dict[int, tuple[Block, ...]] = field(default_factory=dict)  # src rank -> blocks


@dataclass(frozen=True)
class ReadBlocks:
    keys: tuple[int, ...]


@dataclass(frozen=True)
class ListBlocks:
    pass


@dataclass(frozen=True)
class EvictBlocks:
    keys: tuple[int, ...]


@dataclass(frozen=True)
class FlushBlocks:
    """Drop every block the rank holds."""


@dataclass(frozen=True)
class Shutdown:
    pass


Command = (
    Prefill
    | SetEpoch
    | QueryBlocks
    | SendBlocks
    | RecvBlocks
    | ReadBlocks
    | ListBlocks
    | EvictBlocks
    | FlushBlocks
)
# What a rank puts on its results queue: (status, payload, cache events, traceback).
Answer = tuple[str, Any, list[Any], str]


def rank_main(
    rank: int,
    world: int,
    port: int,
    spec: RankSpec,
    commands: Queue[Command | Shutdown],
    results: Queue[Answer],
    host_pid: int,
) -> None:
    """Entry point of a rank process (spawned by the pool in process ``host_pid``)."""
    import torch

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # The rank may be inside a collective that will never finish when its host
    # goes: nothing to clean up cooperatively, leave at once.
    on_exit_of(host_pid, lambda: os._exit(3))
    torch.set_num_threads(spec.threads)
    try:
        state = _RankState(rank, world, port, spec)
    except Exception as exc:  # a rank that cannot start must say why
        results.put(("error", f"rank {rank} failed to start: {exc!r}", [], traceback.format_exc()))
        return
    from vertumnus.gcfreeze import freeze_startup

    # torch's ~330,000 objects and the model's: a full collection walking them would
    # land in some prefill's time (140 ms on this machine). Before "ready", so that
    # the freeze's own collection delays no command.
    freeze_startup()
    results.put(("ready", state.info(), [], ""))
    while True:
        cmd = commands.get()
        if isinstance(cmd, Shutdown):
            break
        try:
            payload = state.handle(cmd)
            results.put(("ok", payload, state.cache.drain_events(), ""))
        except Exception as exc:
            results.put(
                (
                    "error",
                    f"{type(exc).__name__}: {exc}",
                    state.cache.drain_events(),
                    traceback.format_exc(),
                )
            )
    state.close()


class _RankState:
    def __init__(self, rank: int, world: int, port: int, spec: RankSpec) -> None:
        import torch
        import torch.distributed as dist

        from .config import ModelConfig
        from .kv_cache import PagedKVCache
        from .lattice import lattice_groups
        from .model import Model

        self.rank, self.world, self.spec = rank, world, spec
        self.device = f"cuda:{rank}" if spec.device == "cuda" else "cpu"
        if spec.device == "cuda":
            torch.cuda.set_device(self.device)
        dist.init_process_group(
            spec.backend,
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world,
            timeout=timedelta(seconds=spec.collective_timeout_s),
        )
        # Every rank creates every lattice group, in the same order (a collective call),
        # and keeps those it is a member of.
        self.groups: dict[range, dist.ProcessGroup] = {}
        for ranks in lattice_groups(world):
            group = dist.new_group(list(ranks))
            if rank in ranks and isinstance(group, dist.ProcessGroup):
                self.groups[ranks] = group
        dtype = getattr(torch, spec.dtype)
        if spec.model_path:
            self.model = Model.load(spec.model_path, dtype=dtype, device=self.device)
        else:
            self.model = Model.random(
                ModelConfig.tiny(), seed=spec.seed, dtype=dtype, device=self.device
            )
        cfg = self.model.cfg
        self.cache = PagedKVCache(
            num_blocks=spec.num_blocks,
            block_size=spec.block_size,
            layers=cfg.num_hidden_layers,
            kv_heads=cfg.num_key_value_heads,
            head_dim=cfg.head_dim,
            dtype=dtype,
            device=self.device,
            rank=rank,
        )
        self.epoch = 0
        self.worker: Slot | None = None
        self.comm: GroupComm | None = None

    def info(self) -> dict[str, int]:
        return {
            "rank": self.rank,
            "block_bytes": self.cache.block_bytes,
            "num_blocks": self.cache.num_blocks,
            "vocab_size": self.model.cfg.vocab_size,
        }

    def handle(self, cmd: Command) -> Any:
        import torch
        import torch.distributed as dist

        from .step import GroupComm, prefill_step

        if isinstance(cmd, SetEpoch):
            group = self.groups.get(cmd.worker.ranks)
            if group is None and cmd.worker.degree > 1:
                raise RuntimeError(
                    f"rank {self.rank} has no process group for ranks {cmd.worker.ranks}"
                )
            self.epoch, self.worker = cmd.epoch, cmd.worker
            self.comm = GroupComm(group, cmd.worker.degree, self.rank - cmd.worker.offset)
            if group is not None:
                dist.barrier(group=group)  # the new group is live on every member
            return {"epoch": self.epoch}
        if isinstance(cmd, Prefill):
            if cmd.worker != self.worker or self.comm is None:
                raise RuntimeError(
                    f"rank {self.rank} is in {self.worker} for epoch {self.epoch}, not {cmd.worker}"
                )
            results, seconds = prefill_step(
                self.model,
                self.cache,
                self.comm,
                cmd.requests,
                use_cache=cmd.use_cache,
                return_hidden=cmd.return_hidden,
            )
            lead = self.rank == cmd.worker.offset  # one copy of the answer is enough
            return {"results": results if lead else None, "seconds": seconds}
        if isinstance(cmd, QueryBlocks):
            return [k in self.cache for k in cmd.keys]
        if isinstance(cmd, SendBlocks):
            works = []
            for dst, keys in sorted(cmd.sends.items()):
                data = self.cache.read(keys).contiguous()
                works.append((dist.isend(data, dst), data))
            for work, _ in works:
                _wait(work)
            return sum(data.numel() * data.element_size() for _, data in works)
        if isinstance(cmd, RecvBlocks):
            shape = self.cache.pool.shape[1:]
            posted = []
            for src, blocks in sorted(cmd.recvs.items()):
                buf = torch.empty(
                    (len(blocks), *shape),
                    dtype=self.cache.pool.dtype,
                    device=self.cache.pool.device,
                )
                posted.append((dist.irecv(buf, src), buf, blocks))
            installed = 0
            for recv, buf, blocks in posted:
                _wait(recv)
                installed += self.cache.insert(blocks, buf)
            return installed
        if isinstance(cmd, ReadBlocks):
            present = [k for k in cmd.keys if k in self.cache]
            return {k: self.cache.read([k])[0].cpu() for k in present}
        if isinstance(cmd, ListBlocks):
            return self.cache.blocks()
        if isinstance(cmd, EvictBlocks):
            return self.cache.evict(cmd.keys)
        if isinstance(cmd, FlushBlocks):
            return self.cache.clear()
        raise TypeError(f"unknown command {type(cmd).__name__}")

    def close(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def _wait(work: dist.Work | None) -> None:
    """Wait for a point-to-point transfer (None: nothing was posted, not a peer)."""
    if work is not None:
        work.wait()
