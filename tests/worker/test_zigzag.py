"""Zigzag layout and attention, without processes: C ranks simulated in one process."""

from __future__ import annotations

import pytest
import torch

from vertumnus.worker.reference import reference_hidden
from vertumnus.worker.zigzag import ZigzagLayout, local_attention

from .conftest import random_tokens


def test_rank_k_holds_chunks_k_and_2c_minus_1_minus_k():
    layout = ZigzagLayout((16,), degree=4, rank=1)
    assert layout.chunk_sizes == (2,) and layout.padded == (16,)
    ((offset, idx),) = layout.local_positions()
    assert offset == 0
    assert idx.tolist() == [2, 3, 12, 13]  # chunk 1 and chunk 6 of 8


def test_padding_to_a_multiple_of_2c():
    layout = ZigzagLayout((5, 1, 9), degree=2, rank=0)
    assert layout.chunk_sizes == (2, 1, 3)
    assert layout.padded == (8, 4, 12)
    assert layout.rows == 12


@pytest.mark.parametrize("degree", [1, 2, 4, 8])
@pytest.mark.parametrize("lengths", [(1,), (7,), (16, 3, 33), (64, 1, 2, 5)])
def test_gather_order_restores_sequence_order(degree, lengths):
    layouts = [ZigzagLayout(lengths, degree, r) for r in range(degree)]
    # each rank's rows labelled with (request, uncached index)
    labels = []
    for layout in layouts:
        for i, (_, idx) in enumerate(layout.local_positions()):
            labels.extend((i, int(u)) for u in idx)
    restored = [labels[j] for j in layouts[0].gather_order().tolist()]
    expected = [(i, u) for i, p in enumerate(layouts[0].padded) for u in range(p)]
    assert restored == expected


@pytest.mark.parametrize("degree", [2, 4])
def test_simulated_ranks_match_single_sequence_attention(tiny64, degree):
    """All ranks' local attention, stitched together, equals full causal attention."""
    tokens = random_tokens(29, seed=3)
    model = tiny64
    n = len(tokens)
    ids, pos = torch.tensor(tokens), torch.arange(n)
    h = model.embed(ids)
    q, k, v = model.qkv(0, h, pos)
    full_layout = ZigzagLayout((n,), degree, 0)
    pad = full_layout.padded[0] - n
    kp = torch.cat([k, torch.zeros(pad, *k.shape[1:], dtype=k.dtype)])
    vp = torch.cat([v, torch.zeros(pad, *v.shape[1:], dtype=v.dtype)])
    qp = torch.cat([q, torch.zeros(pad, *q.shape[1:], dtype=q.dtype)])
    out = torch.empty_like(qp)
    for r in range(degree):
        layout = ZigzagLayout((n,), degree, r)
        ((_, idx),) = layout.local_positions()
        out[idx] = local_attention(
            layout, qp[idx], kp, vp, [None], [None], model.cfg.head_dim**-0.5
        )
    from vertumnus.worker.zigzag import chunk_attention

    ref = chunk_attention(q, k, v, model.cfg.head_dim**-0.5)
    assert (out[:n] - ref).abs().max().item() < 1e-12


def test_reference_is_causal(tiny64):
    """Appending tokens never changes the hidden states of earlier ones."""
    a = random_tokens(20, seed=1)
    b = a + random_tokens(7, seed=2)
    assert (
        reference_hidden(tiny64, a) - reference_hidden(tiny64, b)[:20]
    ).abs().max().item() < 1e-12
