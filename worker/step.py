"""One engine step on one rank: a batch of prefills under the zigzag layout.

Every rank of a worker runs :func:`prefill_step` with the same batch; the
ranks meet in collectives (over the worker's process group):

1. **prefix match** — each rank finds the first block it owns that it lacks;
   an all-reduce(min) gives the worker's matched prefix per request;
2. **layers** — per layer: token-local Q/K/V; all-gather of the cached
   prefix blocks each rank owns for this layer (the b·P term of the cost
   model) and of the uncached K/V; attention of local queries over prefix +
   visible uncached keys; then the token-local output projection and FFN/MoE;
3. **output** — the final hidden states are all-gathered and put back in
   sequence order; the first token is the argmax at each request's last position;
4. **store** — each rank writes the new full blocks it owns into its cache.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from vertumnus.core.types import cached_tokens

from .blocks import Block, block_keys, block_owner
from .kv_cache import PagedKVCache
from .model import Model
from .zigzag import ZigzagLayout, local_attention


class GroupComm:
    """The collectives a step needs, over one worker's process group.

    Degree 1 needs no communication at all, so it never touches ``group``.
    """

    def __init__(self, group: dist.ProcessGroup | None, degree: int, rank: int) -> None:
        self.group, self.degree, self.rank = group, degree, rank

    def all_gather(self, t: torch.Tensor) -> torch.Tensor:
        """[C, *t.shape]: every rank's tensor, by rank."""
        if self.degree == 1:
            return t.unsqueeze(0)
        parts = [torch.empty_like(t) for _ in range(self.degree)]
        dist.all_gather(parts, t.contiguous(), group=self.group)
        return torch.stack(parts)

    def all_reduce_min(self, t: torch.Tensor) -> torch.Tensor:
        if self.degree > 1:
            dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.group)
        return t


@dataclass(frozen=True)
class StepRequest:
    request_id: str
    tokens: tuple[int, ...]


@dataclass
class StepResult:
    request_id: str
    first_token: int
    cached_tokens: int
    uncached_tokens: int
    hidden: torch.Tensor | None = None  # final-norm hidden states of the uncached tokens


def prefill_step(
    model: Model,
    cache: PagedKVCache,
    comm: GroupComm,
    requests: Sequence[StepRequest],
    *,
    use_cache: bool = True,
    return_hidden: bool = False,
) -> tuple[list[StepResult], float]:
    """Run one batch; returns per-request results (identical on every rank) and seconds."""
    start = time.perf_counter()
    cfg, bs, C, k = model.cfg, cache.block_size, comm.degree, comm.rank
    keys = [block_keys(r.tokens, bs) for r in requests]

    # 1. prefix match: first missing block on its owner, min over ranks.
    if use_cache:
        first_missing = []
        for ks in keys:
            j = k
            while j < len(ks) and ks[j] in cache:
                j += C
            first_missing.append(min(j, len(ks)))
        # on the model's device: NCCL reduces only CUDA tensors
        found = torch.tensor(first_missing, dtype=torch.long, device=model.device)
        matched = comm.all_reduce_min(found).tolist()
    else:
        matched = [0] * len(requests)
    prefix = [cached_tokens(m, len(r.tokens), bs) for m, r in zip(matched, requests, strict=True)]
    if use_cache:
        for ks, m in zip(keys, matched, strict=True):
            cache.touch([key for j, key in enumerate(ks[:m]) if block_owner(j, C) == k])

    # 2. prefix gather, one layer at a time (so a step holds one layer's prefix K/V).
    prefix_gather = _PrefixGather(cache, comm, keys, prefix) if any(prefix) else None
    no_prefix: list[torch.Tensor | None] = [None] * len(requests)

    # 3. layers over this rank's zigzag rows.
    layout = ZigzagLayout(
        tuple(len(r.tokens) - p for r, p in zip(requests, prefix, strict=True)), C, k
    )
    tok_rows, pos_rows = [], []
    for (_, idx), r, p in zip(layout.local_positions(), requests, prefix, strict=True):
        seq = torch.tensor(r.tokens[p:], dtype=torch.long)
        real = idx < seq.numel()
        tok_rows.append(torch.where(real, seq[idx.clamp(max=max(seq.numel() - 1, 0))], 0))
        pos_rows.append(idx + p)
    tokens_local = torch.cat(tok_rows).to(model.device)
    positions_local = torch.cat(pos_rows).to(model.device)
    order = layout.gather_order().to(model.device)
    offsets = layout.request_offsets()

    new_blocks = _plan_new_blocks(cache, keys, matched, prefix, C, k) if use_cache else []
    protect = [key for ks, m in zip(keys, matched, strict=True) for key in ks[:m]]
    slots = cache.reserve(len(new_blocks), protect=protect)
    new_blocks = new_blocks[: len(slots)]

    scale = cfg.head_dim**-0.5
    h = model.embed(tokens_local)
    for layer in range(cfg.num_hidden_layers):
        q, kk, vv = model.qkv(layer, h, positions_local)
        gathered = comm.all_gather(torch.stack([kk, vv]))  # [C, 2, rows, Hkv, d]
        full = gathered.transpose(0, 1).reshape(2, C * layout.rows, *kk.shape[1:])[:, order]
        prefix_k, prefix_v = prefix_gather.layer(layer) if prefix_gather else (no_prefix, no_prefix)
        attn = local_attention(layout, q, full[0], full[1], prefix_k, prefix_v, scale)
        for (i, j, _key), slot in zip(new_blocks, slots, strict=False):
            lo = offsets[i] + j * bs - prefix[i]
            cache.write(slot, layer, full[0, lo : lo + bs], full[1, lo : lo + bs])
        h = model.after_attention(layer, h, attn)

    # 4. restore order and pick each request's first token.
    normed = comm.all_gather(model.final_norm(h)).reshape(C * layout.rows, -1)[order]
    results = []
    for i, r in enumerate(requests):
        rows = normed[offsets[i] : offsets[i] + len(r.tokens) - prefix[i]]
        first = int(model.logits(rows[-1]).argmax())
        results.append(
            StepResult(
                r.request_id,
                first,
                prefix[i],
                rows.shape[0],
                rows.cpu().clone() if return_hidden else None,
            )
        )

    # 5. publish the new blocks only now that all layers are written.
    cache.commit(
        [
            (Block(key, j, keys[i][j - 1] if j else None), slot)
            for (i, j, key), slot in zip(new_blocks, slots, strict=True)
        ]
    )
    return results, time.perf_counter() - start


