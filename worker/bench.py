"""``vertumnus engine bench``: epoch-switch time and block-copy throughput on real ranks.

Regrouping: a pool of 4 ranks holds cached prefixes and goes CP4 -> 2xCP2 ->
CP4 several times; the switch time is the engine's own measure (all ranks
activating their pre-created groups, confirmed by a barrier), without the
drain. Requests served after each switch are checked to give the same first
tokens and, after the merge, to reuse the whole retained prefix.

Copies: a prompt's blocks are copied CP2 -> CP1 (inter-degree, re-partitioned)
and CP1 -> CP1 (intra-degree); throughput is copied bytes over the copy's
wall time (the plan query excluded), and every copy is compared byte for byte.
"""

from __future__ import annotations

import statistics
import time

import torch


def run_bench(
    *,
    rounds: int = 5,
    copy_tokens: int = 8192,
    block_size: int = 16,
    dtype: str = "float32",
    seed: int = 0,
) -> dict:
    from .blocks import block_keys
    from .engine import Engine
    from .rank import RankSpec

    gen = torch.Generator().manual_seed(seed)
    spec = RankSpec(
        seed=seed,
        dtype=dtype,
        block_size=block_size,
        num_blocks=4 * (max(copy_tokens, 512) // block_size) + 64,
    )
    report: dict = {"dtype": dtype, "block_size": block_size, "ranks": 4}
    with Engine(4, [4], spec, max_tokens=max(copy_tokens, 512) + 1) as engine:
        vocab = engine.vocab_size

        def regroup(degrees: list[int]) -> tuple[float, float]:
            t0 = time.perf_counter()
            for w in list(engine.workers):
                engine.drain(w)
            drained = time.perf_counter() - t0
            return drained, engine.switch_epoch(engine.epoch + 1, degrees).seconds

        prompts = [torch.randint(0, vocab, (512,), generator=gen).tolist() for _ in range(4)]
        before = [engine.prefill(0, f"p{i}", p).first_token for i, p in enumerate(prompts)]
        split, merge, same, reused = [], [], True, True
        for _ in range(rounds):
            split.append(regroup([2, 2])[1])
            same &= [engine.prefill(0, "s", p).first_token for p in prompts] == before
            merge.append(regroup([4])[1])
            outs = [engine.prefill(0, "m", p) for p in prompts]
            same &= [o.first_token for o in outs] == before
            reused &= all(o.cached_tokens == len(p) - 1 for o, p in zip(outs, prompts, strict=True))
        report["switch"] = {
            "split_cp4_to_2xcp2_ms": _summary(split),
            "merge_2xcp2_to_cp4_ms": _summary(merge),
            "same_first_tokens": same,
            "prefixes_reused_after_merge": reused,
        }

        regroup([2, 1, 1])
        prompt = torch.randint(0, vocab, (copy_tokens,), generator=gen).tolist()
        keys = block_keys(prompt, block_size)
        engine.prefill(0, "copy-src", prompt)
        original = engine.read_blocks(0, keys)
        copies = {}
        for name, src, dst in (("inter_cp2_to_cp1", 0, 2), ("intra_cp1_to_cp1", 2, 3)):
            rep = engine.copy_blocks(src, dst, keys)
            held = engine.read_blocks(dst, keys)
            copies[name] = {
                "blocks": rep.copied_blocks,
                "bytes": rep.bytes,
                "seconds": rep.seconds,
                "MiB_per_s": rep.bytes / rep.seconds / 2**20,
                "byte_exact": all(torch.equal(held[k], original[k]) for k in keys),
            }
        engine.evict_blocks(0, keys)
        rep = engine.copy_blocks(3, 0, keys)
        back = engine.read_blocks(0, keys)
        copies["inter_cp1_to_cp2_round_trip"] = {
            "blocks": rep.copied_blocks,
            "bytes": rep.bytes,
            "seconds": rep.seconds,
            "MiB_per_s": rep.bytes / rep.seconds / 2**20,
            "byte_exact": all(torch.equal(back[k], original[k]) for k in keys),
        }
        report["copy"] = {"block_bytes": engine.block_bytes, **copies}
    return report


def _summary(seconds: list[float]) -> dict:
    ms = sorted(s * 1e3 for s in seconds)
    return {"median": statistics.median(ms), "max": ms[-1], "min": ms[0], "n": len(ms)}
