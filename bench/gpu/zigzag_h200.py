"""GPU check of the prefill-time model on one lent H200 (issue 5, item 8).

What it measures, for a Qwen3-30B-A3B-shaped layer (hidden 2048, 32 Q / 4 KV
heads of dim 128, 128 experts top-8 of width 768; random weights):

- per rank k of a degree-C worker, for L = 8K..128K uncached tokens: the
  causal attention of its two zigzag chunks (k and 2C-1-k) over the keys
  they see, and the token-local part (QKV, output projection, MoE) on its
  L/C tokens. With one GPU the ranks run **one after another**; a step's
  compute is the slowest rank's.
- communication is **modeled, not measured**: the per-layer K/V all-gather
  moves (C-1)/C of L·2·4·128·2 bytes into each rank, at an assumed NVLink
  bandwidth (``--nvlink-gbps``, default 450 GB/s per direction).

Per-layer times are scaled by 48 layers. It then fits α (seconds per
attention query-key pair, from the rank attention times against W/C) and c
(seconds per token of token-local work, from the token-local times against
L/C) by least squares through the origin, and compares them, and the
resulting speedups at 64K, with design.md section 2 (α = 1.50 ns/pair,
c = 13.65 µs/token, S4 ≈ 2.76, S8 ≈ 3.87).

Run on the device (about 3-5 minutes; stops adding lengths at --budget-s):

    python bench/gpu/zigzag_h200.py --out results/h200.json

Smoke test on CPU with tiny shapes (seconds):

    python bench/gpu/zigzag_h200.py --cpu-tiny --out /tmp/h200-smoke.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right


def _import_worker_from_checkout() -> None:
    """Device machines get the repository without an install (and without network
    for a build). Lay out ``vertumnus`` (src/vertumnus plus worker/ as
    ``vertumnus.worker``, as pyproject maps it) as symlinks in a temporary
    directory and put it on PYTHONPATH, so the engine's rank processes find
    it too."""
    import os
    import sys
    import tempfile

    try:
        import vertumnus.worker  # noqa: F401

        return
    except ImportError:
        pass
    root = Path(__file__).resolve().parents[2]
    farm = Path(tempfile.mkdtemp(prefix="vertumnus-checkout-"))
    package = farm / "vertumnus"
    package.mkdir()
    for entry in (root / "src" / "vertumnus").iterdir():
        (package / entry.name).symlink_to(entry)
    (package / "worker").symlink_to(root / "worker")
    sys.path.insert(0, str(farm))
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(farm), os.environ.get("PYTHONPATH")])
    )
    for name in [m for m in sys.modules if m == "vertumnus" or m.startswith("vertumnus.")]:
        del sys.modules[name]


_import_worker_from_checkout()

from vertumnus.worker.config import ModelConfig  # noqa: E402
from vertumnus.worker.model import Model  # noqa: E402
from vertumnus.worker.zigzag import ZigzagLayout  # noqa: E402

DESIGN = {"alpha_ns_per_pair": 1.50, "c_us_per_token": 13.65, "speedup_64k": {"4": 2.76, "8": 3.87}}
LAYERS = 48


def real_shape() -> ModelConfig:
    # vocab trimmed: embeddings are outside the timed parts and would only cost memory.
    return ModelConfig(
        model_type="qwen3_moe",
        vocab_size=1024,
        hidden_size=2048,
        num_hidden_layers=1,
        num_attention_heads=32,
        num_key_value_heads=4,
        head_dim=128,
        num_experts=128,
        num_experts_per_tok=8,
        moe_intermediate_size=768,
        intermediate_size=6144,
    )


def tiny_shape() -> ModelConfig:
    return ModelConfig(num_hidden_layers=1, num_experts=4, num_experts_per_tok=2, hidden_size=64)


class Timer:
    def __init__(self, device: str) -> None:
        self.cuda = device.startswith("cuda")

    def __call__(self, fn, repeats: int) -> float:
        fn()  # warm-up (kernel selection, allocator)
        if self.cuda:
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(repeats):
                fn()
            end.record()
            torch.cuda.synchronize()
            return start.elapsed_time(end) / 1e3 / repeats
        t0 = time.perf_counter()
        for _ in range(repeats):
            fn()
        return (time.perf_counter() - t0) / repeats


def rank_attention(cfg: ModelConfig, length: int, degree: int, rank: int, device, dtype):
    """A closure running rank ``rank``'s zigzag chunk attention for one layer."""
    layout = ZigzagLayout((length,), degree, rank)
    s = layout.chunk_sizes[0]
    group = cfg.num_attention_heads // cfg.num_key_value_heads
    q = torch.randn(cfg.num_attention_heads, 2 * s, cfg.head_dim, device=device, dtype=dtype)
    k = torch.randn(
        cfg.num_key_value_heads, layout.padded[0], cfg.head_dim, device=device, dtype=dtype
    )
    v = torch.randn_like(k)
    # GQA expanded once, outside the timed part, so the flash/efficient kernels apply.
    k, v = k.repeat_interleave(group, 0), v.repeat_interleave(group, 0)
    scale = cfg.head_dim**-0.5

    def run():
        for j, c in enumerate(layout.chunks_of(rank)):
            end = (c + 1) * s
            F.scaled_dot_product_attention(
                q[None, :, j * s : (j + 1) * s],
                k[None, :, :end],
                v[None, :, :end],
                attn_mask=causal_lower_right(s, end),
                scale=scale,
            )

    return run


def token_local(model: Model, tokens: int, device, dtype):
    cfg = model.cfg
    h = torch.randn(tokens, cfg.hidden_size, device=device, dtype=dtype)
    pos = torch.arange(tokens, device=device)
    attn = torch.randn(tokens, cfg.num_attention_heads, cfg.head_dim, device=device, dtype=dtype)

    def run():
        model.qkv(0, h, pos)
        model.after_attention(0, h, attn)

    return run


