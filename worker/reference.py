"""The naive single-sequence forward pass: the oracle the engine is checked against.

No cache, no ranks, no padding: one causal attention over the whole
sequence. Used by the tests and by ``vertumnus engine verify``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .model import Model
from .zigzag import chunk_attention


def reference_hidden(model: Model, tokens: Sequence[int]) -> torch.Tensor:
    """Final-norm hidden states [L, hidden] of ``tokens``."""
    ids = torch.tensor(list(tokens), dtype=torch.long, device=model.device)
    positions = torch.arange(ids.numel(), device=model.device)
    h = model.embed(ids)
    scale = model.cfg.head_dim**-0.5
    for layer in range(model.cfg.num_hidden_layers):
        q, k, v = model.qkv(layer, h, positions)
        h = model.after_attention(layer, h, chunk_attention(q, k, v, scale))
    return model.final_norm(h)
