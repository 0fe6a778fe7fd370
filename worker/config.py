"""Model configuration of the worker's transformer, in Hugging Face field names.

The engine runs decoder-only models of the Llama / Qwen3 / Qwen3-MoE family:
grouped-query attention (GQA) with rotary position embeddings (RoPE), RMSNorm,
and per layer either a dense SwiGLU FFN or a top-k mixture of experts (MoE).
Field names follow the models' ``config.json`` so that a downloaded
checkpoint's config loads unchanged; :func:`ModelConfig.tiny` is the seeded
model the tests, the local pool and the CPU profile use.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

# Families whose layer layout the engine implements; anything else is refused
# at load time rather than silently computed wrong.
SUPPORTED_MODEL_TYPES = ("llama", "qwen3", "qwen3_moe")


@dataclass(frozen=True)
class ModelConfig:
    model_type: str = "qwen3_moe"
    vocab_size: int = 256
    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 16
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 32768
    tie_word_embeddings: bool = False
    # MoE (Qwen3-MoE naming); num_experts == 0 means every layer is dense.
    num_experts: int = 0
    num_experts_per_tok: int = 2
    moe_intermediate_size: int = 32
    norm_topk_prob: bool = True
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if self.model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"model_type {self.model_type!r} is not supported; expected one of {SUPPORTED_MODEL_TYPES}"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} must be a multiple of "
                f"num_key_value_heads={self.num_key_value_heads} (GQA)"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")

    @property
    def qk_norm(self) -> bool:
        """Qwen3 normalizes each query and key head before RoPE; Llama does not."""
        return self.model_type.startswith("qwen3")

    def is_moe_layer(self, layer: int) -> bool:
        """Qwen3-MoE's rule for which layers carry experts."""
        return (
            self.num_experts > 0
            and layer not in self.mlp_only_layers
            and (layer + 1) % self.decoder_sparse_step == 0
        )

    @property
    def kv_bytes_per_token_per_element(self) -> int:
        """K and V elements per token over all layers (multiply by the dtype size)."""
        return 2 * self.num_hidden_layers * self.num_key_value_heads * self.head_dim

    @classmethod
    def tiny(cls) -> ModelConfig:
        """The test model: 2 layers (one dense, one MoE with 4 experts, top-2), hidden 64,
        4 query heads sharing 2 KV heads of dim 16, vocabulary 256."""
        return cls(num_experts=4, num_experts_per_tok=2, mlp_only_layers=(0,))

    @classmethod
    def from_json(cls, path: str | Path) -> ModelConfig:
        """Read a Hugging Face ``config.json``; unknown keys are ignored."""
        raw = json.loads(Path(path).read_text())
        if raw.get("rope_scaling"):
            raise ValueError(
                f"{path}: rope_scaling={raw['rope_scaling']!r} is not supported (plain RoPE only)"
            )
        for flag in ("attention_bias", "mlp_bias", "use_sliding_window"):
            if raw.get(flag):
                raise ValueError(f"{path}: {flag}=true is not supported by this engine")
        known = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in raw.items() if k in known and v is not None}
        if "head_dim" not in raw:
            kwargs["head_dim"] = raw["hidden_size"] // raw["num_attention_heads"]
        if "mlp_only_layers" in kwargs:
            kwargs["mlp_only_layers"] = tuple(kwargs["mlp_only_layers"])
        return cls(**kwargs)

    def to_json(self, path: str | Path) -> None:
        data = asdict(self)
        data["mlp_only_layers"] = list(self.mlp_only_layers)
        Path(path).write_text(json.dumps(data, indent=2) + "\n")