def fit_through_origin(xs: list[float], ys: list[float]) -> float:
    den = sum(x * x for x in xs)
    return sum(x * y for x, y in zip(xs, ys, strict=True)) / den if den else 0.0


def engine_check(device: str) -> dict:
    """The engine itself on the device: one rank (NCCL world of 1 on a GPU) in float64
    against the naive forward pass on the CPU, with and without a cached prefix.
    Exercises the device paths of the model, the cache and the step."""
    from vertumnus.worker.verify import run_verify

    try:
        return run_verify([1], tokens=257, prefix=64, dtype="float64", device=device)
    except Exception as exc:  # the timings above are already written; report, do not lose them
        return {"error": f"{type(exc).__name__}: {exc}"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="results JSON")
    ap.add_argument("--cpu-tiny", action="store_true", help="tiny shapes on CPU (smoke test)")
    ap.add_argument(
        "--lengths", default=None, help="comma-separated L (default 8K..128K, tiny: 256..1024)"
    )
    ap.add_argument("--degrees", default="1,2,4,8")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--nvlink-gbps", type=float, default=450.0, help="modeled all-gather bandwidth, GB/s"
    )
    ap.add_argument(
        "--budget-s", type=float, default=330.0, help="stop starting new lengths after this"
    )
    ap.add_argument(
        "--skip-engine-check",
        action="store_true",
        help="skip the one-rank engine run on the device",
    )
    args = ap.parse_args()

    started = time.perf_counter()
    if args.cpu_tiny:
        device, dtype, cfg = "cpu", torch.float32, tiny_shape()
        lengths = [256, 512, 1024]
        torch.set_num_threads(1)
    else:
        if not torch.cuda.is_available():
            raise SystemExit("no CUDA device; use --cpu-tiny for a smoke test")
        device, dtype, cfg = "cuda", torch.bfloat16, real_shape()
        lengths = [8192, 16384, 32768, 65536, 131072]
    if args.lengths:
        lengths = [int(x) for x in args.lengths.split(",")]
    degrees = [int(x) for x in args.degrees.split(",")]
    model = Model.random(cfg, seed=0, dtype=dtype, device=device)
    timer = Timer(device)
    kv_bytes_per_token = 2 * cfg.num_key_value_heads * cfg.head_dim * torch.finfo(dtype).bits // 8

    rows, failures = [], []
    for length in lengths:
        if time.perf_counter() - started > args.budget_s:
            break
        for degree in degrees:
            try:
                attn = [
                    timer(rank_attention(cfg, length, degree, r, device, dtype), args.repeats)
                    for r in range(degree)
                ]
                local = timer(token_local(model, -(-length // degree), device, dtype), args.repeats)
            except torch.OutOfMemoryError as exc:  # e.g. SDPA fell back to the math kernel
                failures.append(
                    {"length": length, "degree": degree, "error": str(exc).splitlines()[0]}
                )
                print(f"L={length} C={degree}: out of memory", flush=True)
                torch.cuda.empty_cache()
                continue
            comm = (degree - 1) / degree * length * kv_bytes_per_token / (args.nvlink_gbps * 1e9)
            rows.append(
                {
                    "length": length,
                    "degree": degree,
                    "attention_s_per_rank": attn,
                    "token_local_s": local,
                    "allgather_s_modeled": comm,
                    "step_s_48_layers": LAYERS * (max(attn) + local + comm),
                }
            )
            print(
                f"L={length} C={degree}: attn max {max(attn) * 1e3:.2f} ms, local {local * 1e3:.2f} ms, "
                f"comm {comm * 1e3:.3f} ms (per layer)",
                flush=True,
            )
        if device == "cuda":
            torch.cuda.empty_cache()

    # α from attention (rank max vs W/C), c from token-local (vs L/C); both x48 layers.
    alpha = fit_through_origin(
        [r["length"] * (r["length"] + 1) / 2 / r["degree"] for r in rows],
        [LAYERS * max(r["attention_s_per_rank"]) for r in rows],
    )
    c = fit_through_origin(
        [r["length"] / r["degree"] for r in rows], [LAYERS * r["token_local_s"] for r in rows]
    )
    speedups = {}
    for length in {r["length"] for r in rows}:
        base = next(
            (r["step_s_48_layers"] for r in rows if r["length"] == length and r["degree"] == 1),
            None,
        )
        if base:
            speedups[str(length)] = {
                str(r["degree"]): base / r["step_s_48_layers"]
                for r in rows
                if r["length"] == length
            }
    balance = max(
        (max(r["attention_s_per_rank"]) / min(r["attention_s_per_rank"]) for r in rows),
        default=None,
    )
    result = {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "dtype": str(dtype),
        "torch": torch.__version__,
        "shape": cfg.__dict__ | {"mlp_only_layers": []},
        "layers_scaled": LAYERS,
        "nvlink_gbps_modeled": args.nvlink_gbps,
        "note": "ranks timed one after another on one device; all-gather modeled from NVLink bandwidth",
        "rows": rows,
        "failures": failures,
        "fit": {"alpha_ns_per_pair": alpha * 1e9, "c_us_per_token": c * 1e6},
        "design": DESIGN,
        "speedup_by_length": speedups,
        "worst_rank_attention_imbalance": balance,
        "wall_s": time.perf_counter() - started,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    if not args.skip_engine_check:
        result["engine_check"] = engine_check(device)
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
        print(
            "engine check:",
            json.dumps(result["engine_check"].get("degrees", result["engine_check"])),
            flush=True,
        )
    print(json.dumps(result["fit"]), "vs design", json.dumps(DESIGN), flush=True)


if __name__ == "__main__":
    main()
