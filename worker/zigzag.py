"""Zigzag context parallelism: which rank holds which tokens, and their attention.

A degree-C worker pads each request's R uncached tokens to a multiple of 2C
and cuts them into 2C equal chunks; rank k holds chunks k and 2C-1-k. Pairing
an early chunk with a late one gives every rank the same causal attention
work (design.md section 1). After each layer's Q/K/V projection the ranks
all-gather K/V; each rank then attends its own queries over the cached prefix
plus every uncached key at or before the query, which is exactly what a
single rank computing the whole sequence would do.

Padding tokens sit after the last real token, so causal masking already hides
them from every real query; their own outputs are computed and discarded.

Everything here is pure tensor code; the collectives are done by the caller
(:mod:`vertumnus.worker.step`) so this module can be tested without ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right


@dataclass(frozen=True)
class ZigzagLayout:
    """Token placement of one batch on one rank of a degree-``degree`` worker.

    ``uncached`` holds each request's R (tokens to compute). Every rank holds
    the same number of rows, ``rows``, which is what makes a plain all-gather
    possible: for request i that is 2·s_i rows, s_i = ceil(R_i / 2C).
    """

    uncached: tuple[int, ...]
    degree: int
    rank: int

    @property
    def chunk_sizes(self) -> tuple[int, ...]:
        two_c = 2 * self.degree
        return tuple(-(-r // two_c) for r in self.uncached)

    @property
    def padded(self) -> tuple[int, ...]:
        return tuple(2 * self.degree * s for s in self.chunk_sizes)

    @property
    def rows(self) -> int:
        return 2 * sum(self.chunk_sizes)

    def chunks_of(self, rank: int) -> tuple[int, int]:
        return rank, 2 * self.degree - 1 - rank

    def local_positions(self) -> list[tuple[int, torch.Tensor]]:
        """Per request: its local row offset and the uncached indices of its local rows."""
        out, offset = [], 0
        for s in self.chunk_sizes:
            first, second = self.chunks_of(self.rank)
            idx = torch.cat(
                [
                    torch.arange(first * s, (first + 1) * s),
                    torch.arange(second * s, (second + 1) * s),
                ]
            )
            out.append((offset, idx))
            offset += 2 * s
        return out

    def gather_order(self) -> torch.Tensor:
        """Index into the flattened all-gather result [C·rows] giving every request's
        padded uncached tokens back in sequence order, requests concatenated."""
        order: list[torch.Tensor] = []
        offset = 0
        for s in self.chunk_sizes:
            by_chunk = {}
            for r in range(self.degree):
                first, second = self.chunks_of(r)
                base = r * self.rows + offset
                by_chunk[first] = torch.arange(base, base + s)
                by_chunk[second] = torch.arange(base + s, base + 2 * s)
            order.extend(by_chunk[c] for c in range(2 * self.degree))
            offset += 2 * s
        return torch.cat(order) if order else torch.zeros(0, dtype=torch.long)

    def request_offsets(self) -> list[int]:
        """Start of each request in the restored (gather-ordered) sequence."""
        out, acc = [], 0
        for p in self.padded:
            out.append(acc)
            acc += p
        return out


def chunk_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float
) -> torch.Tensor:
    """Causal attention of the last ``q.shape[0]`` positions over all of ``k``/``v``.

    q: [Lq, Hq, d]; k, v: [Lk, Hkv, d] with Lk >= Lq and query t at key position
    Lk - Lq + t (bottom-right aligned causal mask). GQA heads are grouped.
    """
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1).unsqueeze(0),
        k.transpose(0, 1).unsqueeze(0),
        v.transpose(0, 1).unsqueeze(0),
        attn_mask=causal_lower_right(q.shape[0], k.shape[0]),
        scale=scale,
        enable_gqa=True,
    )
    return out.squeeze(0).transpose(0, 1)


def local_attention(
    layout: ZigzagLayout,
    q_local: torch.Tensor,
    k_full: torch.Tensor,
    v_full: torch.Tensor,
    prefix_k: list[torch.Tensor | None],
    prefix_v: list[torch.Tensor | None],
    scale: float,
) -> torch.Tensor:
    """Attention output for this rank's rows.

    q_local: [rows, Hq, d] in local row order; k_full, v_full: the gathered
    uncached keys/values in sequence order (see :meth:`ZigzagLayout.gather_order`);
    prefix_k/v: per request the cached prefix's keys/values [P, Hkv, d] or None.
    """
    out = torch.empty_like(q_local)
    starts = layout.request_offsets()
    for i, s in enumerate(layout.chunk_sizes):
        row0 = 2 * sum(layout.chunk_sizes[:i])
        for j, c in enumerate(layout.chunks_of(layout.rank)):
            end = starts[i] + (c + 1) * s
            keys, values = k_full[starts[i] : end], v_full[starts[i] : end]
            pk, pv = prefix_k[i], prefix_v[i]
            if pk is not None and pv is not None:
                keys = torch.cat([pk, keys])
                values = torch.cat([pv, values])
            rows = slice(row0 + j * s, row0 + (j + 1) * s)
            out[rows] = chunk_attention(q_local[rows], keys, values, scale)
    return out
