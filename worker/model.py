"""The transformer's token-local parts, as functions over a Hugging Face state dict.

Context parallelism splits a layer at attention: everything before it (norm,
Q/K/V projections, RoPE) and after it (output projection, FFN or MoE) touches
one token at a time, so each rank runs it on its own tokens only. This module
holds exactly those token-local pieces; the attention that crosses tokens and
ranks lives in :mod:`vertumnus.worker.zigzag`.

Weights are kept as a plain ``{hf_name: tensor}`` dict, so loading a
checkpoint's safetensors is a rename-free copy and saving one for tests is
``safetensors.torch.save_file``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from .config import ModelConfig


def _shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every weight's HF name and shape: the single source of the layout."""
    h, d = cfg.hidden_size, cfg.head_dim
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (cfg.vocab_size, h),
        "model.norm.weight": (h,),
    }
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, h)
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (h,)
        shapes[p + "post_attention_layernorm.weight"] = (h,)
        shapes[p + "self_attn.q_proj.weight"] = (cfg.num_attention_heads * d, h)
        shapes[p + "self_attn.k_proj.weight"] = (cfg.num_key_value_heads * d, h)
        shapes[p + "self_attn.v_proj.weight"] = (cfg.num_key_value_heads * d, h)
        shapes[p + "self_attn.o_proj.weight"] = (h, cfg.num_attention_heads * d)
        if cfg.qk_norm:
            shapes[p + "self_attn.q_norm.weight"] = (d,)
            shapes[p + "self_attn.k_norm.weight"] = (d,)
        if cfg.is_moe_layer(i):
            m = cfg.moe_intermediate_size
            shapes[p + "mlp.gate.weight"] = (cfg.num_experts, h)
            for e in range(cfg.num_experts):
                q = f"{p}mlp.experts.{e}."
                shapes[q + "gate_proj.weight"] = (m, h)
                shapes[q + "up_proj.weight"] = (m, h)
                shapes[q + "down_proj.weight"] = (h, m)
        else:
            m = cfg.intermediate_size
            shapes[p + "mlp.gate_proj.weight"] = (m, h)
            shapes[p + "mlp.up_proj.weight"] = (m, h)
            shapes[p + "mlp.down_proj.weight"] = (h, m)
    return shapes