def _plan_new_blocks(
    cache: PagedKVCache,
    keys: list[tuple[int, ...]],
    matched: list[int],
    prefix: list[int],
    C: int,
    k: int,
) -> list[tuple[int, int, int]]:
    """(request, position, key) of full blocks this rank owns and should store, each key once."""
    seen: set[int] = set()
    out = []
    for i, (ks, m) in enumerate(zip(keys, matched, strict=True)):
        for j in range(m, len(ks)):
            if block_owner(j, C) != k or ks[j] in cache or ks[j] in seen:
                continue
            assert j * cache.block_size >= prefix[i]
            seen.add(ks[j])
            out.append((i, j, ks[j]))
    return out


class _PrefixGather:
    """All-gathers the owned cached blocks of a batch's prefixes, layer by layer.

    Every rank contributes the matched blocks it owns (position j on rank
    j mod C), padded to the same count so a plain all-gather works; the result
    is each request's prefix K/V [P, Hkv, d] for the layer, on every rank.
    """

    def __init__(
        self, cache: PagedKVCache, comm: GroupComm, keys: Sequence[Sequence[int]], prefix: list[int]
    ) -> None:
        self.cache, self.comm, self.prefix = cache, comm, prefix
        bs, C, k = cache.block_size, comm.degree, comm.rank
        self.blocks = [-(-p // bs) for p in prefix]  # blocks needed, the last possibly partly used
        self.per_rank = [-(-n // C) for n in self.blocks]
        rows: list[int] = []
        self.local_rows: list[int] = []
        base = 0
        for ks, n, cnt in zip(keys, self.blocks, self.per_rank, strict=True):
            mine = [ks[j] for j in range(k, n, C)]
            rows.extend(range(base, base + len(mine)))
            self.local_rows.extend(mine)
            base += cnt
        self.rows = torch.tensor(rows, dtype=torch.long)
        self.total = base

    def layer(self, layer: int) -> tuple[list[torch.Tensor | None], list[torch.Tensor | None]]:
        cache, C = self.cache, self.comm.degree
        pool = cache.pool
        local = torch.zeros((self.total, *pool.shape[2:]), dtype=pool.dtype, device=pool.device)
        if self.local_rows:
            local[self.rows.to(pool.device)] = cache.read(self.local_rows)[:, layer]
        gathered = self.comm.all_gather(local)  # [C, total, 2, bs, Hkv, d]
        ks: list[torch.Tensor | None] = []
        vs: list[torch.Tensor | None] = []
        base = 0
        for n, cnt, p in zip(self.blocks, self.per_rank, self.prefix, strict=True):
            if not n:
                ks.append(None)
                vs.append(None)
            else:
                blocks = torch.stack([gathered[block_owner(j, C), base + j // C] for j in range(n)])
                kv = blocks.transpose(0, 1).reshape(2, n * cache.block_size, *blocks.shape[3:])
                ks.append(kv[0, :p])
                vs.append(kv[1, :p])
            base += cnt
        return ks, vs
