"""``vertumnus engine verify``: zigzag CP against one rank, with real process groups.

One pool of ranks (as many as the largest degree) is regrouped epoch by epoch
into workers of each degree; worker 0 runs the same batch at every degree:

- **no prefix**: the batch with the cache off; its final hidden states are
  compared with degree 1's (``max_abs_diff``) and with the naive
  single-sequence forward pass (``reference_max_abs_diff``);
- **with prefix**: a shared prefix is prefilled first (its blocks stored
  partitioned over the worker's ranks), then the batch of prefix + suffix
  requests reuses it; the uncached part is compared with degree 1 computing
  the whole sequence without cache (``prefix_max_abs_diff``).

The batch mixes lengths that are not multiples of 2C, including a one-token
request.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from .blocks import block_keys

if TYPE_CHECKING:
    from .dispatch import PrefillOutcome

DEFAULT_TOLERANCE = {"float64": 1e-9, "float32": 1e-4, "bfloat16": 5e-2, "float16": 1e-2}


def verify_requests(
    tokens: int, prefix: int, vocab: int, seed: int
) -> tuple[list[int], list[list[int]]]:
    """The shared prefix and the per-request suffixes: odd lengths, a batch, a 1-token request."""
    gen = torch.Generator().manual_seed(seed)
    lengths = [tokens, max(1, tokens // 3) | 1, 3, 1]
    shared = torch.randint(0, vocab, (prefix,), generator=gen).tolist()
    suffixes = [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in lengths]
    return shared, suffixes


def run_verify(
    degrees: Sequence[int],
    *,
    tokens: int = 67,
    prefix: int = 48,
    dtype: str = "float64",
    block_size: int = 8,
    seed: int = 0,
    model_path: str | None = None,
    tolerance: float | None = None,
    device: str = "cpu",
) -> dict:
    from .engine import Engine
    from .model import Model
    from .rank import RankSpec
    from .reference import reference_hidden

    degrees = sorted(set(degrees) | {1})
    world = max(degrees)
    tol = DEFAULT_TOLERANCE.get(dtype, 1e-3) if tolerance is None else tolerance
    total = prefix + tokens + 8
    spec = RankSpec(
        model_path=model_path,
        seed=seed,
        dtype=dtype,
        block_size=block_size,
        num_blocks=max(64, 4 * (total // block_size + 2) * 4),
        device=device,
        backend="nccl" if device == "cuda" else "gloo",
    )
    if model_path:
        model = Model.load(model_path, dtype=getattr(torch, dtype))
    else:
        from .config import ModelConfig

        model = Model.random(ModelConfig.tiny(), seed=seed, dtype=getattr(torch, dtype))
    shared, suffixes = verify_requests(tokens, prefix, model.cfg.vocab_size, seed)
    plain = list(suffixes)
    with_prefix = [shared + s for s in suffixes]

    report: dict = {
        "device": device,
        "dtype": dtype,
        "tokens": tokens,
        "prefix": prefix,
        "block_size": block_size,
        "batch_lengths": [len(s) for s in plain],
        "tolerance": tol,
        "degrees": {},
    }
    # degree 1 runs first (degrees are sorted) and is every other degree's baseline
    baseline_plain: list[torch.Tensor] = []
    baseline_prefixed: list[torch.Tensor] = []
    with Engine(world, [1] * world, spec, max_tokens=total) as engine:
        for epoch, degree in enumerate(degrees, start=2):
            if degree != 1:
                for w in list(engine.workers):
                    engine.drain(w)
                engine.switch_epoch(epoch, [degree] * (world // degree))
            all_keys = [k for seq in with_prefix for k in block_keys(seq, block_size)]
            engine.evict_blocks(0, all_keys)  # every degree starts from a cold cache
            futures = [
                engine.submit(0, f"p{i}", s, use_cache=False, return_hidden=True)
                for i, s in enumerate(plain)
            ]
            hidden_plain = [_hidden(f.result()) for f in futures]
            futures = [
                engine.submit(0, f"f{i}", s, use_cache=False, return_hidden=True)
                for i, s in enumerate(with_prefix)
            ]
            hidden_full = [_hidden(f.result()) for f in futures]
            if shared:
                engine.prefill(0, "prefix", shared)  # store the prefix, partitioned over the ranks
            futures = [
                engine.submit(0, f"c{i}", s, return_hidden=True) for i, s in enumerate(with_prefix)
            ]
            cached = [f.result() for f in futures]
            if degree == 1:
                baseline_plain, baseline_prefixed = hidden_plain, hidden_full
            ref = max(
                (h - reference_hidden(model, s)).abs().max().item()
                for h, s in zip(hidden_plain, plain, strict=True)
            )
            plain_diff = max(
                (a - b).abs().max().item()
                for a, b in zip(hidden_plain, baseline_plain, strict=True)
            )
            prefix_diff = max(
                (_hidden(o) - b[o.cached_tokens :]).abs().max().item()
                for o, b in zip(cached, baseline_prefixed, strict=True)
            )
            cached_tokens = [o.cached_tokens for o in cached]
            report["degrees"][str(degree)] = {
                "max_abs_diff": plain_diff,
                "prefix_max_abs_diff": prefix_diff,
                "reference_max_abs_diff": ref,
                "cached_tokens": cached_tokens,
                "passed": bool(
                    max(plain_diff, prefix_diff, ref) <= tol
                    and (prefix < block_size or all(c > 0 for c in cached_tokens))
                ),
            }
    report["passed"] = all(e["passed"] for e in report["degrees"].values())
    return report


def _hidden(outcome: PrefillOutcome) -> torch.Tensor:
    if outcome.hidden is None:
        raise RuntimeError(f"request {outcome.request_id}: no hidden states returned")
    return outcome.hidden