@dataclass
class Model:
    """A loaded model: its config, its weights, and the RoPE table."""

    cfg: ModelConfig
    weights: dict[str, torch.Tensor]

    @property
    def dtype(self) -> torch.dtype:
        return self.weights["model.embed_tokens.weight"].dtype

    @property
    def device(self) -> torch.device:
        return self.weights["model.embed_tokens.weight"].device

    # -- construction -------------------------------------------------------

    @classmethod
    def random(
        cls,
        cfg: ModelConfig,
        seed: int = 0,
        dtype: torch.dtype = torch.float32,
        device: str = "cpu",
    ) -> Model:
        """Seeded random weights: the same seed gives the same model on every rank."""
        gen = torch.Generator().manual_seed(seed)
        weights = {}
        for name, shape in _shapes(cfg).items():
            if name.endswith("norm.weight") or "layernorm" in name:
                # Norm gains near 1 keep activations in a sane range across layers.
                w = 1.0 + 0.1 * torch.randn(shape, generator=gen, dtype=torch.float64)
            else:
                w = torch.randn(shape, generator=gen, dtype=torch.float64) / shape[-1] ** 0.5
            weights[name] = w.to(dtype=dtype, device=device)
        return cls(cfg, weights)

    @classmethod
    def load(
        cls, path: str | Path, dtype: torch.dtype = torch.float32, device: str = "cpu"
    ) -> Model:
        """Load ``config.json`` and ``*.safetensors`` from a local directory (no downloads)."""
        from safetensors.torch import load_file

        root = Path(path)
        if not (root / "config.json").is_file():
            raise FileNotFoundError(
                f"{root}: no config.json (expected a Hugging Face model directory)"
            )
        cfg = ModelConfig.from_json(root / "config.json")
        files = sorted(root.glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"{root}: no *.safetensors files")
        expected = _shapes(cfg)
        weights: dict[str, torch.Tensor] = {}
        for f in files:
            for name, t in load_file(str(f)).items():
                if name in expected:
                    weights[name] = t.to(dtype=dtype, device=device)
        if cfg.tie_word_embeddings:
            weights.pop("lm_head.weight", None)
        missing = sorted(set(expected) - set(weights))
        if missing:
            raise ValueError(f"{root}: checkpoint lacks {len(missing)} weights, e.g. {missing[:3]}")
        for name, shape in expected.items():
            if tuple(weights[name].shape) != shape:
                raise ValueError(
                    f"{root}: {name} has shape {tuple(weights[name].shape)}, config implies {shape}"
                )
        return cls(cfg, weights)

    def save(self, path: str | Path) -> None:
        """Write an HF-style directory (config.json + model.safetensors)."""
        from safetensors.torch import save_file

        root = Path(path)
        root.mkdir(parents=True, exist_ok=True)
        self.cfg.to_json(root / "config.json")
        save_file(
            {k: v.contiguous() for k, v in self.weights.items()}, str(root / "model.safetensors")
        )

    # -- token-local compute --------------------------------------------------

    def _w(self, name: str) -> torch.Tensor:
        return self.weights[name]

    def _rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        # Half precisions normalize in float32 as HF does; float64 stays float64 for exactness.
        work = x if x.dtype == torch.float64 else x.float()
        work = work * torch.rsqrt(work.pow(2).mean(-1, keepdim=True) + self.cfg.rms_norm_eps)
        return weight * work.to(x.dtype)

    def _rope(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Rotate ``x`` [T, heads, d] by absolute ``positions`` (HF rotate-half convention)."""
        d = self.cfg.head_dim
        cdt = torch.float64 if x.dtype == torch.float64 else torch.float32
        inv_freq = 1.0 / (
            self.cfg.rope_theta ** (torch.arange(0, d, 2, dtype=cdt, device=x.device) / d)
        )
        freqs = positions.to(cdt)[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().to(x.dtype)[:, None, :], emb.sin().to(x.dtype)[:, None, :]
        x1, x2 = x[..., : d // 2], x[..., d // 2 :]
        rotated = torch.cat((-x2, x1), dim=-1)
        return x * cos + rotated * sin

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        return F.embedding(tokens, self._w("model.embed_tokens.weight"))

    def qkv(
        self, layer: int, h: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries [T, Hq, d], keys and values [T, Hkv, d] of this rank's tokens, RoPE applied."""
        cfg, p = self.cfg, f"model.layers.{layer}."
        x = self._rms_norm(h, self._w(p + "input_layernorm.weight"))
        t = x.shape[0]
        q = F.linear(x, self._w(p + "self_attn.q_proj.weight")).view(
            t, cfg.num_attention_heads, cfg.head_dim
        )
        k = F.linear(x, self._w(p + "self_attn.k_proj.weight")).view(
            t, cfg.num_key_value_heads, cfg.head_dim
        )
        v = F.linear(x, self._w(p + "self_attn.v_proj.weight")).view(
            t, cfg.num_key_value_heads, cfg.head_dim
        )
        if cfg.qk_norm:
            q = self._rms_norm(q, self._w(p + "self_attn.q_norm.weight"))
            k = self._rms_norm(k, self._w(p + "self_attn.k_norm.weight"))
        return self._rope(q, positions), self._rope(k, positions), v

    def after_attention(self, layer: int, h: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """Output projection, residual, then the FFN or MoE with its residual."""
        p = f"model.layers.{layer}."
        h = h + F.linear(attn.reshape(attn.shape[0], -1), self._w(p + "self_attn.o_proj.weight"))
        x = self._rms_norm(h, self._w(p + "post_attention_layernorm.weight"))
        if self.cfg.is_moe_layer(layer):
            return h + self._moe(layer, x)
        return h + self._swiglu(p + "mlp.", x)

    def _swiglu(self, prefix: str, x: torch.Tensor) -> torch.Tensor:
        gate = F.linear(x, self._w(prefix + "gate_proj.weight"))
        up = F.linear(x, self._w(prefix + "up_proj.weight"))
        return F.linear(F.silu(gate) * up, self._w(prefix + "down_proj.weight"))

    def _moe(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        """Qwen3-MoE routing: softmax over experts, top-k, optionally renormalized."""
        cfg, p = self.cfg, f"model.layers.{layer}.mlp."
        logits = F.linear(x, self._w(p + "gate.weight"))
        probs = logits.softmax(
            dim=-1, dtype=torch.float64 if x.dtype == torch.float64 else torch.float32
        )
        top_w, top_e = probs.topk(cfg.num_experts_per_tok, dim=-1)
        if cfg.norm_topk_prob:
            top_w = top_w / top_w.sum(dim=-1, keepdim=True)
        top_w = top_w.to(x.dtype)
        out = torch.zeros_like(x)
        for e in range(cfg.num_experts):
            rows, slot = (top_e == e).nonzero(as_tuple=True)
            if rows.numel() == 0:
                continue
            y = self._swiglu(f"{p}experts.{e}.", x[rows])
            out.index_add_(0, rows, y * top_w[rows, slot, None])
        return out

    def final_norm(self, h: torch.Tensor) -> torch.Tensor:
        return self._rms_norm(h, self._w("model.norm.weight"))

    def logits(self, normed: torch.Tensor) -> torch.Tensor:
        head = self.weights.get("lm_head.weight", self.weights["model.embed_tokens.weight"])
        return F.linear(normed, head)
